"""`raysent tune`'s driver: a search's phases, each a Ray Tune run, and what the driver keeps of them.

:func:`tune_experiment` reads as the phases of a search:

Checks
    Every run record (``--resume``), the model, data, batch, results folder, MLflow store, Ray address and, on
    a local Ray, the resources, then MLflow's artifact store and registry: one error before Ray starts.
Search phase (:func:`run_search`)
    ``search.algorithm`` as Tune's searcher (:mod:`raysent.tune.searchers`: Optuna's TPE, GP or random sampler,
    or a grid), the warm-start configuration first (:class:`~raysent.tune.plan.SearchPlan`). ``search.seeds`` > 1
    repeats each configuration once per seed, or, with a scheduler (ASHA) or a pruner (Wilcoxon;
    :mod:`raysent.tune.schedulers`), makes a trial train all its seeds in turns (:mod:`raysent.tune.seeds`). A
    trial (:func:`raysent.tune.trial.run_trial`) trains through Ray Train (``resources.workers``) or in its own
    process.
Best configuration (:func:`choose_best`)
    Picked from the search's records (:mod:`raysent.tune.best`), written to ``best.yaml``, each searched
    configuration a run in MLflow.
Final phase (:func:`run_final`)
    The best configuration on every seed of ``seeds``, evaluated on the test sets (``eval.tasks``); when it
    is not the warm-start configuration, that one too, on the same seeds and in the same Tune run (both arms'
    seeds train at once where there is room), compared paired by seed (:func:`versus_paper`).
Publish (:mod:`raysent.tune.publish`)
    The table, model cards and MLflow: outcome, model, registry.

Records: every finished run's ``results/<experiment>/runs/<phase>-<search>-<config>-seed<seed>.json``; a
trial on another node sends its record in its last result and the driver writes it
(:mod:`raysent.tune.records_transport`). Where things go: :mod:`raysent.tune.storage`; the MLflow store served to
trials on other nodes: :mod:`raysent.tune.mlflow_server`. The state between phases is ``state.json``
(:class:`~raysent.tune.state.SearchState`); ``--resume`` continues from it (finished trials kept, unfinished ones
from their checkpoints, a deleted record written again from Tune's results). Ray, Tune, Optuna and MLflow are
imported in the functions that use them (the checks run before Ray starts).
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from raysent.config import ExperimentConfig, hyperparameters, no_search_part, with_overrides
from raysent.errors import Interrupted, RaysentError
from raysent.io import is_disk_full
from raysent.preflight import check_resources, preflight
from raysent.report.compare import compare
from raysent.report.summary import runs_view_url
from raysent.tracking import (
    end_runs_of,
    ensure_experiment,
    log_budget,
    log_configuration,
    redact,
    reopen_run,
    start_run,
    tracking_uri,
)
from raysent.train import compile_cache
from raysent.train.ray_train import init_ray, worker_env
from raysent.train.records import check_records
from raysent.train.resources import (
    Placement,
    cluster_capacity,
    packable,
    resolve,
    run_record,
    trials_at_once,
    tune_trial_resources,
)
from raysent.tune import gpu_probe, mlflow_server
from raysent.tune.best import arm_outcome, by_configuration, log_configurations, pick_best, records, write_best_yaml
from raysent.tune.diskspace import disk_full, space_needed
from raysent.tune.lock import SearchLock, search_lock
from raysent.tune.plan import SearchPlan, sampler_settings
from raysent.tune.publish import PublishError, check_publishing, publish, search_budget_of
from raysent.tune.records_transport import check_complete, restore_records, results_of, write_sent_records
from raysent.tune.searchers import searcher_of
from raysent.tune.seeds import run_seeds
from raysent.tune.space import WARM_ARMS, config_id, warm_source
from raysent.tune.state import ArmOutcome, Best, Comparison, FailedTrial, SearchState, Summary
from raysent.tune.storage import (
    errored_for_space,
    experiment_dir,
    remove_leftovers,
    space_ran_out,
    tune_storage,
    with_absolute_storage,
)
from raysent.tune.protocol import BEST, DEV, MlflowTarget, TrialContext
from raysent.tune.trial import (
    GATE_VAR,
    TrialNamer,
    run_trial,
    this_node,
    trial_dirname,
)

# Lazy imports: optuna, ray, raysent's heavier modules (heavy, and only the functions that need them import them).

Say = Callable[[str], None]

BROKEN_RECORD_FIX = ("Delete each broken file and run `raysent tune {source} --resume` again: a finished run's record "
                     "is written again from the result Tune kept for its trial (nothing is trained again); a run "
                     "Tune kept no result of is trained again, alone. (A broken record in stopped/ is the curve "
                     "of a trial the scheduler stopped; its MLflow run, KILLED, keeps that curve.)")


# --------------------------------------------------------------------------- the trials
def tune_metric(cfg: ExperimentConfig) -> str:
    """What the trials report to the searcher for ``search.metric``: the mean dev Spearman is told as the run's
    best (its score at its best evaluation), a ``dev/<set>`` score as it is."""
    metric = cfg.search.metric if cfg.search else DEV
    return BEST if metric == DEV else metric


def reuse_trial_processes(cfg: ExperimentConfig) -> bool:
    """Whether a trial runs in the process of the trial before it (Tune's ``reuse_actors``, off by default).

    On for trials that train in their own process (``resources.workers: null``): a new trial process pays
    its start, the imports and the first model load again (docs/performance.md, "Measured", Ray). Off for
    trials that run Ray Train: ASHA stops such a trial inside ``TorchTrainer.fit()``, which does not return
    within Tune's 2 s reset timeout, and Tune then fails the next trial ("Could not re-use actor", Ray 2.60);
    their trial process is light anyway."""
    return cfg.resources.workers is None


def _silent(m: str) -> None:
    """What a quiet search says (raysent.search's default): nothing."""


def _say(quiet: bool) -> Say:
    return _silent if quiet else (lambda m: print(m, file=sys.stderr, flush=True))


def _tune_verbosity(say: Say) -> int | None:
    """Tune's status and result tables: none for a quiet search (about 280 lines for docs/python-api.md's example),
    Tune's default otherwise."""
    return 0 if say is _silent else None


def _fit(tuner: Any, say: Say) -> Any:
    """``tuner.fit()``; for a quiet search without a line on stdout: Tune prints each phase's header (its
    configuration and where its results are) whatever its verbosity, ~10 lines a phase, and forwards the trials'
    output through the driver's stdout. Errors still come back: Tune returns them with the results, and trial
    logs stay in the trial folders."""
    if say is not _silent:
        return tuner.fit()
    with contextlib.redirect_stdout(io.StringIO()):
        return tuner.fit()


def _trainable(cfg: ExperimentConfig, ctx: TrialContext, together: bool = False) -> Any:
    """Tune's trainable: a trial per (configuration, seed), or per configuration whose seeds train in turns."""
    from ray import tune

    res = tune_trial_resources(cfg)  # its gpus_per_worker resolved (tune_experiment)
    return tune.with_resources(tune.with_parameters(run_seeds if together else run_trial, ctx=ctx), res)


def _context(cfg: ExperimentConfig, exp: Path, state: SearchState, phase: str, mlflow: MlflowTarget | None,
             trials: int, **extra: Any) -> TrialContext:
    return TrialContext(config=cfg.to_dict(), source=state.source, phase=phase, run=state.run, exp_dir=str(exp),
                        metric=tune_metric(cfg), mlflow=mlflow, env=worker_env(), driver_node=this_node(),
                        gate=os.environ.get(GATE_VAR) or None, resources=run_record(cfg, state.resources, trials),
                        **extra)


# --------------------------------------------------------------------------- the phases
def _announce_search(cfg: ExperimentConfig, plan: SearchPlan, run: str, metric: str, say: Say) -> None:
    s = cfg.search
    assert s is not None
    if plan.warm_note:
        say(f"search.warm_start: the paper's setting cannot be tried first ({plan.warm_note})")
    if plan.warm is not None:
        say(f"search.warm_start: the paper's setting {plan.warm} is tried first")
    if plan.startup_note:
        say(f"search.n_startup_trials: {plan.startup_note}")
    stopper = ("the scheduler sees their mean" if s.scheduler is not None else
               "Optuna's WilcoxonPruner tests their per-seed scores")
    per = 1 if plan.together else s.seeds
    sampler = sampler_settings(cfg)
    if sampler is not None:
        say("search sampler: " + ", ".join(f"{k}={v}" for k, v in sampler.items()))
    say(f"search {run}: {s.algorithm}, {plan.trials} trials "
        + (f"(each trains {s.seeds} seeds in turns; {stopper})" if per == 1 < s.seeds
           else f"({s.seeds} seed(s) each)") + f", metric {metric} ({s.mode})")


def run_search(cfg: ExperimentConfig, plan: SearchPlan, exp: Path, state: SearchState, mlflow: MlflowTarget | None,
               resume: bool, say: Say) -> list[FailedTrial]:
    """The search phase's Tune run (every trial's record written); returns the trials that failed."""
    from ray import tune
    from ray.tune import RunConfig, TuneConfig, Tuner

    from raysent.tune.failfast import FailFast
    from raysent.tune.schedulers import early_stopping

    s = cfg.search
    assert s is not None
    run, metric = state.run, tune_metric(cfg)
    ctx = _context(cfg, exp, state, "search", mlflow, plan.trials)
    trainable = _trainable(cfg, ctx, together=plan.together)
    searcher, param_space = searcher_of(cfg, plan, exp, run, metric)
    scheduler, callbacks = early_stopping(cfg, ctx, metric)  # ASHA or Wilcoxon; the trials they stop get a record
    fail_fast = FailFast(s.fail_fast)
    callbacks.append(fail_fast)
    storage = tune_storage(cfg, exp)
    path = f"{storage.rstrip('/')}/search-{run}"
    per = 1 if plan.together else s.seeds  # Tune trials per configuration
    n = 1 if plan.points is not None else s.num_samples * per  # Tune's samples (it expands a grid itself)
    _announce_search(cfg, plan, run, metric, say)
    if resume and Tuner.can_restore(path):
        tuner = Tuner.restore(path, trainable=trainable, resume_unfinished=True,
                              resume_errored=_retry_errored(path, say), restart_errored=False, param_space=param_space)
    else:
        tuner = Tuner(trainable, param_space=param_space,
                      # metric and mode live in the searcher and the scheduler (a Repeater does not pass
                      # TuneConfig's down to the searcher it wraps)
                      tune_config=TuneConfig(search_alg=searcher, scheduler=scheduler,
                                             num_samples=n, max_concurrent_trials=trials_at_once(cfg),
                                             reuse_actors=reuse_trial_processes(cfg),
                                             trial_name_creator=TrialNamer(cfg, "search"),
                                             trial_dirname_creator=trial_dirname),
                      run_config=RunConfig(name=f"search-{run}", storage_path=storage, callbacks=callbacks,
                                           stop=fail_fast, failure_config=tune.FailureConfig(max_failures=0),
                                           verbose=_tune_verbosity(say)))
    results = results_of(_fit(tuner, say))
    write_sent_records([r.metrics or {} for r in results], exp, mlflow)
    if fail_fast.reason is not None:
        kind, message = fail_fast.reason
        raise RaysentError(f"search {run} stopped: its first {s.fail_fast} trials all failed with {kind}: {message}"
                           f" (trial logs under {path}; search.fail_fast sets how many)")
    # Tune creates a grid's trials as it goes: interrupted, the ones not started yet are not in `results`
    check_complete(results, plan.trials, cfg, "search")
    failed = [FailedTrial(trial_id=r.metrics.get("trial_id") if r.metrics else None, path=r.path,
                          error=str(r.error).strip().splitlines()[-1][:500]) for r in results if r.error is not None]
    for f in failed:
        say(f"trial failed: {f.error}")
    return failed


def choose_best(cfg: ExperimentConfig, exp: Path, run: str, failed: list[FailedTrial], mlflow: MlflowTarget | None,
                say: Say) -> Best:
    """The best configuration of search ``run``, from its records (:func:`raysent.tune.best.pick_best`): written to
    best.yaml, each searched configuration a run in MLflow (its seeds' runs below it)."""
    assert cfg.search is not None
    best = pick_best(exp, run, cfg.search.mode, failed, say)
    if mlflow:
        log_configurations(cfg, mlflow, by_configuration(records(exp, "search", run)), best)
    write_best_yaml(cfg, exp, run, best)
    say(f"best configuration {best.config_id}: {best.hp}  dev {best.dev_mean:.2f}"
        + (f" ± {best.dev_std:.2f}" if best.n > 1 else "") + f" ({best.n} seed(s))")
    return best


def run_final(cfg: ExperimentConfig, exp: Path, state: SearchState, arms: dict[str, dict], mlflow: MlflowTarget | None,
              resume: bool, say: Say) -> dict[str, ArmOutcome]:
    """The final phase: each arm's configuration (``arms``: "" the searched best, "paper" the warm-start
    configuration it is compared with) on every seed, evaluated on the test sets, all in one Tune run, so that on
    a cluster both arms' seeds train at once and a phase start is paid once. Returns each arm's outcome."""
    from ray import tune
    from ray.tune import RunConfig, TuneConfig, Tuner

    seeds = list(cfg.seeds)
    ctx = _context(cfg, exp, state, "final", mlflow, len(arms) * len(seeds), arms=arms)
    trainable = _trainable(cfg, ctx)
    storage, name = tune_storage(cfg, exp), final_run_name(arms, state.run)
    for arm, hp in arms.items():
        label = f" ({WARM_ARMS[warm_source(cfg)]}, to compare)" if arm else ""
        say(f"final phase{label}: {hp or 'the configuration as given'} on seeds {seeds}")
    # a trial per (arm, seed); with one arm the space is the seeds alone, as before there were two arms
    param_space = {**({"arm": tune.grid_search(list(arms))} if len(arms) > 1 else {}),
                   "seed": tune.grid_search(seeds)}
    concurrent = trials_at_once(cfg)
    path = f"{storage.rstrip('/')}/{name}"
    if resume and Tuner.can_restore(path):
        tuner = Tuner.restore(path, trainable=trainable, resume_errored=_retry_errored(path, say),
                              param_space=param_space)
    else:
        tuner = Tuner(trainable, param_space=param_space,
                      tune_config=TuneConfig(num_samples=1, max_concurrent_trials=concurrent,
                                             reuse_actors=reuse_trial_processes(cfg),
                                             trial_name_creator=TrialNamer(cfg, "final", arms),
                                             trial_dirname_creator=trial_dirname),
                      run_config=RunConfig(name=name, storage_path=storage,
                                           failure_config=tune.FailureConfig(max_failures=0),
                                           verbose=_tune_verbosity(say)))
    results = results_of(_fit(tuner, say))
    write_sent_records([r.metrics or {} for r in results], exp, mlflow)
    check_complete(results, len(arms) * len(seeds), cfg, "final phase")
    final_recs = records(exp, "final", state.run)
    outcomes = {}
    for arm, hp in arms.items():
        errors = [str(r.error).strip().splitlines()[-1][:500] for r in results
                  if r.error is not None and str((r.config or {}).get("arm", "")) == arm]
        cid = config_id(hp)
        recs = [r for r in final_recs if r.config_id == cid]
        outcomes[arm] = outcome = arm_outcome(recs, seeds, errors or ([] if recs else ["no run finished"]))
        if not recs:  # reported, and the other arm's outcome still goes in the summary
            say(f"final phase{' (' + arm + ' arm)' if arm else ''}: no seed finished: {outcome.errors[0]}")
            continue
        if mlflow:
            flat = {**{f"{k}_mean": v.mean for k, v in outcome.scores.items()},
                    **{f"{k}_std": v.std for k, v in outcome.scores.items()}}
            log_configuration(mlflow.uri, mlflow.experiment_id, with_overrides(cfg, hp) if hp else cfg, "final", hp,
                              cid, flat, [r.mlflow_run_id for r in recs if r.mlflow_run_id], mlflow.parent,
                              [r.seed for r in recs])
    if not any(o.seeds for o in outcomes.values()):
        raise RaysentError("final phase: no run finished; errors: "
                           + "; ".join(e for o in outcomes.values() for e in o.errors[:3]))
    return outcomes


def _retry_errored(path: str, say: Say) -> bool:
    """``--resume``: whether Tune runs the phase's errored trials again (``resume_errored``). Yes when one of them
    failed for lack of space (freed since: a retry can finish it; Tune's own restore of such a trial, whose
    error.pkl the full disk left empty, fails with "EOFError: Ran out of input"); no otherwise, for a trial that
    failed by itself (a diverged loss) fails again the same way."""
    retry = errored_for_space(path)
    if retry:
        say(f"--resume: {retry} trial(s) failed for lack of space; they run again")
    return bool(retry)


def final_run_name(arms: dict[str, dict], run: str) -> str:
    """The final phase's Tune run: ``final-<run>``, both arms in it; ``final-paper-<run>`` for the warm-start arm
    alone, which a search an earlier raysent ran (its two arms one after the other) can have left to do."""
    return f"final-{'paper-' if '' not in arms else ''}{run}"


def versus_paper(exp: Path, run: str, paper_cid: str, best_cid: str) -> Comparison:
    """`raysent compare` of the final phase's searched best (B) against the warm-start configuration (A), paired
    by seed: per set the means, the mean difference, the paired t-test and Wilcoxon p."""
    runs = exp / "runs"
    res = compare([str(runs / f"final-{run}-{paper_cid}-seed*.json"), str(runs / f"final-{run}-{best_cid}-seed*.json")],
                  exp.parent, phase="final")
    return Comparison(paper=paper_cid, searched=best_cid, tasks=res.comparisons[0].tasks)


# --------------------------------------------------------------------------- a search
def _checks(cfg: ExperimentConfig, exp: Path, state: SearchState | None, source: str, resume: bool) -> None:
    """Every check that can be made before Ray starts (exit 2, nothing written): the records of a resumed
    search, then the model, data, batch, results folder, MLflow store, Ray address and (a local Ray) resources."""
    if resume and state is None:
        raise RaysentError(f"--resume: no search to resume in {exp} (no state.json); run without --resume")
    if resume:
        check_records(exp, BROKEN_RECORD_FIX.format(source=source))
    remote = bool(cfg.resources.address or os.environ.get("RAY_ADDRESS"))
    preflight(cfg, resources=not remote, mlflow=True)


def _open_mlflow(cfg: ExperimentConfig) -> tuple[str, str | None]:
    """The store's URI and the experiment's id (None: tracking off), after the artifact store and the registry
    were checked."""
    uri = tracking_uri(cfg)
    exp_id = ensure_experiment(cfg)
    if exp_id is not None:
        check_publishing(cfg, exp_id)
    return uri, exp_id


def _phase_trials(cfg: ExperimentConfig, state: SearchState | None, final_only: bool) -> int:
    """Tune trials of the phase a search starts (or resumes) with: the search's, else the final phase's."""
    searching = not final_only and cfg.search is not None and (state is None or state.phase == "search")
    return SearchPlan.of(cfg).trials if searching else len(cfg.seeds)


def _start_ray(cfg: ExperimentConfig, exp: Path, state: SearchState | None, final_only: bool, say: Say,
               trains: bool = True) -> tuple[ExperimentConfig, Placement]:
    """Ray started (or joined), and the trials' resources resolved against it: ``resources.gpus_per_worker`` auto,
    resolved once, here (every trial is given the number: its config, run record and result.json hold it; the
    search's state and summary record it), for a search that ``trains`` with the trials per GPU a probe on one of
    the cluster's GPUs measured first (:mod:`raysent.tune.gpu_probe`; cached in ``exp``: ``--resume`` measures
    nothing again)."""
    init_ray(cfg)
    trials = _phase_trials(cfg, state, final_only)
    found = cluster_capacity() if trains and packable(cfg) else None
    packing = gpu_probe.packing_for(cfg, exp, found[0], trials, say, env=worker_env()) if found is not None else None
    cfg, place = resolve(cfg, trials=trials, packing=packing)
    check_resources(cfg)  # against the Ray this search runs on
    say(place.describe())
    return cfg, place


def search_id(now: datetime | None = None) -> str:
    """A search's id: its start time to the millisecond (20261203-061502-317), which sorts as the searches
    started (:func:`raysent.report.runs.latest_search`; the ids before 2026-12 end at the second, and sort
    with these) and does not repeat for two searches started in one second."""
    return (now or datetime.now()).strftime("%Y%m%d-%H%M%S-%f")[:-3]


def _start(cfg: ExperimentConfig, exp: Path, uri: str, exp_id: str | None, final_only: bool,
           source: str, place: Placement | None = None) -> SearchState:
    phase = "final" if final_only else "search"
    state = SearchState(run=search_id(), phase=phase, config=cfg.to_dict(),
                        source=source, resources=place.record() if place is not None else None,
                        sampler=sampler_settings(cfg) if cfg.search is not None and not final_only else None)
    if exp_id is not None:
        tags = {"method": cfg.method, "model": cfg.model.name, "phase": phase}
        if place is not None and place.gpus_per_worker is not None:
            tags["gpus_per_worker"] = f"{place.gpus_per_worker:g}"
        state.parent_run_id = start_run(uri, exp_id, f"{phase}-{state.run}", tags)
    state.save(exp)
    return state


def tune_experiment(cfg: ExperimentConfig, resume: bool = False, final_only: bool = False, quiet: bool = False,
                    source: str = "<config>", paper_arm: bool = True, search_only: bool = False) -> Summary:
    """A search and its final phase (``final_only``: the final phase alone; ``search_only``: the search alone,
    ``resume`` later goes on), then its outcome published; returns the summary (also summary.json).

    With ``search.warm_start: paper`` the warm-start configuration is tried first and, when it is not the
    searched best, also run on every seed (``paper_arm``; a suite, which runs its own paper arm, turns this
    off), so that the summary compares the two paired over seeds."""
    say = _say(quiet)
    if not final_only and cfg.search is None:
        raise no_search_part(source)
    cfg = with_absolute_storage(cfg)  # trials run in their own folders (and on other nodes)
    exp = experiment_dir(cfg)
    state = SearchState.load(exp) if resume else None

    # checks: before Ray starts and before anything is written
    _checks(cfg, exp, state, source, resume)
    with search_lock(exp) as lock:  # one search of this experiment at a time (raysent.tune.lock)
        state = SearchState.load(exp) if resume else None  # as it is now that no other search can write it
        return _locked(cfg, exp, state, lock, resume, final_only, source, say, paper_arm, search_only)


def _locked(cfg: ExperimentConfig, exp: Path, state: SearchState | None, lock: SearchLock, resume: bool,
            final_only: bool, source: str, say: Say, paper_arm: bool, search_only: bool) -> Summary:
    """:func:`tune_experiment` once the checks passed and this process holds the experiment's lock."""
    removed = remove_leftovers(exp)  # what a search killed in the middle of a write left behind
    if removed:
        say(f"removed {removed} temporary file(s) a search killed before left in {exp}")
    # the MLflow experiment and its registry checks before Ray starts (a taken model name is said in seconds);
    # a run the resources check then refuses leaves that experiment, empty, behind
    uri, exp_id = _open_mlflow(cfg)
    trains = state is None or state.phase not in ("publish", "done")
    # before Ray starts: its processes, the trials and their Ray Train workers share the experiment's compile caches
    compile_cache.use_for(cfg)
    place = None
    if trains or cfg.resources.address or os.environ.get("RAY_ADDRESS"):  # publishing may fetch a model from a node
        cfg, place = _start_ray(cfg, exp, state, final_only, say, trains)
    if state is not None and (restored := restore_records(cfg, exp, state.run)):
        say(f"--resume: {restored} run record(s) written again from the results Tune kept")
    if state is None:
        state = _start(cfg, exp, uri, exp_id, final_only, source, place)
    else:
        if exp_id is not None and state.parent_run_id:
            reopen_run(uri, state.parent_run_id)  # --resume: the search's run is running again
        if place is not None:  # --resume: the resources of this run of it (the cluster may be another)
            state.resources = place.record()
            state.save(exp)
    lock.name(state.run)
    mlflow = MlflowTarget(uri=uri, experiment_id=exp_id, parent=state.parent_run_id) if exp_id else None
    say(f"experiment {exp.name}: results in {exp}" + (f", MLflow {redact(uri)}" if mlflow else ""))
    started = time.time()
    try:
        return _run(cfg, exp, state, mlflow, uri, exp_id, trains, resume, say, paper_arm and not final_only,
                    search_only)
    except Exception as exc:
        # a full disk, whichever error it surfaced as (module raysent.tune.diskspace): one error, said so
        if is_disk_full(exc) or space_ran_out(cfg, exp, started):
            runs = 0 if final_only or cfg.search is None else SearchPlan.of(cfg).runs
            raise disk_full(exp, space_needed(cfg, runs), source) from exc
        raise


def _run(cfg: ExperimentConfig, exp: Path, state: SearchState, mlflow: MlflowTarget | None, uri: str,
         exp_id: str | None, trains: bool, resume: bool, say: Say, paper_arm: bool, search_only: bool) -> Summary:
    """The phases of a started search, its MLflow run ended with them, then its summary and publishing."""
    plan = SearchPlan.of(cfg)
    started = time.time()
    status, server = "FAILED", None
    try:
        if mlflow and trains:  # trials on other nodes reach the store through a server on this one
            server = mlflow_server.serve(cfg, exp, uri, say)
            if server is not None:
                mlflow = mlflow.model_copy(update={"uri": server.url})
            mlflow_server.check_reach(mlflow.uri, "tracking.mlflow_uri")
        _phases(cfg, plan, exp, state, mlflow, resume, say, paper_arm=paper_arm, search_only=search_only)
        status = "FINISHED"
    except (Interrupted, KeyboardInterrupt):
        status = "KILLED"  # resumable: --resume sets it running again
        raise
    finally:
        if mlflow and exp_id and state.parent_run_id:
            # the search's run, and any run of it still open (a trial killed with the search), end with it; when
            # the search failed (a full disk: the store may be unwritable too) that error is the one reported
            failing = sys.exc_info()[1] is not None
            try:
                end_runs_of(uri, exp_id, state.parent_run_id, status)
            except Exception:
                if not failing:
                    raise
        if server is not None:
            server.stop()
            say(f"MLflow: stopped the tracking server at {server.url}")
        if mlflow:
            mlflow = mlflow.model_copy(update={"uri": uri})  # the store itself, for what is logged after the search
    return _finish(cfg, exp, state, mlflow, time.time() - started, say)


def _phases(cfg: ExperimentConfig, plan: SearchPlan, exp: Path, state: SearchState, mlflow: MlflowTarget | None,
            resume: bool, say: Say, paper_arm: bool, search_only: bool) -> None:
    """The search, the final phase of its best configuration, and of the warm-start configuration when that is
    another; each phase's outcome is saved before the next starts (``--resume`` goes on from there)."""
    if state.phase == "search":
        failed = run_search(cfg, plan, exp, state, mlflow, resume, say)
        state.best = choose_best(cfg, exp, state.run, failed, mlflow, say)
        state.phase = "final"
        state.save(exp)
    if state.phase == "final" and not search_only:
        if state.best is None:  # --final-only: the configuration as given
            state.best = Best(config_id=config_id({}))
        arms = {"": state.best.hp}
        if paper_arm and plan.warm is not None and config_id(plan.warm) != state.best.config_id:
            arms["paper"] = plan.warm  # the warm-start configuration on the same seeds, to compare
        outcomes = run_final(cfg, exp, state, arms, mlflow, resume, say)
        state.final = outcomes[""]
        if "paper" in outcomes:
            _compare_with_warm(cfg, exp, state, plan, outcomes["paper"])
        state.phase = "publish"
        state.save(exp)
    if state.phase == "paper":  # --resume of a search an earlier raysent left between its two final phases
        _compare_with_warm(cfg, exp, state, plan,
                           run_final(cfg, exp, state, {"paper": plan.warm or {}}, mlflow, resume, say)["paper"])
        state.phase = "publish"
        state.save(exp)


def _compare_with_warm(cfg: ExperimentConfig, exp: Path, state: SearchState, plan: SearchPlan,
                       outcome: ArmOutcome) -> None:
    """The warm-start arm's outcome in the state, and the searched best compared with it, paired by seed."""
    assert state.best is not None
    state.warm_source = warm_source(cfg)  # "paper", or "file" when the file set its own values
    state.paper = outcome
    if outcome.seeds and state.final is not None and state.final.seeds:  # an arm where no seed finished: no pairs
        state.vs_paper = versus_paper(exp, state.run, config_id(plan.warm or {}), state.best.config_id)


def _finish(cfg: ExperimentConfig, exp: Path, state: SearchState, mlflow: MlflowTarget | None, wall: float,
            say: Say) -> Summary:
    """summary.json, then the outcome published where researchers work (files, model cards, MLflow); a
    publishing failure is kept in the summary, and the state stays at that step for ``--resume``."""
    summary = Summary(experiment=exp.name, results=str(exp), search=state.run, best=state.best, final=state.final,
                      paper=state.paper, vs_paper=state.vs_paper, warm_source=state.warm_source,
                      mlflow=redact(mlflow.uri) if mlflow else None,
                      mlflow_runs_url=runs_view_url(mlflow.experiment_id) if mlflow else None, wall_seconds=wall,
                      budget=search_budget_of(cfg, exp, state), published=state.published,
                      resources=state.resources, sampler=state.sampler)
    summary.save(exp)
    if mlflow and state.parent_run_id and summary.budget is not None:  # also a search without its final phase
        from raysent.report.budget import budget_markdown, budget_metrics

        log_budget(mlflow.uri, state.parent_run_id, budget_metrics(summary.budget), summary.budget.expected_best,
                   budget_markdown(summary.budget))
    if state.phase == "publish":
        try:
            state.published = publish(cfg, exp, state, mlflow, say, save=lambda: state.save(exp))
            state.phase = "done"
        except PublishError as exc:
            summary.publish_error = str(exc)  # the search stays at this step: --resume publishes again
        state.save(exp)
        summary.published = state.published
        summary.save(exp)
    return summary


__all__ = ["experiment_dir", "hyperparameters", "tune_experiment"]
