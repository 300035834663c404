"""The record of a trial the scheduler stops (ASHA): written on the driver, from what the trial reported.

A trial ASHA stops never returns from :func:`raysent.tune.trial.run_trial`: Tune ends its training
thread at its next report (``sys.exit`` inside ``tune.report``), or ends its process. Without this its
dev curve would be only in Tune's state, with no run file and no MLflow run. :class:`StoppedTrials`
keeps each trial's reported evaluations and, when Tune completes a trial that reported evaluations but
not its run record (the last result of every trial that ran to its end carries it), writes
``results/<experiment>/stopped/<phase>-<search>-<config>-seed<seed>-<trial>.json`` — the run record's
fields, the curve up to the stop, ``stopped`` (by whom, at which step), the best model (a Ray Train
trial's taken out of its newest checkpoint into the trial's ``best/``) — and its MLflow run, ended
``KILLED`` (the trial's live run where its folder is on this machine, else a new one under the search's
parent run). Its checkpoints are then deleted as a finished trial's are (``search.keep_checkpoints``).
``runs/`` stays one file per finished run (the tables average those); the search summary lists the
stopped trials.
"""

from __future__ import annotations

import time
from pathlib import Path

from ray.tune import Callback

from raysent.tracking import LiveRun
from raysent.train.ray_train import take_best_model_of_run
from raysent.train.records import CurvePoint, StoppedBy
from raysent.tune.protocol import TrialContext, TrialResult
from raysent.tune.trial import (
    LIVE_RUN_FILE,
    build_record,
    drop_checkpoints,
    record_path,
    resolve_trial,
    save_record,
)


SEED_KEY = "/seed"


class StoppedTrials(Callback):
    """Records trials that end without their run record (stopped by the scheduler); see the module."""

    def __init__(self, ctx: TrialContext):
        self.ctx = ctx
        self.curves: dict[str, list[CurvePoint]] = {}  # by trial id, or "<trial id>/seed<seed>"
        self.latest: dict[str, dict] = {}  # a seed's newest point (its best so far), by "<trial id>/seed<seed>"

    def on_trial_result(self, iteration, trials, trial, result, **info):
        reported = TrialResult.from_tune(result, read_records=False)
        if reported.seed_points is not None:  # a trial of all its configuration's seeds: each seed's curve
            for seed, point in reported.seed_points.items():
                self._add(f"{trial.trial_id}{SEED_KEY}{seed}", TrialResult.from_tune(point))
                self.latest[f"{trial.trial_id}{SEED_KEY}{seed}"] = point
        else:
            self._add(trial.trial_id, reported)

    def _add(self, key: str, result: TrialResult) -> None:
        found = result.curve_point()
        if found is None:
            return
        point = CurvePoint.model_validate(found)
        curve = self.curves.setdefault(key, [])
        if curve and curve[-1].step == point.step:  # the end-of-run report repeats the last evaluation
            curve[-1] = point
        else:
            curve.append(point)

    def on_trial_complete(self, iteration, trials, trial, **info):
        last = trial.last_result or {}
        if TrialResult.from_tune(last, read_records=False).sent:
            return  # ran to its end (run_trial wrote and sent its record(s))
        prefix = f"{trial.trial_id}{SEED_KEY}"
        seeds: list[int | None] = [int(k[len(prefix):]) for k in self.curves if k.startswith(prefix)]
        for seed in seeds or ([None] if self.curves.get(trial.trial_id) else []):  # none: no evaluation yet
            try:
                own = {**last, **self.latest[f"{prefix}{seed}"]} if seed is not None else last
                self.record(trial, TrialResult.from_tune(own, read_records=False), seed)
            except Exception as exc:
                import warnings

                warnings.warn(f"could not record stopped trial {trial.trial_id}"
                              + (f" (seed {seed})" if seed is not None else "") + f": {exc}", stacklevel=2)

    def record(self, trial, last: TrialResult, seed: int | None = None) -> Path:
        """Write the record of a stopped trial (``seed``: one seed of a trial that trains them all)."""
        ctx = self.ctx
        curve = self.curves[trial.trial_id if seed is None else f"{trial.trial_id}{SEED_KEY}{seed}"]
        hp, seed, _, cfg = resolve_trial(trial.config, ctx, trial.trial_id, seed=seed)
        best = max(curve, key=lambda p: p.dev_spearman)
        out = cfg.output_dir()
        if cfg.resources.workers and not (out / "best").is_dir():
            # a Ray Train trial keeps its best model in its checkpoints until it finishes

            try:
                take_best_model_of_run(cfg)
            except Exception as exc:
                import warnings

                warnings.warn(f"stopped trial {trial.trial_id}: no best model from its checkpoints: {exc}",
                              stacklevel=2)
        start = curve[0].scores() if curve and curve[0].step == 0 else None
        best_score, best_step = last.best()
        rec = build_record(ctx, cfg, hp, seed, trial.trial_id,
                           best_dev_spearman=best.dev_spearman if best_score is None else best_score,
                           best_step=best.step if best_step is None else best_step, initial_dev=start,
                           dev_curve=list(curve), final_step=last.step, workers=cfg.resources.workers or 1,
                           best_model_dir=str(out / "best") if (out / "best").is_dir() else None,
                           wall_seconds=last.time_total_s,  # the trial's, until its last report
                           stopped=StoppedBy(by="scheduler", at_step=last.step,
                                             training_iteration=last.training_iteration,
                                             total_steps=cfg.train.max_steps),
                           finished_at=time.time())
        path = record_path(ctx, rec, stopped=True)
        live = None  # the trial's live MLflow run, where its folder is on this machine
        if ctx.mlflow and (out / LIVE_RUN_FILE).is_file():
            live = LiveRun(ctx.mlflow.uri, (out / LIVE_RUN_FILE).read_text().strip())
        save_record(path, rec, cfg, ctx, live=live, status="KILLED", tags={"stopped_by": "scheduler"})
        if rec.best_model_dir:  # its best model is kept: the checkpoints go as a finished trial's do
            drop_checkpoints(cfg)
        return path

    # Tune saves a callback's state with the experiment's: a resumed search keeps the curves so far
    def get_state(self) -> dict:
        return {"curves": self.curves, "latest": self.latest}

    def set_state(self, state: dict) -> None:
        self.curves = dict(state.get("curves", {}))
        self.latest = dict(state.get("latest", {}))
