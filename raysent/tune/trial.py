"""One trial of a search or of its final phase, as it runs in the trial's process (:func:`run_trial`).

What it is told (:class:`~raysent.tune.protocol.TrialContext`), the run it resolves to (a configuration and a
seed), the training (in the trial's process, or on Ray Train workers) with its live MLflow run, the final phase's
test evaluation, the record it leaves (:class:`~raysent.train.records.RunRecord`, written here and sent to the
driver in the trial's last result, a :class:`~raysent.tune.protocol.TrialResult`) and the checkpoints it drops.
The driver uses the record helpers too, to record the trials a scheduler stops (:mod:`raysent.tune.stopped`). Ray,
Tune and MLflow are imported inside the functions that run in the trial (the driver imports this module before Ray
starts).
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

from raysent.config import ExperimentConfig, hyperparameters, parse_config, with_overrides
from raysent.errors import RaysentError
from raysent.eval.results import Evaluation
from raysent.eval.suite import evaluate_tasks
from raysent.models.encoder import Encoder
from raysent.tracking import LiveRun, log_training_run, run_name
from raysent.train import compile_cache
from raysent.train.loop import TrainHooks
from raysent.train.memory import release_freed_memory
from raysent.train.ray_train import delete_checkpoints, train_one_with_ray
from raysent.train.records import RunIdentity, RunRecord, TrainSummary, diverged, learned, read_record
from raysent.train.resources import cap_memory, claim_devices
from raysent.train.run import reuse_across_runs, train_in_process, train_stages
from raysent.tune.protocol import STOPPED_DIR, TrialContext, TrialResult, reported
from raysent.tune.reporter import Reporter, TuneReporter
from raysent.tune.space import config_id, decode

# Lazy imports: ray, raysent's heavier modules (heavy, and only the functions that need them import them).


class TuneHooks(TrainHooks):
    """The loop in the trial's own process: checkpoints in the run's folder, metrics to the trial's reporter (Tune,
    or a test's list) and to its live MLflow run (``live``)."""

    def __init__(self, output_dir, resume: bool = False, quiet: bool = False, live: LiveRun | None = None,
                 reporter: Reporter | None = None):
        super().__init__(output_dir, resume=resume, quiet=quiet)
        self.device = claim_devices()  # the GPU Ray gave this trial, else the CPU (whatever torch saw before)
        self.live = live
        self.reporter = reporter or TuneReporter()

    def report(self, metrics: dict, checkpoint_dir) -> None:
        super().report(metrics, checkpoint_dir)
        result = TrialResult.from_loop(metrics)
        if self.live is not None and (step := result.logged_step) is not None:
            self.live.log(result.metrics, step)
        self.reporter.report(result)


def quiet_exit(unraisable) -> None:
    """``sys.unraisablehook`` of a trial's process. Ray ends a trial process with SIGTERM, and its handler raises
    SystemExit wherever the process is; inside a garbage-collection callback Python cannot raise it and prints
    "Exception ignored … SystemExit: 1" (seen at the end of the README's main job). The process is ending as
    Ray asked: that is said nowhere; any other exception is printed as Python prints it."""
    if isinstance(unraisable.exc_value, SystemExit):
        return
    sys.__unraisablehook__(unraisable)


def search_seed(cfg: ExperimentConfig, index: int) -> int:
    """The i-th repeat of a configuration in the search: the i-th of ``seeds``, then train.seed + i, skipping a
    seed already taken (``seeds: [43]`` with train.seed 42 gives 43, 44: never one (configuration, seed) twice)."""
    taken = list(dict.fromkeys(cfg.seeds))
    i = len(taken)
    while len(taken) <= index:
        if cfg.train.seed + i not in taken:
            taken.append(cfg.train.seed + i)
        i += 1
    return taken[index]


def seeds_in_one_trial(cfg: ExperimentConfig) -> bool:
    """Whether a search trial trains all of its configuration's seeds (:mod:`raysent.tune.seeds`): with a
    scheduler and ``search.seeds`` > 1, so the scheduler stops configurations on their seed mean, or with a pruner
    (Wilcoxon over the per-seed scores). Otherwise a trial is one (configuration, seed) and Tune's ``Repeater``
    gives the searcher the mean."""
    s = cfg.search
    return s is not None and s.early_stopping is not None and s.seeds > 1


def search_seeds(cfg: ExperimentConfig) -> list[int]:
    """The seeds every configuration of the search runs on."""
    return [search_seed(cfg, i) for i in range(cfg.search.seeds if cfg.search else 1)]


class TrialNamer:
    """Tune's ``trial_name_creator``: a trial named by what differs (``lr=0.0001 · seed 1``), in Tune's
    console table as in MLflow, instead of ``run_trial_7eddca46``. Its folder keeps Tune's id
    (:func:`trial_dirname`)."""

    def __init__(self, cfg: ExperimentConfig, phase: str, arms: dict[str, dict] | None = None):
        self.space = cfg.search.space if cfg.search else {}
        self.seeds, self.seed, self.phase, self.arms = list(cfg.seeds), cfg.train.seed, phase, dict(arms or {})
        self.together = search_seeds(cfg) if seeds_in_one_trial(cfg) else []

    def __call__(self, trial) -> str:
        config = trial.config
        if self.phase == "search" and self.together:
            name = run_name(self.phase, decode(config, self.space), 0)
            return name.split(": ", 1)[1].rsplit(" · ", 1)[0] + " · seeds " + ",".join(map(str, self.together))
        if self.phase == "search":
            hp = decode(config, self.space)
            index = int(config.get("__trial_index__", config.get("seed_index", 0)))
            seed = self.seeds[index] if index < len(self.seeds) else self.seed + index
        else:
            hp, seed = dict(self.arms.get(str(config.get("arm", "")), {})), int(config.get("seed", 0))
        return run_name(self.phase, hp, seed).split(": ", 1)[1]


def trial_dirname(trial) -> str:
    """Tune's ``trial_dirname_creator``: the trial's id, as before names were readable (file-system safe)."""
    return f"{trial.trainable_name}_{trial.trial_id}"


def resolve_trial(config: dict, ctx: TrialContext, trial_id: str,
                  seed: int | None = None) -> tuple[dict, int, str, ExperimentConfig]:
    """(hyperparameters, seed, config_id, resolved config) of one trial of the phase ``ctx`` describes
    (``seed``: one of the seeds of a trial that trains them all, in its own subfolder)."""
    base = parse_config(ctx.config, source=ctx.source)
    if ctx.phase == "search":
        assert base.search is not None  # a search phase's experiment has one
        hp = decode(config, base.search.space)
        if seed is None:
            seed = search_seed(base, int(config.get("__trial_index__", config.get("seed_index", 0))))
            folder = trial_id
        else:
            folder = f"{trial_id}/seed{seed}"
    else:
        arm = str(config.get("arm", ""))
        hp, seed = dict(ctx.arms[arm]), int(config["seed"])
        folder = f"{arm + '-' if arm else ''}seed{seed}"
    out = Path(ctx.exp_dir) / ctx.phase / ctx.run / folder
    cfg = with_overrides(base, {**hp, "train.seed": seed, "train.output_dir": str(out)})
    return hp, seed, config_id(hp), cfg


# the run record's fields that come from the training summary, under the same names (best_model_dir besides)
_TRAINING_FIELDS = ("transductive", "best_dev_spearman", "best_step", "initial_dev", "dev_curve", "final_step",
                    "train_seconds", "sentences_per_second", "workers", "sources", "device", "precision", "settings",
                    "attention")


def training_fields(summary: TrainSummary) -> dict[str, Any]:
    """The run record's fields that come from the training summary."""
    return {**{k: getattr(summary, k) for k in _TRAINING_FIELDS}, "best_model_dir": summary.best_model_dir}


def trial_identity(ctx: TrialContext, hp: dict, seed: int, trial_id: str) -> RunIdentity:
    """What names one (configuration, seed) before it trains: its MLflow run's name and tags, its record's file."""
    return RunIdentity(phase=ctx.phase, hp=hp, seed=seed, config_id=config_id(hp), trial_id=trial_id)


def build_record(ctx: TrialContext, cfg: ExperimentConfig, hp: dict, seed: int, trial_id: str,
                 **fields: Any) -> RunRecord:
    """The run record of one (configuration, seed) (``fields``: :func:`training_fields` of its summary, or
    what a stopped trial reported; the final phase's evaluation and scores, the times, ``stopped``), with whether
    it learned and whether it diverged."""
    record = RunRecord(
        experiment=ctx.experiment, phase=ctx.phase, search=ctx.run, config_id=config_id(hp), hp=hp, seed=seed,
        trial_id=trial_id, node=this_node(), method=cfg.method, model=cfg.model.name,
        hyperparameters=hyperparameters(cfg), config=cfg.to_dict(), resources=ctx.resources or None, **fields)
    return record.model_copy(update={"learned": learned(record.method, record.best_step),
                                     "diverged": diverged(record.initial_dev, record.dev_curve)})


def record_path(ctx: TrialContext, run: RunRecord | RunIdentity, stopped: bool = False) -> Path:
    """``runs/<the record's file name>``; a stopped trial's in ``stopped/``, with its trial id."""
    filename = run.filename if isinstance(run, RunRecord) else run.filename(ctx.run)
    if stopped:
        return Path(ctx.exp_dir) / STOPPED_DIR / f"{Path(filename).stem}-{run.trial_id}.json"
    return Path(ctx.exp_dir) / "runs" / filename


LIVE_RUN_FILE = "mlflow_run_id"  # in a trial's output folder: the id of its live MLflow run


def open_live_run(ctx: TrialContext, cfg: ExperimentConfig, identity: RunIdentity) -> LiveRun | None:
    """The trial's MLflow run, opened (or, for a trial resumed from its checkpoint, reopened) before it
    trains; None without tracking."""
    m = ctx.mlflow
    if not m:
        return None
    return LiveRun.open(m.uri, m.experiment_id, cfg, identity, m.parent, cfg.output_dir() / LIVE_RUN_FILE)


def this_node() -> str | None:
    """The Ray node this process runs on (None outside Ray)."""
    try:
        import ray

        return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
    except ImportError:
        return None


def on_driver_node(ctx: TrialContext) -> bool:
    """Whether this trial runs on the driver's node, whose disk holds results/ and the MLflow artifact folder."""
    return ctx.driver_node is None or this_node() in (None, ctx.driver_node)


def save_record(path: Path, record: RunRecord, cfg: ExperimentConfig, ctx: TrialContext,
                live: LiveRun | None = None, **mlflow_run) -> RunRecord:
    """Write the run record (atomic), end its MLflow run (``live``, else one written at once;
    ``mlflow_run``: status, tags) and write it again with the run's id: the record is on disk even when
    MLflow fails. Returns the record as written."""
    record.to_disk(path)
    m = ctx.mlflow
    if m:
        run_id = (live.finish(cfg, record, artifacts=on_driver_node(ctx), **mlflow_run) if live is not None else
                  log_training_run(m.uri, m.experiment_id, cfg, record, m.parent, **mlflow_run))
        record = record.model_copy(update={"mlflow_run_id": run_id})
        record.to_disk(path)
    return record


def drop_checkpoints(cfg: ExperimentConfig) -> None:
    """Delete a finished or stopped trial's training checkpoints unless ``search.keep_checkpoints``: only a
    resumed run reads them, and Tune runs such a trial no more; a model plus its optimizer state per trial
    (~1.3 GB for BERT-base) would add up over a search."""
    if not (cfg.search and cfg.search.keep_checkpoints):
        delete_checkpoints(cfg)


# --------------------------------------------------------------------------- the trial
def prepare_process(ctx: TrialContext) -> None:
    """What a trial's process does before its trial: claim the devices Ray gave it and no others (given no GPU,
    it sees none: :func:`~raysent.train.resources.claim_devices`, before anything touches CUDA; given a share of a
    GPU, its memory is capped at that share: :func:`~raysent.train.resources.cap_memory`), hand back the
    memory the trial before it freed (Tune reuses the process, reuse_trial_processes) and keep what the next trial
    can reuse (the model read from disk, the tokenized data: :func:`~raysent.train.run.reuse_across_runs`), end
    quietly when Ray ends it, and take the driver's data folders."""
    device = claim_devices()
    share = (ctx.config.get("resources") or {}).get("gpus_per_worker")
    if isinstance(share, (int, float)):  # the driver resolved auto (a config handed over unresolved: no cap)
        cap_memory(device, float(share))  # a share of a GPU: at most its share of the memory
    release_freed_memory()
    reuse_across_runs()
    sys.unraisablehook = quiet_exit
    for key, value in ctx.env.items():
        if key not in compile_cache.VARS and (key not in os.environ or os.path.exists(value)):
            os.environ[key] = value
    compile_cache.take(ctx.env)  # the search's compiler caches, where this node sees its folder


GATE_VAR = "RAYSENT_TRIAL_GATE"


def wait_at_gate(gate: str | None, poll: float = 0.1) -> None:
    """A trial's start, at a gate (``TrialContext.gate``): it takes the next number (``<gate>/arrived-<k>``, created
    exclusively: the k-th trial to start) and waits while k is above the number in ``<gate>/allow`` (0 when that file
    is missing). A test that allows 1 and sees ``arrived-2`` knows the first trial ended and the second has not
    trained a step: the point to press Ctrl-C, on a fast machine or a slow one. No gate: nothing happens."""
    if not gate:
        return
    folder = Path(gate)
    k = 1
    while True:
        try:
            (folder / f"arrived-{k}").touch(exist_ok=False)
            break
        except FileExistsError:
            k += 1
    while True:
        try:
            allowed = int((folder / "allow").read_text().strip() or 0)
        except (FileNotFoundError, ValueError):
            allowed = 0
        if k <= allowed:
            return
        time.sleep(poll)


def run_trial(config: dict, ctx: TrialContext, reporter: Reporter | None = None) -> None:
    """One (configuration, seed): train, evaluate (final phase: test sets), record, report to Tune (``reporter``;
    a test's: :class:`~raysent.tune.reporter.MemoryReporter`). The record travels in the last result: on a cluster
    this trial may run on another node, whose disk the driver cannot read. A configuration whose seeds train in
    turns has its own trial: :func:`raysent.tune.seeds.run_seeds`."""
    reporter = reporter or TuneReporter()
    prepare_process(ctx)
    wait_at_gate(ctx.gate)
    trial_id = reporter.trial_id
    hp, seed, _, cfg = resolve_trial(config, ctx, trial_id)
    identity = trial_identity(ctx, hp, seed, trial_id)
    done = record_path(ctx, identity)
    # a record written before the search was interrupted (or by an earlier trial of the same configuration and
    # seed): the run is not trained, nor logged, twice
    record = read_record(done) if done.is_file() else train_and_record(cfg, ctx, hp, seed, trial_id, identity,
                                                                        reporter)
    scores = {k: v for k, v in record.scores.items() if isinstance(v, float)}
    reporter.report(TrialResult.done([record], {**reported(record, ctx.metric), **scores}, seed=seed))


# what a run's training depends on, by part of the experiment; a search run and a final run of one configuration
# and seed that agree on all of it train the same steps (the final phase adds its test sets, eval.*)
_TRAINED_BY = ("method", "model", "data", "train", "params")


def trained_in_search(ctx: TrialContext, cfg: ExperimentConfig, hp: dict, seed: int) -> RunRecord | None:
    """Final phase: the search's finished run of this configuration and seed, when it trained as this run would
    (the same method, model, data, training settings and parameters, on as many workers) and its best model is on
    this process's disk; else None. The main job's search trains both arms of its final phase on both seeds
    (search.seeds 2): its final phase then evaluates those four models instead of training them again."""
    if ctx.phase != "final":
        return None
    path = Path(ctx.exp_dir) / "runs" / RunIdentity(phase="search", hp=hp, seed=seed,
                                                    config_id=config_id(hp)).filename(ctx.run)
    if not path.is_file():
        return None
    try:
        searched = read_record(path)
    except RaysentError:  # a broken record: that run is trained again
        return None
    if searched.stopped is not None or not searched.best_model_dir:
        return None
    best = Path(searched.best_model_dir)
    if not (best / "raysent.json").is_file():  # trained on another node, or removed
        return None
    ours, theirs = cfg.to_dict(), searched.config

    def training(c: dict) -> dict:
        train = {k: v for k, v in c.get("train", {}).items() if k != "output_dir"}
        return {**{k: c.get(k) for k in _TRAINED_BY}, "train": train,
                "workers": (c.get("resources") or {}).get("workers")}

    return searched if training(ours) == training(theirs) else None


# a reused best model's files this large (the weights) are hard-linked; smaller ones (the model card, raysent.json,
# the tokenizer's) are copied, so that publishing, which rewrites the final run's card, leaves the search run's alone
_LINKED = 1 << 20


def reuse_search_run(searched: RunRecord, cfg: ExperimentConfig, live: LiveRun | None) -> dict[str, Any]:
    """The record fields (:func:`training_fields`) of a final run whose training the search did: its best model
    linked into this run's folder, its dev curve logged into this run's MLflow run."""
    from raysent.train.loop import link_tree

    best = cfg.output_dir() / "best"
    if best.exists():
        shutil.rmtree(best)
    best.parent.mkdir(parents=True, exist_ok=True)
    link_tree(Path(str(searched.best_model_dir)), best, copy_below=_LINKED)
    if live is not None:
        for point in searched.dev_curve:
            live.log(point.scores(), point.step)
    return {**{k: getattr(searched, k) for k in _TRAINING_FIELDS}, "best_model_dir": str(best),
            "trained_in": searched.filename}


def train_and_record(cfg: ExperimentConfig, ctx: TrialContext, hp: dict, seed: int, trial_id: str,
                     identity: RunIdentity, reporter: Reporter | None = None) -> RunRecord:
    """Train one trial's run with its MLflow run live, evaluate it (final phase), write its record. A final run the
    search trained already (:func:`trained_in_search`) is evaluated, not trained again."""
    started = time.time()
    live = open_live_run(ctx, cfg, identity)
    try:
        searched = trained_in_search(ctx, cfg, hp, seed)
        trained = (reuse_search_run(searched, cfg, live) if searched is not None
                   else training_fields(train_trial(cfg, live, reporter)))
        final: dict[str, Any] = {}
        if ctx.phase == "final":
            evaluation = evaluate_final(cfg, str(trained["best_model_dir"]))
            final.update(eval=evaluation, scores=evaluation.metrics())
    except BaseException as exc:
        if live is not None:
            # KeyboardInterrupt / SystemExit: Ctrl-C, or Tune ending the trial; the search's end decides
            failed = isinstance(exc, Exception)
            live.fail(f"{type(exc).__name__}: {exc}" if failed else "interrupted", "FAILED" if failed else "KILLED")
        raise
    record = build_record(ctx, cfg, hp, seed, trial_id, **trained, **final,
                          wall_seconds=time.time() - started, finished_at=time.time())
    record = save_record(record_path(ctx, record), record, cfg, ctx, live=live)
    drop_checkpoints(cfg)  # before the last report, after which Tune may end this process
    return record


def train_trial(cfg: ExperimentConfig, live: LiveRun | None = None, reporter: Reporter | None = None) -> TrainSummary:
    """Every stage of one trial's run, resumed where a checkpoint exists: on Ray Train workers
    (``resources.workers``; Train's metrics forwarded to Tune by Ray's own callback, and to the live MLflow run) or
    in the trial's own process (its metrics to ``reporter``, else Tune)."""
    if cfg.resources.workers:
        from ray.tune.integration.ray_train import TuneReportCallback

        from raysent.tune.live import MlflowReportCallback

        callbacks = [TuneReportCallback(), *([MlflowReportCallback(live)] if live is not None else [])]
        return train_stages(cfg, lambda c: train_one_with_ray(c, resume=True, quiet=True, callbacks=callbacks),
                            resume=True, log=lambda m: None)
    return train_in_process(cfg, resume=True, quiet=True, hooks=partial(TuneHooks, live=live, reporter=reporter))


def evaluate_final(cfg: ExperimentConfig, model_dir: str) -> Evaluation:
    """The final phase's test evaluation of the saved best model (``eval.tasks``)."""
    e = cfg.eval
    encoder = Encoder.load(model_dir)  # the saved best model, with its inference pooling in raysent.json
    encoder.eval()
    return evaluate_tasks(encoder, e.tasks, pooling=e.pooling or encoder.meta.pooling, max_length=e.max_length,
                          batch_size=e.batch_size,
                          options={t: o for t, o in e.task_options().items() if t in e.tasks})
