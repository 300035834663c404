"""`raysent tune`: Ray Tune + Optuna over the YAML's search space, seeds, a final phase, MLflow.

Search phase
    ``search.algorithm``: Optuna's TPE (seeded, the default) or its random sampler, both through
    ``ray.tune.search.optuna.OptunaSearch`` with a define-by-run space (conditional entries), the
    Optuna study kept in ``results/<experiment>/optuna.db`` (for Optuna's plots); or ``grid``
    (every combination, Tune's ``grid_search``). ``search.seeds`` > 1 wraps the searcher in Tune's
    ``Repeater``: each suggestion runs once per seed and the searcher is told the mean over the
    seeds (``nanmean``: a failed seed is left out). A scheduler (ASHA) may stop trials early; with
    seeds > 1 a trial is then a configuration whose seeds train in turns and report their mean
    (:mod:`raysent.tune.seeds`), so the scheduler stops configurations on the seed mean. Each trial
    trains through Ray Train (``resources.workers``; Train inside a Tune function trainable, metrics
    forwarded by ``TuneReportCallback``) or, without workers, in the trial's own process.
    The searched value is the run's best dev score (``best_dev_spearman`` for ``dev_spearman``).
Final phase
    The best configuration (highest mean over its seeds) re-runs for every seed of ``seeds`` and is
    evaluated on the test sets (``eval.tasks``; STS's seven by default). ``--final-only --config
    best.yaml`` runs this phase alone.
Records
    Every finished run writes ``results/<experiment>/runs/<phase>-<search>-<config>-seed<seed>.json``
    (atomic) and an MLflow run; a configuration's seeds are grouped under a run of their own, under
    the search's parent run. A trial the scheduler stops gets its record (its dev curve up to the stop)
    in ``stopped/`` and an MLflow run marked KILLED, written on the driver (:mod:`raysent.tune.stopped`).
    A failed trial (NaN loss, out of memory, an exception) is marked failed with its reason, and the
    search goes on. ``--resume`` continues an interrupted search
    (``Tuner.restore``): finished trials are kept, unfinished ones continue from their checkpoints.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from datetime import datetime
from pathlib import Path

import numpy as np
import yaml

from raysent.config import ExperimentConfig, parse_config, with_overrides
from raysent.errors import Interrupted, RaysentError
from raysent.io import write_json_atomic
from raysent.train.records import RunRecord, TrainSummary, learned, read_record, validate_record
from raysent.train.run import train_in_process, train_stages
from raysent.tune.space import config_id, encode, grid, paper_point, suggest, warm_source
from raysent.tune.trial import (
    RECORD_KEY,
    STOPPED_DIR,
    MlflowTarget,
    TrialContext,
    TrialNamer,
    TuneHooks,
    build_record,
    drop_checkpoints,
    open_live_run,
    quiet_exit,
    record_path,
    resolve_trial,
    save_record,
    seeds_in_one_trial,
    this_node,
    training_fields,
    trial_dirname,
    trial_identity,
)

STATE_FILE = "state.json"


# --------------------------------------------------------------------------- where things go
def experiment_dir(cfg: ExperimentConfig) -> Path:
    from raysent.tracking import experiment_name

    return Path(cfg.tracking.results_dir).resolve() / experiment_name(cfg)


def tune_metric(cfg: ExperimentConfig) -> str:
    metric = cfg.search.metric if cfg.search else "dev_spearman"
    return "best_dev_spearman" if metric == "dev_spearman" else metric


def _load_state(exp: Path) -> dict:
    p = exp / STATE_FILE
    return json.loads(p.read_text()) if p.is_file() else {}


def _save_state(exp: Path, state: dict) -> None:
    write_json_atomic(exp / STATE_FILE, state)


# --------------------------------------------------------------------------- one trial
def run_trial(config: dict, ctx: TrialContext) -> None:
    """One (configuration, seed): train, evaluate (final phase: test sets), record, report to Tune."""
    from ray import tune

    from raysent.train.memory import release_freed_memory

    release_freed_memory()  # this process may have run the trial before (reuse_trial_processes)
    sys.unraisablehook = quiet_exit
    for key, value in ctx.env.items():
        if key not in os.environ or os.path.exists(value):
            os.environ[key] = value
    trial_id = tune.get_context().get_trial_id()
    if ctx.phase == "search" and seeds_in_one_trial(parse_config(ctx.config, source=ctx.source)):
        from raysent.tune.seeds import run_seed_group, seed_mean

        records = run_seed_group(config, ctx, trial_id)
        mean = seed_mean([_reported(r, ctx.metric) for r in records])
        tune.report({**mean, "seeds": len(records), "finished": True,
                     RECORD_KEY: json.dumps(records, default=str)})
        return
    hp, seed, cid, cfg = resolve_trial(config, ctx, trial_id)
    identity = trial_identity(ctx, hp, seed, trial_id)
    done = record_path(ctx, RunRecord.model_construct(**identity, search=ctx.run))
    if done.is_file():
        # its record was written before the search was interrupted (or an earlier trial of the search ran the
        # same configuration and seed): the run is not trained, nor logged, twice
        data = read_record(done).to_json()
    else:
        data = train_and_record(cfg, ctx, hp, seed, trial_id, identity)
    # the record also travels in the result: on a cluster this trial may run on another node, whose disk the
    # driver cannot read; the driver writes every record it gets back into its own results/<exp>/runs
    tune.report({**_reported(data, ctx.metric), "seed": seed, "finished": True,
                 RECORD_KEY: json.dumps(data, default=str),
                 **{k: v for k, v in data.get("scores", {}).items() if isinstance(v, float)}})


def _reported(record: dict, metric: str) -> dict:
    """What a finished run tells the searcher: its best dev score, or ``metric`` at its last evaluation."""
    return {metric: record["best_dev_spearman"] if metric == "best_dev_spearman"
            else (record["dev_curve"][-1].get(metric, math.nan) if record["dev_curve"] else math.nan)}


def train_and_record(cfg: ExperimentConfig, ctx: TrialContext, hp: dict, seed: int, trial_id: str,
                     identity: dict) -> dict:
    """Train one trial's run with its MLflow run live, evaluate it (final phase), write its record."""
    started = time.time()
    live = open_live_run(ctx, cfg, identity)
    TuneHooks.live = live
    try:
        summary = train_trial(cfg, live)
        final = {}
        if ctx.phase == "final":
            final["eval"] = evaluate_final(cfg, str(summary.best_model_dir))
            final["scores"] = final["eval"]["metrics"]
    except BaseException as exc:
        if live is not None:
            # KeyboardInterrupt / SystemExit: Ctrl-C, or Tune ending the trial; the search's end decides
            failed = isinstance(exc, Exception)
            live.fail(f"{type(exc).__name__}: {exc}" if failed else "interrupted", "FAILED" if failed else "KILLED")
        raise
    finally:
        TuneHooks.live = None
    record = build_record(ctx, cfg, hp, seed, trial_id, **training_fields(summary), **final,
                          wall_seconds=time.time() - started, finished_at=time.time())
    data = save_record(record_path(ctx, record), record, cfg, ctx, live=live)
    drop_checkpoints(cfg)  # before the last report, after which Tune may end this process
    return data


def _sync_records(results, exp: Path, mlflow: dict | None = None) -> int:
    """Write the run records carried by the trials' results that are not on this machine's disk yet."""
    return write_sent_records([r.metrics or {} for r in results], exp, mlflow)


def write_sent_records(last_results: list[dict], exp: Path, mlflow: dict | None = None) -> int:
    """Write the run records that trials sent in their last result (``RECORD_KEY``) and that are not on this
    machine's disk: those of trials on other nodes, and any record deleted since (a broken one). A record from
    another node also brings its run's MLflow files (config.yaml, result.json), which its trial could not write:
    the artifact folder is on this machine."""
    written = 0
    for metrics in last_results:
        text = metrics.get(RECORD_KEY)
        if not text:
            continue
        sent = json.loads(text)  # one record, or a list: the seeds of a trial that trains them all
        for data in sent if isinstance(sent, list) else [sent]:
            rec = validate_record(data, f"the record trial {metrics.get('trial_id')} sent")
            path = exp / "runs" / f"{rec.phase}-{rec.search}-{rec.config_id}-seed{rec.seed}.json"
            if not path.is_file():
                write_json_atomic(path, rec.to_json())
                written += 1
                if mlflow and rec.mlflow_run_id:
                    _log_files(mlflow["uri"], rec)
    return written


def _log_files(uri: str, rec: RunRecord) -> None:
    import warnings

    from raysent.tracking import log_record_artifacts, redact

    try:
        log_record_artifacts(uri, str(rec.mlflow_run_id), yaml.safe_dump(rec.config, sort_keys=False), rec.to_json())
    except Exception as exc:
        warnings.warn(f"MLflow ({redact(uri)}): the files of run {rec.mlflow_run_id} not logged: {exc}", stacklevel=2)


def restore_records(cfg: ExperimentConfig, exp: Path, run: str) -> int:
    """``--resume``: the records of the search's trials that Tune holds a finished result of and that are
    missing from runs/ (deleted because they were broken) are written again; nothing is trained for them."""
    from ray.tune import ExperimentAnalysis

    storage = tune_storage(cfg, exp).rstrip("/")
    written = 0
    for name in (f"search-{run}", f"final-{run}", f"final-paper-{run}"):
        path = f"{storage}/{name}"
        if "://" not in path and not Path(path).is_dir():
            continue
        try:
            trials = ExperimentAnalysis(path).trials
        except Exception:  # no experiment state (yet): nothing to restore from
            continue
        written += write_sent_records([t.last_result or {} for t in trials], exp)
    return written


BROKEN_RECORD_FIX = ("Delete each broken file and run `raysent tune {source} --resume` again: a finished run's record "
                     "is written again from the result Tune kept for its trial (nothing is trained again); a run "
                     "Tune kept no result of is trained again, alone. (A broken record in stopped/ is the curve "
                     "of a trial the scheduler stopped; its MLflow run, KILLED, keeps that curve.)")


def train_trial(cfg: ExperimentConfig, live=None) -> TrainSummary:
    """Every stage of one trial's run, resumed where a checkpoint exists: on Ray Train workers
    (``resources.workers``; Train's metrics forwarded to Tune and to the live MLflow run) or in the trial's
    own process."""
    if cfg.resources.workers:
        from ray.tune.integration.ray_train import TuneReportCallback

        from raysent.train.ray_train import train_one_with_ray
        from raysent.tune.live import MlflowReportCallback

        callbacks = [TuneReportCallback(), *([MlflowReportCallback(live)] if live is not None else [])]
        return train_stages(cfg, lambda c: train_one_with_ray(c, resume=True, quiet=True, callbacks=callbacks),
                            resume=True, log=lambda m: None)
    return train_in_process(cfg, resume=True, quiet=True, hooks=TuneHooks)


def evaluate_final(cfg: ExperimentConfig, model_dir: str) -> dict:
    """The final phase's test evaluation of the saved best model (``eval.tasks``)."""
    from raysent.eval.suite import evaluate_tasks
    from raysent.models.encoder import Encoder

    e = cfg.eval
    encoder = Encoder.load(model_dir)  # the saved best model, with its inference pooling in raysent.json
    encoder.eval()
    res = evaluate_tasks(encoder, e.tasks, pooling=e.pooling or encoder.meta.pooling, max_length=e.max_length,
                         batch_size=e.batch_size,
                         options={t: o for t, o in e.task_options().items() if t in e.tasks})
    return {"metrics": {k: float(v) for k, v in res["metrics"].items() if isinstance(v, (int, float))},
            "details": res.get("details", {})}


# --------------------------------------------------------------------------- the driver
def warm_point(cfg: ExperimentConfig, say=None) -> dict | None:
    """The paper's configuration a search starts from (``search.warm_start: paper``), None when off or when it
    cannot be tried (``say`` is told why): Optuna takes only a point of its space; a grid takes it as an
    extra point even when its values are not among the grid's."""
    if cfg.search is None or cfg.search.warm_start != "paper":
        return None
    point, outside = paper_point(cfg)
    if point is None or (outside and cfg.search.algorithm != "grid"):
        if say is not None:
            say(f"search.warm_start: the paper's setting cannot be tried first ({outside or 'a value is unset'})")
        return None
    return point


def search_grid(cfg: ExperimentConfig) -> list[dict]:
    """A grid search's points, the paper's configuration first (added when the grid lacks it)."""
    points = grid(cfg.search.space)
    first = warm_point(cfg)
    if first is None:
        return points
    return [first, *(p for p in points if p != first)]


def search_runs(cfg: ExperimentConfig) -> int:
    """How many runs a search trains (at most: a scheduler stops some): every grid point, or ``num_samples``
    suggestions, each on ``seeds`` seeds."""
    s = cfg.search
    return (len(search_grid(cfg)) if s.algorithm == "grid" else s.num_samples) * s.seeds


def search_trials(cfg: ExperimentConfig) -> int:
    """How many Tune trials a search has: one per run, or one per configuration when a trial trains all of
    its seeds (:func:`seeds_in_one_trial`)."""
    return search_runs(cfg) // cfg.search.seeds if seeds_in_one_trial(cfg) else search_runs(cfg)


def plan(cfg: ExperimentConfig, final_only: bool = False) -> dict:
    s = cfg.search
    r = cfg.resources
    searched = not final_only and s is not None
    exp = experiment_dir(cfg)
    from raysent.tracking import experiment_name, redact, tracking_uri

    per_trial = ({"trial driver CPU": r.trial_cpus, "Ray Train workers": r.workers,
                  "CPU per worker": r.cpus_per_worker, "GPU per worker": r.gpus_per_worker}
                 if r.workers else {"CPU": r.cpus_per_worker, "GPU": r.gpus_per_worker, "trains": "in the trial"})
    return {
        "experiment": experiment_name(cfg), "method": cfg.method, "model": cfg.model.name,
        "train_data": cfg.data.train, "search": None if not searched else {
            "algorithm": s.algorithm,
            "configurations": len(search_grid(cfg)) if s.algorithm == "grid" else s.num_samples,
            "first configuration (search.warm_start)": warm_point(cfg) or "none",
            "seeds per configuration": (f"{s.seeds} (in one trial, in turns: the scheduler stops "
                                        "configurations on their seed mean)" if seeds_in_one_trial(cfg) else s.seeds),
            "trials": search_trials(cfg), "runs": search_runs(cfg), "metric": f"{s.metric} ({s.mode})",
            "space": {k: {f: v for f, v in e.model_dump().items() if v is not None} for k, e in s.space.items()},
            "scheduler": s.scheduler.model_dump() if s.scheduler else None,
            "max_concurrent_trials": s.max_concurrent_trials},
        "final": {"seeds": cfg.seeds, "runs": len(cfg.seeds), "evaluation": cfg.eval.tasks},
        "resources per trial": per_trial,
        "results": str(exp), "run records": str(exp / "runs"),
        "trial checkpoints": ("kept" if s is not None and s.keep_checkpoints else
                              "deleted once a trial's record and best model are saved (search.keep_checkpoints)"),
        "mlflow": redact(tracking_uri(cfg)) if cfg.tracking.enabled else "off",
        "ray": cfg.resources.address or os.environ.get("RAY_ADDRESS") or "local",
    }


def _env() -> dict:
    from raysent.train.ray_train import worker_env

    return worker_env()


def _mlflow_target(mlflow: dict | None) -> MlflowTarget | None:
    return MlflowTarget(**mlflow) if mlflow else None


def _trainable(cfg: ExperimentConfig, ctx: TrialContext):
    from ray import tune

    r = cfg.resources
    res = {"CPU": r.trial_cpus} if r.workers else {"CPU": r.cpus_per_worker, "GPU": r.gpus_per_worker}
    return tune.with_resources(tune.with_parameters(run_trial, ctx=ctx), res)


def reuse_trial_processes(cfg: ExperimentConfig) -> bool:
    """Whether a trial runs in the process of the trial before it (Tune's ``reuse_actors``, off by default).

    On for trials that train in their own process (``resources.workers: null``): a new trial process pays
    its start, the imports and the first model load again (docs/performance.md, "Measured", Ray). Off for
    trials that run Ray Train: ASHA stops such a trial inside ``TorchTrainer.fit()``, which does not return
    within Tune's 2 s reset timeout, and Tune then fails the next trial ("Could not re-use actor", Ray 2.60);
    their trial process is light anyway."""
    return cfg.resources.workers is None


def _say(quiet: bool):
    return (lambda m: None) if quiet else (lambda m: print(m, file=sys.stderr, flush=True))


def versus_paper(exp: Path, run: str, paper_cid: str, best_cid: str) -> dict:
    """`raysent compare` of the final phase's searched best (B) against the paper's setting (A), paired by
    seed: per set the means, the mean difference, the paired t-test and Wilcoxon p."""
    from raysent.report.compare import compare

    runs = exp / "runs"
    res = compare([str(runs / f"final-{run}-{paper_cid}-seed*.json"), str(runs / f"final-{run}-{best_cid}-seed*.json")],
                  exp.parent, phase="final")
    return {"paper": paper_cid, "searched": best_cid, "tasks": res["comparisons"][0]["tasks"]}


def tune_experiment(cfg: ExperimentConfig, resume: bool = False, final_only: bool = False, quiet: bool = False,
                    source: str = "<config>", paper_arm: bool = True, search_only: bool = False) -> dict:
    """Search (unless ``final_only``), then the final phase (unless ``search_only``: ``resume`` later runs
    it); returns the summary (also summary.json).

    With ``search.warm_start: paper`` the paper's configuration is tried first and, when it is not the
    searched best, also run on every seed (``paper_arm``; a suite, which runs its own paper arm, turns this
    off), so the summary compares the two paired over seeds."""
    from raysent.tracking import end_runs_of, ensure_experiment, redact, reopen_run, start_run, tracking_uri
    from raysent.train.ray_train import init_ray

    say = _say(quiet)
    if not final_only and cfg.search is None:
        raise RaysentError(f"{source}: `raysent tune` needs a 'search' part (space, metric, num_samples, ...); "
                           "use `raysent train` for one configuration, or --final-only to run the seeds only")
    sp = cfg.resources.storage_path
    if sp and "://" not in sp:  # trials run in their own folders (and on other nodes): an absolute path
        cfg = with_overrides(cfg, {"resources.storage_path": str(Path(sp).expanduser().resolve())})
    exp = experiment_dir(cfg)
    state = _load_state(exp) if resume else {}
    if resume and not state:
        raise RaysentError(f"--resume: no search to resume in {exp} (no {STATE_FILE}); run without --resume")
    from raysent.preflight import check_resources, preflight

    if resume:
        from raysent.train.records import check_records

        check_records(exp, BROKEN_RECORD_FIX.format(source=source))  # every record read before anything runs
    trains = state.get("phase") not in ("publish", "done")  # a resumed search may have only its outcome to log
    remote = bool(cfg.resources.address or os.environ.get("RAY_ADDRESS"))
    # model, data, batch, results folder, MLflow store, Ray address, and (a local Ray) resources: before Ray
    # starts and before anything is written (exit 2)
    preflight(cfg, resources=not remote, mlflow=True)
    uri = tracking_uri(cfg)
    exp_id = ensure_experiment(cfg)
    if exp_id is not None:
        from raysent.tune.publish import check_publishing

        check_publishing(cfg, exp_id)  # the artifact store and the model registry: before Ray starts (exit 2)
    exp.mkdir(parents=True, exist_ok=True)
    if trains or remote:  # a cluster is joined to publish too: a final model may be on another node's disk
        init_ray(cfg)
        check_resources(cfg)  # against the Ray this search runs on
    if resume and (restored := restore_records(cfg, exp, state["run"])):
        say(f"--resume: {restored} run record(s) written again from the results Tune kept")
    if not state:
        state = {"run": datetime.now().strftime("%Y%m%d-%H%M%S"), "phase": "final" if final_only else "search",
                 "config": cfg.to_dict(), "source": source}
        if exp_id is not None:
            state["parent_run_id"] = start_run(uri, exp_id, f"{'final' if final_only else 'search'}-{state['run']}",
                                               {"method": cfg.method, "model": cfg.model.name,
                                                "phase": "final" if final_only else "search"})
        _save_state(exp, state)
    elif exp_id is not None and state.get("parent_run_id"):
        reopen_run(uri, state["parent_run_id"])  # --resume: the search's run is running again
    mlflow = {"uri": uri, "experiment_id": exp_id, "parent": state.get("parent_run_id")} if exp_id else None
    say(f"experiment {exp.name}: results in {exp}" + (f", MLflow {redact(uri)}" if mlflow else ""))
    started = time.time()
    status = "FAILED"
    server = None
    try:
        if mlflow and trains:  # trials on other nodes reach the store through a server on this one
            server = serve_store(cfg, exp, uri, say)
            mlflow["uri"] = server.url if server else uri
            from raysent.tune.mlflow_server import check_reach

            check_reach(mlflow["uri"], "tracking.mlflow_uri")
        if state["phase"] == "search":
            best = run_search(cfg, exp, state, mlflow, resume, say)
            state.update(phase="final", best=best)
            _save_state(exp, state)
        if state["phase"] == "final" and not search_only:
            best = state.setdefault("best", {"hp": {}, "config_id": config_id({}), "dev_mean": None})  # --final-only
            final = run_final(cfg, exp, state, best, mlflow, resume, say)
            paper = warm_point(cfg) if paper_arm and not final_only else None
            again = paper is not None and config_id(paper) != best["config_id"]
            state.update(phase="paper" if again else "publish", final=final)
            _save_state(exp, state)
        if state["phase"] == "paper":  # search.warm_start: the paper's setting on the same seeds, to compare
            paper = warm_point(cfg) or {}
            state["warm_source"] = warm_source(cfg)  # "paper", or "file" when the file set its own values
            state["paper"] = run_final(cfg, exp, state, {"hp": paper, "config_id": config_id(paper)}, mlflow, resume,
                                       say, arm="paper")
            state.update(phase="publish", vs_paper=versus_paper(exp, state["run"], config_id(paper),
                                                                state["best"]["config_id"]))
            _save_state(exp, state)
        status = "FINISHED"
    except (Interrupted, KeyboardInterrupt):
        status = "KILLED"  # resumable: --resume sets it running again
        raise
    finally:
        if mlflow and state.get("parent_run_id"):
            # the search's run, and any run of it still open (a trial killed with the search), end with it
            end_runs_of(uri, exp_id, state["parent_run_id"], status)
        if server is not None:
            server.stop()
            say(f"MLflow: stopped the tracking server at {server.url}")
        if mlflow:
            mlflow["uri"] = uri  # the store itself, for what the driver logs after the search
    summary = {"experiment": exp.name, "results": str(exp), "search": state["run"], "best": state.get("best"),
               "final": state.get("final"), "paper": state.get("paper"), "vs_paper": state.get("vs_paper"),
               "warm_source": state.get("warm_source"),
               "mlflow": redact(uri) if mlflow else None, "wall_seconds": time.time() - started}
    if mlflow:
        summary["mlflow_runs_url"] = runs_view_url(mlflow["experiment_id"])
    write_json_atomic(exp / "summary.json", summary)
    if state["phase"] == "publish":  # the outcome where researchers work: files, model cards, MLflow
        from raysent.tune.publish import PublishError, publish

        try:
            state.update(published=publish(cfg, exp, state, mlflow, say, save=lambda: _save_state(exp, state)),
                         phase="done")
        except PublishError as exc:
            summary["publish_error"] = str(exc)  # the search stays at this step: --resume publishes again
        _save_state(exp, state)
        summary["published"] = state.get("published")
        write_json_atomic(exp / "summary.json", summary)
    return summary


def serve_store(cfg: ExperimentConfig, exp: Path, uri: str, say):
    """A :class:`~raysent.tune.mlflow_server.TrackingServer` over the local store when the search runs on
    more than one node (:func:`~raysent.tune.mlflow_server.wanted`), else None."""
    from raysent.tracking import redact
    from raysent.tune import mlflow_server

    if not mlflow_server.wanted(cfg, uri):
        return None
    host = mlflow_server.driver_address()
    server = mlflow_server.TrackingServer(uri, Path(cfg.tracking.results_dir).resolve() / "mlartifacts", host,
                                          cfg.tracking.server_port, exp / "mlflow-server.log")
    say(f"MLflow: the search runs on {len(mlflow_server.alive_nodes())} node(s) and its store is a file here: serving "
        f"{redact(uri)} to the trials at {server.url} (listening on {host} only, until the search ends)")
    return server.start()


MLFLOW_UI = "http://127.0.0.1:5000"  # where `mlflow ui` serves by default


def runs_view_url(experiment_id: str, base: str = MLFLOW_UI) -> str:
    """The experiment's runs table in the MLflow UI (MLflow 3 opens an experiment on its GenAI overview)."""
    return f"{base}/#/experiments/{experiment_id}/runs"


class DefineByRun:
    """Optuna's define-by-run space (a picklable callable: Tune checkpoints the searcher)."""

    def __init__(self, space):
        self.space = space

    def __call__(self, trial) -> None:
        suggest(trial, self.space)


def _searcher(cfg: ExperimentConfig, exp: Path, run: str, metric: str):
    from ray import tune

    s = cfg.search
    apart = s.seeds > 1 and not seeds_in_one_trial(cfg)  # a trial per (configuration, seed)
    if s.algorithm == "grid":
        return None, {"hp": tune.grid_search(search_grid(cfg)),
                      **({"seed_index": tune.grid_search(list(range(s.seeds)))} if apart else {})}
    import optuna
    from ray.tune.search.optuna import OptunaSearch

    sampler = (optuna.samplers.TPESampler(seed=s.seed) if s.algorithm == "optuna"
               else optuna.samplers.RandomSampler(seed=s.seed))
    storage = optuna.storages.RDBStorage(f"sqlite:///{exp / 'optuna.db'}")
    first = warm_point(cfg)
    searcher = OptunaSearch(space=DefineByRun(s.space), sampler=sampler,
                            study_name=f"search-{run}", storage=storage, metric=metric, mode=s.mode,
                            points_to_evaluate=[encode(first, s.space)] if first is not None else None)
    if apart:
        from ray.tune.search import Repeater

        searcher = Repeater(searcher, repeat=s.seeds, set_index=True)
    return searcher, None


def run_search(cfg: ExperimentConfig, exp: Path, state: dict, mlflow: dict | None, resume: bool, say) -> dict:
    from ray import tune
    from ray.tune import RunConfig, TuneConfig, Tuner

    s = cfg.search
    run = state["run"]
    metric = tune_metric(cfg)
    ctx = TrialContext(config=cfg.to_dict(), source=state.get("source", "<config>"), phase="search", run=run,
                       exp_dir=str(exp), metric=metric, mlflow=_mlflow_target(mlflow), env=_env(),
                       driver_node=this_node())
    trainable = _trainable(cfg, ctx)
    searcher, param_space = _searcher(cfg, exp, run, metric)
    scheduler, callbacks = None, []
    if s.scheduler is not None:
        from ray.tune.schedulers import ASHAScheduler

        from raysent.tune.stopped import StoppedTrials

        callbacks.append(StoppedTrials(ctx))  # the trials ASHA stops get a record too

        scheduler = ASHAScheduler(time_attr="training_iteration", metric=metric, mode=s.mode,
                                  grace_period=s.scheduler.grace_period, reduction_factor=s.scheduler.reduction_factor,
                                  max_t=s.scheduler.max_t or 10**6)
    from raysent.tune.failfast import FailFast

    fail_fast = FailFast(s.fail_fast)
    callbacks.append(fail_fast)
    storage = tune_storage(cfg, exp)
    path = f"{storage.rstrip('/')}/search-{run}"
    per = 1 if seeds_in_one_trial(cfg) else s.seeds  # Tune trials per configuration
    n = 1 if s.algorithm == "grid" else s.num_samples * per  # Tune's samples (it expands a grid itself)
    total = search_trials(cfg)
    first = warm_point(cfg, say)
    if first is not None:
        say(f"search.warm_start: the paper's setting {first} is tried first")
    say(f"search {run}: {s.algorithm}, {total} trials "
        + (f"(each trains {s.seeds} seeds in turns; the scheduler sees their mean)" if per == 1 < s.seeds
           else f"({s.seeds} seed(s) each)") + f", metric {metric} ({s.mode})")
    if resume and Tuner.can_restore(path):
        tuner = Tuner.restore(path, trainable=trainable, resume_unfinished=True, resume_errored=False,
                              restart_errored=False, param_space=param_space)
    else:
        tuner = Tuner(trainable, param_space=param_space,
                      # metric and mode live in the searcher and the scheduler (a Repeater does not pass
                      # TuneConfig's down to the searcher it wraps)
                      tune_config=TuneConfig(search_alg=searcher, scheduler=scheduler,
                                             num_samples=n, max_concurrent_trials=s.max_concurrent_trials,
                                             reuse_actors=reuse_trial_processes(cfg),
                                             trial_name_creator=TrialNamer(cfg, "search"),
                                             trial_dirname_creator=trial_dirname),
                      run_config=RunConfig(name=f"search-{run}", storage_path=storage, callbacks=callbacks,
                                           stop=fail_fast, failure_config=tune.FailureConfig(max_failures=0)))
    results = tuner.fit()
    _sync_records(results, exp, mlflow)
    if fail_fast.reason is not None:
        kind, message = fail_fast.reason
        raise RaysentError(f"search {run} stopped: its first {s.fail_fast} trials all failed with {kind}: {message}"
                           f" (trial logs under {path}; search.fail_fast sets how many)")
    # Tune creates a grid's trials as it goes: interrupted, the ones not started yet are not in `results`
    _check_complete(results, total, cfg, "search")
    failed = [{"trial_id": r.metrics.get("trial_id") if r.metrics else None, "path": r.path,
               "error": str(r.error).strip().splitlines()[-1][:500]} for r in results if r.error is not None]
    for f in failed:
        say(f"trial failed: {f['error']}")
    return pick_best(cfg, exp, run, mlflow, failed, say)


def _check_complete(results, expected: int, cfg: ExperimentConfig, what: str) -> None:
    """Tune returns normally when interrupted (Ctrl-C), having saved its state: an unfinished trial, or fewer
    trials than the phase has, means the phase did not end and must not be summarised as if it had.

    The records decide, not Tune's counts (Tune counts the trials it ended because of Ctrl-C as terminated): a
    trial finished iff it sent its run record (its last result carries it), failed iff Tune holds its error, was
    stopped by the scheduler iff its record is in ``stopped/``; any other trial was running."""
    stopped_ids = {p.stem.rsplit("-", 1)[-1] for p in (experiment_dir(cfg) / STOPPED_DIR).glob("*.json")}
    finished = failed = stopped = 0
    for r in results:
        metrics = r.metrics or {}
        if metrics.get(RECORD_KEY):
            finished += 1
        elif r.error is not None:
            failed += 1
        elif metrics.get("trial_id") in stopped_ids:
            stopped += 1
    running = len(results) - finished - failed - stopped
    if running or len(results) < expected:
        ended = "".join(f"{n} {how}, " for n, how in ((failed, "failed"), (stopped, "stopped by the scheduler")) if n)
        raise Interrupted(f"{what} of {cfg.name} interrupted after {finished} of {expected} trial(s) finished "
                          f"({ended}{running} were running); its state is saved: `raysent tune --resume` with the "
                          "same config continues it (finished trials are kept, unfinished ones go on from their last "
                          "checkpoint)")


def tune_storage(cfg: ExperimentConfig, exp: Path) -> str:
    """Where Tune keeps the experiment state and trial folders: ``resources.storage_path`` (a folder every
    node sees, or s3:// / gs://; needed on a multi-node cluster) under the experiment's name, else
    results/<experiment>/tune on this machine."""
    if cfg.resources.storage_path:
        root = cfg.resources.storage_path
        root = root if "://" in root else str(Path(root).expanduser().resolve())
        return f"{root.rstrip('/')}/{exp.name}"
    return str(exp / "tune")


def _records(exp: Path, phase: str, run: str, folder: str = "runs") -> list[dict]:
    return [read_record(p).model_dump(exclude_unset=True) for p in sorted((exp / folder).glob(f"{phase}-{run}-*.json"))]


def pick_best(cfg: ExperimentConfig, exp: Path, run: str, mlflow: dict | None, failed: list, say) -> dict:
    """Group the search's runs by configuration; the best mean over seeds wins; MLflow child runs."""
    from raysent.tracking import log_configuration

    groups: dict[str, list[dict]] = {}
    for rec in _records(exp, "search", run):
        groups.setdefault(rec["config_id"], []).append(rec)
    if not groups:
        raise RaysentError(f"search {run}: no trial finished ({len(failed)} failed); see the errors above and "
                           f"the trial logs under {exp / 'tune'}")
    sign = 1 if cfg.search.mode == "max" else -1
    table = []
    for cid, recs in groups.items():
        scores = [r["best_dev_spearman"] for r in recs]
        row = {"config_id": cid, "hp": recs[0]["hp"], "seeds": [r["seed"] for r in recs],
               "learned": any(learned(r["method"], r.get("best_step")) is not False for r in recs),
               "dev_mean": float(np.mean(scores)), "dev_std": float(np.std(scores, ddof=1)) if len(scores) > 1 else 0.0,
               "n": len(scores)}
        table.append(row)
        if mlflow:
            log_configuration(mlflow["uri"], mlflow["experiment_id"], with_overrides(cfg, recs[0]["hp"]), "search",
                              recs[0]["hp"], cid, {"best_dev_spearman_mean": row["dev_mean"],
                                                   "best_dev_spearman_std": row["dev_std"]},
                              [r["mlflow_run_id"] for r in recs if r.get("mlflow_run_id")], mlflow["parent"],
                              [r["seed"] for r in recs])
    # on equal scores a configuration that learned wins over one whose every seed kept the untouched encoder
    table.sort(key=lambda r: (-sign * r["dev_mean"], not r["learned"]))
    tied = [r for r in table if r["dev_mean"] == table[0]["dev_mean"]]
    if len(tied) > 1:
        why = ("it learned (best checkpoint after step 0) and the others did not"
               if table[0]["learned"] and not all(r["learned"] for r in tied) else "it was recorded first")
        say(f"{len(tied)} configurations tie at dev {table[0]['dev_mean']:.4f}: {table[0]['config_id']} is taken "
            f"because {why}")
        table[0]["tie"] = {"with": [r["config_id"] for r in tied[1:]], "learned": table[0]["learned"]}
    stopped = [{"trial_id": r["trial_id"], "config_id": r["config_id"], "hp": r["hp"], "seed": r["seed"],
                "best_dev_spearman": r["best_dev_spearman"], "at_step": r["stopped"]["at_step"]}
               for r in _records(exp, "search", run, STOPPED_DIR)]
    if stopped:
        say(f"{len(stopped)} trial(s) stopped early by the scheduler: records in {exp / STOPPED_DIR}")
    records = [r for recs in groups.values() for r in recs]
    best = {**table[0], "configurations": table, "failed": failed, "stopped": stopped, "finished_runs": len(records),
            "not_learned_runs": sum(learned(r["method"], r.get("best_step")) is False for r in records),
            "diverged_runs": sum(bool(r.get("diverged")) for r in records)}
    best_cfg = with_overrides(cfg, best["hp"]).to_dict()
    best_cfg.pop("search", None)
    (exp / "best.yaml").write_text(
        f"# best configuration of search {run} (mean dev {best['dev_mean']:.2f} over {best['n']} seed(s));\n"
        f"# `raysent tune --final-only --config {exp / 'best.yaml'}` re-runs the final phase\n"
        + yaml.safe_dump(best_cfg, sort_keys=False))
    say(f"best configuration {best['config_id']}: {best['hp']}  dev {best['dev_mean']:.2f}"
        + (f" ± {best['dev_std']:.2f}" if best["n"] > 1 else "") + f" ({best['n']} seed(s))")
    return best


def final_scores(recs: list[dict]) -> dict[str, dict]:
    """Every score of the final runs: mean, sample std (n−1; 0 for one run) and n over the runs that have it."""
    scores = {}
    for k in sorted({k for r in recs for k in r["scores"]}):
        vals = [r["scores"][k] for r in recs if k in r["scores"]]
        scores[k] = {"mean": float(np.mean(vals)), "std": float(np.std(vals, ddof=1)) if len(vals) > 1 else 0.0,
                     "n": len(vals)}
    return scores


def run_final(cfg: ExperimentConfig, exp: Path, state: dict, best: dict, mlflow: dict | None, resume: bool,
              say, arm: str = "") -> dict:
    """The final phase: ``best`` on every seed, evaluated on the test sets (``arm`` "paper": the paper's
    configuration, search.warm_start's comparison, in its own Tune run and folders)."""
    from ray import tune
    from ray.tune import RunConfig, TuneConfig, Tuner

    from raysent.tracking import log_configuration

    run = state["run"]
    final_cfg = with_overrides(cfg, best["hp"]) if best["hp"] else cfg
    ctx = TrialContext(config=final_cfg.to_dict(), source=state.get("source", "<config>"), phase="final", run=run,
                       exp_dir=str(exp), metric=tune_metric(cfg), mlflow=_mlflow_target(mlflow), env=_env(),
                       hp=best["hp"], arm=arm, driver_node=this_node())
    trainable = _trainable(cfg, ctx)
    storage, name = tune_storage(cfg, exp), f"final-{arm + '-' if arm else ''}{run}"
    arm_name = {"paper": "the paper's setting", "file": "the file's setting"}[warm_source(cfg)] if arm else ""
    say(f"final phase{' (' + arm_name + ')' if arm else ''}: {best['hp'] or 'the configuration as given'} "
        f"on seeds {cfg.seeds}")
    param_space = {"seed": tune.grid_search(list(cfg.seeds))}
    concurrent = cfg.search.max_concurrent_trials if cfg.search else 1
    if resume and Tuner.can_restore(f"{storage.rstrip('/')}/{name}"):
        tuner = Tuner.restore(f"{storage.rstrip('/')}/{name}", trainable=trainable, resume_errored=False,
                              param_space=param_space)
    else:
        tuner = Tuner(trainable, param_space=param_space,
                      tune_config=TuneConfig(num_samples=1, max_concurrent_trials=concurrent,
                                             reuse_actors=reuse_trial_processes(cfg),
                                             trial_name_creator=TrialNamer(cfg, "final", best["hp"]),
                                             trial_dirname_creator=trial_dirname),
                      run_config=RunConfig(name=name, storage_path=storage,
                                           failure_config=tune.FailureConfig(max_failures=0)))
    results = tuner.fit()
    _sync_records(results, exp, mlflow)
    _check_complete(results, len(cfg.seeds), cfg, "final phase")
    errors = [str(r.error).strip().splitlines()[-1][:500] for r in results if r.error is not None]
    recs = [r for r in _records(exp, "final", run) if r["config_id"] == best["config_id"]]
    if not recs:
        raise RaysentError(f"final phase: no run finished; errors: {errors}")
    scores = final_scores(recs)
    if mlflow:
        flat = {**{f"{k}_mean": v["mean"] for k, v in scores.items()},
                **{f"{k}_std": v["std"] for k, v in scores.items()}}
        log_configuration(mlflow["uri"], mlflow["experiment_id"], final_cfg, "final", best["hp"], best["config_id"],
                          flat, [r["mlflow_run_id"] for r in recs if r.get("mlflow_run_id")], mlflow["parent"],
                          [r["seed"] for r in recs])
    return {"seeds": [r["seed"] for r in recs], "missing_seeds": sorted(set(cfg.seeds) - {r["seed"] for r in recs}),
            "scores": scores, "errors": errors,
            "not_learned_seeds": sorted(r["seed"] for r in recs if learned(r["method"], r.get("best_step")) is False),
            "diverged_seeds": sorted(r["seed"] for r in recs if r.get("diverged")),
            "transductive": any(bool(r.get("transductive")) for r in recs)}


def paper_row(scores: dict, kind: str = "") -> list[str] | None:
    """The row of the papers' STS table (the 7 sets in their order, then Avg; mean ± std over seeds) from the
    final phase's scores (``kind``: "" Spearman, "/pearson" Pearson); None without them."""
    from raysent.report.runs import TASKS

    cells = [scores.get(f"sts/{t}{kind}") for t in TASKS]
    if not any(cells):
        return None
    avg = scores.get("sts/avg") if not kind else None
    vals = [f"{c['mean']:.2f}±{c['std']:.2f}" if c else "—" for c in [*cells, avg]]
    if kind and all(cells):  # no Pearson Avg is recorded: the mean of the sets' means
        vals[-1] = f"{np.mean([c['mean'] for c in cells]):.2f}"
    return vals


def format_summary(summary: dict) -> str:
    wall = summary.get("wall_seconds")
    lines = [f"experiment {summary['experiment']} (search {summary['search']})"
             + (f" in {wall / 60:.1f} min" if wall else "")]
    best = summary.get("best")
    if best and best.get("configurations"):
        lines.append(f"best configuration: {best['hp']}  dev {best['dev_mean']:.2f}"
                     + (f" ± {best['dev_std']:.2f}" if best["n"] > 1 else "") + f" over {best['n']} seed(s)"
                     + ("" if best.get("learned", True) else "  (learned nothing: best at step 0 on every seed)"))
        finished = best.get("finished_runs", sum(c["n"] for c in best["configurations"]))
        counts = [f"{finished} finished", f"{len(best['failed'])} failed",
                  f"{len(best.get('stopped') or [])} stopped early (stopped/)",
                  f"{best.get('not_learned_runs', 0)} learned nothing (best at step 0)",
                  f"{best.get('diverged_runs', 0)} diverged"]
        lines.append(f"search trials: {', '.join(counts)}; configurations: {len(best['configurations'])}")
    final = summary.get("final")
    if final:
        lines.append(f"final phase on seeds {final['seeds']}"
                     + (f" (missing: {final['missing_seeds']})" if final["missing_seeds"] else "")
                     + (" [transductive: trained on the evaluation sets' unlabelled text]"
                        if final.get("transductive") else "")
                     + ": STS, ×100, mean ± std over seeds")
        from raysent.report.runs import TASK_LABELS, TASKS

        paper = summary.get("paper") or {}
        vs = summary.get("vs_paper") or {}
        other = summary.get("warm_source") or "paper"  # the warm-start arm, named for where its values come from

        def marked(label: str, arm: dict) -> str:  # a diverged run's numbers are not a trained model's: said there
            n = len(arm.get("diverged_seeds") or [])
            return f"{label} [DIVERGED {n}/{len(arm['seeds'])}]" if n else label

        arms = [(marked("Spearman", final), final["scores"], "")]
        if paper.get("scores"):
            arms = [(marked("searched", final), final["scores"], ""), (marked(other, paper), paper["scores"], "")]
        rows = {label: row for label, scores, kind in arms if (row := paper_row(scores, kind))}
        if vs.get("tasks") and rows:
            rows["Δ"] = [f"{d['diff_mean']:+.2f}" if (d := vs["tasks"].get(c)) and d.get("diff_mean") is not None
                         else "—" for c in (*TASKS, "avg")]
        if (pearson := paper_row(final["scores"], "/pearson")) and rows:
            rows["Pearson"] = pearson
        if rows:
            heads = [*(TASK_LABELS[t] for t in TASKS), "Avg"]
            width = [max(len(h), *(len(r[i]) for r in rows.values())) for i, h in enumerate(heads)]
            lw = max(8, *(len(label) for label in rows))
            lines.append(f"  {'':{lw}s}  " + "  ".join(h.rjust(w) for h, w in zip(heads, width)))
            lines += [f"  {label:{lw}s}  " + "  ".join(v.rjust(w) for v, w in zip(row, width))
                      for label, row in rows.items()]
        shown = {f"sts/{t}{kind}" for t in (*TASKS, "avg") for kind in ("", "/pearson")} if rows else set()
        avg = (vs.get("tasks") or {}).get("avg")
        if avg and avg.get("diff_mean") is not None:
            p_t = "—" if avg.get("t_p") is None else f"{avg['t_p']:.3g}"
            p_w = "—" if avg.get("wilcoxon_p") is None else f"{avg['wilcoxon_p']:.3g}"
            lines.append(f"  searched − {other} ({vs['searched']} − {vs['paper']}), Avg: {avg['diff_mean']:+.2f}"
                         + (f" ± {avg['diff_std']:.2f}" if avg.get("diff_std") is not None else "")
                         + f" over {avg['n']} paired seeds; paired t-test p {p_t}, Wilcoxon p {p_w}")
        for k, v in final["scores"].items():
            if k not in shown:
                lines.append(f"  {k:28s} {v['mean']:6.2f} ± {v['std']:.2f} (n={v['n']})")
        flat = final.get("not_learned_seeds") or []
        if flat:
            lines.append(f"NO LEARNING on seed(s) {flat}: the best checkpoint is step 0, the untouched input model; "
                         f"those scores are the input model's, not the method's")
        if final.get("diverged_seeds"):
            lines.append(f"DIVERGED on seed(s) {final['diverged_seeds']}: the last dev score is NaN or more than 10 "
                         "points below the start; the lr (or temperature) is too high for this model")
    published = summary.get("published") or {}
    lines.append(f"results: {summary['results']} (runs/, best.yaml, summary.json"
                 + (", summary.md, summary.csv" if published.get("files") else "") + ")")
    if published.get("best_model_dir"):
        lines.append(f"best model: {published['best_model_dir']} (a sentence-transformers model; README.md is its "
                     "model card)")
    if summary.get("mlflow"):
        lines.append(f"MLflow: {summary['mlflow']}  (mlflow ui --backend-store-uri {summary['mlflow']} --host "
                     f"127.0.0.1, then open {summary.get('mlflow_runs_url') or MLFLOW_UI})")
    if published.get("registered"):
        reg = published["registered"]
        lines.append(f"registered: {reg['uri']} (mlflow.sentence_transformers.load_model('{reg['uri']}'))")
    return "\n".join(lines)
