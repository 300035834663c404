"""All of a configuration's seeds in one search trial, so a scheduler stops configurations on the seed mean.

With ``search.scheduler`` (ASHA) and ``search.seeds`` > 1 a trial is a configuration, not a (configuration,
seed): it trains its seeds in turns of one evaluation each, in its own process, and after every round
reports to Tune the mean over its seeds of every number an evaluation reports (``best_dev_spearman``,
``dev_spearman``, ``dev/<set>``, ``loss``) with their sample std (``<name>_std``). ASHA compares those
means at its rungs, and Optuna is told the mean at the end. Tune's ``Repeater`` (the search without a
scheduler) cannot do this: its repeats are separate trials, and a scheduler would stop some of them.

Each seed is the run it would be alone: its own loop (model, optimizer, data order, checkpoints in
``<trial>/seed<seed>/``, MLflow run, run record) in a thread of its own. One thread runs at a time
(:class:`Baton`): a seed trains until its next evaluation and hands over, and its random state (python,
numpy, torch) is set aside until its next turn, so its dev curve is the one it has trained alone
(tests/tune/test_seeds.py compares them). The seeds' models are all in memory at once (k models and
optimizers; the process trains one at a time).

A seed that fails fails the configuration (the others are ended): a search with seeds apart leaves a
failed seed out of the mean, which would rate a configuration by the seeds that survived it. When the
scheduler stops the trial, every seed is ended and the driver records each one from the per-seed points
the trial reported (``seed_points``; :mod:`raysent.tune.stopped`). With ``--resume`` a seed whose record
exists is not trained again, and the others go on from their checkpoints. Imports no Ray at module level.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from functools import partial

import numpy as np

from raysent.config import ExperimentConfig, parse_config
from raysent.tracking import LiveRun
from raysent.train.loop import TrainHooks, rng_state, set_rng_state
from raysent.train.records import RunIdentity, RunRecord, TrainSummary, read_record
from raysent.train.resources import claim_devices
from raysent.train.run import train_in_process
from raysent.tune.protocol import TrialContext, TrialResult, from_record, numbers, reported, seed_point
from raysent.tune.reporter import Reporter, TuneReporter
from raysent.tune.trial import (
    build_record,
    drop_checkpoints,
    open_live_run,
    prepare_process,
    record_path,
    resolve_trial,
    save_record,
    search_seeds,
    training_fields,
    trial_identity,
    wait_at_gate,
)

# No Ray: the trial reports to its Reporter (raysent.tune.reporter: Tune in a search, a list in a test).

JOIN_SECONDS = 120  # how long an ended trial waits for its seeds' threads to leave their loops


class Abandoned(BaseException):
    """The trial ended before this seed did (the scheduler stopped it, or another seed failed)."""


class Baton:
    """One seed trains at a time: the trial gives a seed its turn and waits until the seed hands it back."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._turn: int | None = None  # the seed whose turn it is; None: the trial's
        self.abandoned = False

    def wait_turn(self, seed: int) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._turn == seed or self.abandoned)
            if self.abandoned:
                raise Abandoned

    def hand_back(self, seed: int) -> None:
        with self._cond:
            if self._turn == seed:
                self._turn = None
                self._cond.notify_all()

    def give(self, seed: int) -> None:
        with self._cond:
            self._turn = seed
            self._cond.notify_all()
            self._cond.wait_for(lambda: self._turn is None)

    def abandon(self) -> None:
        with self._cond:
            self.abandoned = True
            self._cond.notify_all()


@dataclass
class SeedRun:
    """One seed of the trial: what it is, what it has reported, how it ended."""

    seed: int
    hp: dict
    cfg: ExperimentConfig
    identity: RunIdentity
    latest: dict | None = None  # its newest evaluation's metrics
    fresh: bool = False  # it reported an evaluation in the turn that just ended
    summary: TrainSummary | None = None
    record: RunRecord | None = None  # written (now, or before the search was interrupted)
    error: BaseException | None = None
    done: bool = False
    live: LiveRun | None = None
    busy: float = 0.0  # seconds of its turns: its wall time, without the other seeds'


class SeedHooks(TrainHooks):
    """One seed's loop: checkpoints in its folder, metrics to its MLflow run, then the next seed's turn."""

    def __init__(self, output_dir, resume: bool = False, quiet: bool = False, *, run: SeedRun, baton: Baton):
        super().__init__(output_dir, resume=resume, quiet=quiet)
        self.device = claim_devices()  # the GPU Ray gave this trial, else the CPU (whatever torch saw before)
        self.run, self.baton = run, baton

    def report(self, metrics: dict, checkpoint_dir) -> None:
        super().report(metrics, checkpoint_dir)
        run = self.run
        result = TrialResult.from_loop(metrics)
        if run.live is not None and (step := result.logged_step) is not None:
            run.live.log(result.metrics, step)
        run.latest = dict(metrics)
        if result.finished:
            return  # the end of a stage or the run; the thread hands back when it ends
        run.fresh = True
        rng = rng_state()  # the other seeds draw from the same generators in their turns
        away = time.perf_counter()
        self.baton.hand_back(run.seed)
        self.baton.wait_turn(run.seed)
        self.paused += time.perf_counter() - away  # the loop's training time leaves the other seeds' turns out
        set_rng_state(rng)


def _train(run: SeedRun, baton: Baton, ctx: TrialContext) -> None:
    """A seed's thread: wait for its first turn, train every stage (resumed where a checkpoint exists)."""
    try:
        baton.wait_turn(run.seed)
        run.live = open_live_run(ctx, run.cfg, run.identity)
        run.summary = train_in_process(run.cfg, resume=True, quiet=True, hooks=partial(SeedHooks, run=run, baton=baton))
    except Abandoned:
        if run.live is not None:
            run.live.fail("interrupted", "KILLED")
    except BaseException as exc:
        run.error = exc
        if run.live is not None:
            run.live.fail(f"{type(exc).__name__}: {exc}", "FAILED")
    finally:
        run.done = True
        baton.hand_back(run.seed)


def seed_mean(points: list[dict]) -> dict[str, float]:
    """The mean over the seeds of every number their latest evaluations share, with its sample std
    (``<name>_std``; 0 for one seed); NaN scores (a seed whose dev score is undefined) are left out."""
    out: dict[str, float] = {}
    nums = [numbers(p) for p in points]
    shared = set.intersection(*(set(n) for n in nums)) if nums else set()
    for key in sorted(shared):
        vals = np.array([n[key] for n in nums])
        vals = vals[~np.isnan(vals)]
        out[key] = float(vals.mean()) if len(vals) else math.nan
        out[f"{key}_std"] = float(vals.std(ddof=1)) if len(vals) > 1 else 0.0
    return out


def round_result(runs: list[SeedRun]) -> TrialResult:
    """The result a round reports to Tune: the seed mean and std, the seeds' step, each seed's point."""
    points = [r.latest for r in runs if r.latest]
    steps = [TrialResult.from_loop(p).step for p in points]
    return TrialResult(metrics=seed_mean(points), step=min(s or 0 for s in steps), seeds=len(points),
                       seed_points={str(r.seed): seed_point(r.latest) for r in runs if r.latest})


def _existing(run: SeedRun, ctx: TrialContext) -> RunRecord | None:
    path = record_path(ctx, run.identity)
    return read_record(path) if path.is_file() else None


def run_seeds(config: dict, ctx: TrialContext, reporter: Reporter | None = None) -> None:
    """The Tune trial of a configuration whose seeds train in turns: report their mean after every round, then
    their records (in the last result, as :func:`raysent.tune.trial.run_trial` sends one); ``reporter``: Tune, or a
    test's :class:`~raysent.tune.reporter.MemoryReporter`."""
    reporter = reporter or TuneReporter()
    prepare_process(ctx)
    wait_at_gate(ctx.gate)
    records = run_seed_group(config, ctx, reporter)
    reporter.report(TrialResult.done(records, seed_mean([reported(r, ctx.metric) for r in records]),
                                     seeds=len(records)))


def run_seed_group(config: dict, ctx: TrialContext, reporter: Reporter) -> list[RunRecord]:
    """Train every seed of the trial's configuration in turns, reporting the seed mean after each round; returns
    the seeds' run records (written, each with its MLflow run ended)."""
    trial_id = reporter.trial_id

    base = parse_config(ctx.config, source=ctx.source)
    runs = []
    for seed in search_seeds(base):
        hp, _, _, cfg = resolve_trial(config, ctx, trial_id, seed=seed)
        run = SeedRun(seed, hp, cfg, trial_identity(ctx, hp, seed, trial_id))
        run.record = _existing(run, ctx)  # --resume: finished before the search was interrupted
        if run.record is not None:
            run.done, run.latest = True, from_record(run.record)
        runs.append(run)
    baton = Baton()
    threads = [threading.Thread(target=_train, args=(r, baton, ctx), name=f"seed-{r.seed}", daemon=True)
               for r in runs if not r.done]
    for t in threads:
        t.start()
    ended = False
    try:
        while not all(r.done for r in runs):
            for r in runs:
                if r.done:
                    continue
                r.fresh = False
                t0 = time.perf_counter()
                baton.give(r.seed)
                r.busy += time.perf_counter() - t0
                if r.error is not None:
                    raise r.error
            if any(r.fresh for r in runs):
                reporter.report(round_result(runs))
        ended = True
    finally:
        if not ended:  # stopped by the scheduler (Tune ends this thread in its report), a failed seed, Ctrl-C
            baton.abandon()
            for t in threads:
                t.join(JOIN_SECONDS)
    records: list[RunRecord] = []
    for r in runs:
        if r.record is None:
            if r.summary is None:  # every seed ended (the loop above), so each trained to its end
                raise RuntimeError(f"seed {r.seed} of trial {trial_id} ended without its training summary")
            record = build_record(ctx, r.cfg, r.hp, r.seed, trial_id, **training_fields(r.summary),
                                  wall_seconds=r.busy, finished_at=time.time())
            r.record = save_record(record_path(ctx, record), record, r.cfg, ctx, live=r.live)
            drop_checkpoints(r.cfg)
        records.append(r.record)
    return records
