"""MLflow tracking: one experiment per YAML, a run per search (parent), per configuration (child)
and per seed (grandchild); params under the project's hyperparameter names.

The store defaults to sqlite under the results folder (``sqlite:///results/mlflow.db``: MLflow's
own default kind; its plain file store is deprecated), or ``tracking.mlflow_uri``, or
``MLFLOW_TRACKING_URI``. The database and the experiment are created by the driver before any
trial starts (two trials creating a new sqlite store at once race in its migrations). Runs are
written through ``MlflowClient`` (no global "active run" state shared between trials). A seed's run is
live (:class:`LiveRun`): opened when its trial starts, its evaluations logged as they happen, ended
FINISHED, FAILED or KILLED. A tracking server that is down never stops training: the run's JSON under
results/ is written first and MLflow errors are reported as warnings.

URIs are printed with any password removed.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import time
import uuid
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from raysent.config import ExperimentConfig, hyperparameters
from raysent.train.records import RunIdentity, RunRecord

# Lazy imports: mlflow (heavy, and only the functions that need them import them).

PARENT_TAG = "mlflow.parentRunId"


def tracking_uri(cfg: ExperimentConfig) -> str:
    if cfg.tracking.mlflow_uri:
        return cfg.tracking.mlflow_uri
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    return f"sqlite:///{(Path(cfg.tracking.results_dir).resolve() / 'mlflow.db')}"


def redact(uri: str) -> str:
    """``https://user:secret@host`` -> ``https://user:***@host`` (for anything printed or logged)."""
    return re.sub(r"(://[^/:@]+):[^/@]+@", r"\1:***@", uri)


def experiment_name(cfg: ExperimentConfig) -> str:
    return cfg.tracking.experiment or cfg.name


def client(uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def new_sqlite_store(path: Path, artifacts: Path) -> bool:
    """Make the sqlite store ``path`` as a copy of an empty store made once per MLflow version under
    ``$RAYSENT_CACHE_DIR/mlflow/`` (default ``~/.cache/raysent``), its Default experiment's artifacts in
    ``artifacts/0``; a store another process put at ``path`` first is left as it is. False (and nothing at
    ``path``) when that cannot be done: MLflow then makes the store itself.

    MLflow makes a new store by running its schema migrations, ~60 of them: 3.5 CPU-s and ~4 s in a fresh
    process, 2 CPU-s in one that made a store before; the copy takes 0.002 s (2026-11-29, 2 idle cores). The
    copy holds what MLflow's own new store holds: the schema at MLflow's head revision, the default workspace
    and the Default experiment."""
    import sqlite3

    import mlflow

    from raysent.train.initial_dev import cache_dir

    template = cache_dir() / "mlflow" / f"empty-store-{mlflow.__version__}.db"
    made = template.with_name(f".{template.name}.{uuid.uuid4().hex}")
    copy = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    try:
        if not template.is_file():
            template.parent.mkdir(parents=True, exist_ok=True)
            client(f"sqlite:///{made}").search_experiments()  # MLflow creates and migrates it
            os.replace(made, template)  # whole, or not there: a concurrent maker's copy is as good
        shutil.copyfile(template, copy)
        with contextlib.closing(sqlite3.connect(copy)) as db, db:
            now = int(time.time() * 1000)
            changed = db.execute("UPDATE experiments SET artifact_location = ?, creation_time = ?, "
                                 "last_update_time = ? WHERE experiment_id = 0",
                                 ((artifacts / "0").as_uri(), now, now)).rowcount
        if changed != 1:
            raise sqlite3.DatabaseError(f"{template} has no Default experiment")
        with contextlib.suppress(FileExistsError):  # another search in this folder made one first: theirs
            os.link(copy, path)
        return True
    except Exception:  # any failure: MLflow makes the store itself, as it always could
        return False
    finally:
        for half_made in (made, copy):
            with contextlib.suppress(OSError):
                half_made.unlink(missing_ok=True)


def ensure_experiment(cfg: ExperimentConfig) -> str | None:
    """Create the store and the experiment (driver side); its id, or None when tracking is off."""
    if not cfg.tracking.enabled:
        return None
    uri = tracking_uri(cfg)
    if uri.startswith("sqlite:///"):
        store = Path(uri[len("sqlite:///"):])
        store.parent.mkdir(parents=True, exist_ok=True)
        if not store.exists():
            new_sqlite_store(store, Path(cfg.tracking.results_dir).resolve() / "mlartifacts")
    c = client(uri)
    exp = c.get_experiment_by_name(experiment_name(cfg))
    if exp is not None:
        return exp.experiment_id
    # a local store keeps its artifacts beside it under results/, not in ./mlruns of whatever folder the
    # command ran in; a tracking server decides for itself
    local = uri.startswith("sqlite:///") or uri.startswith("file:") or "://" not in uri
    artifacts = (Path(cfg.tracking.results_dir).resolve() / "mlartifacts").as_uri() if local else None
    return c.create_experiment(experiment_name(cfg), artifact_location=artifacts)


def _tags(cfg: ExperimentConfig, phase: str, extra: dict | None = None) -> dict:
    return {"method": cfg.method, "model": cfg.model.name, "phase": phase, "train_data": str(cfg.data.train),
            **{k: str(v) for k, v in (extra or {}).items()}}


def start_run(uri: str, experiment_id: str, name: str, tags: dict, parent: str | None = None) -> str:
    tags = dict(tags)
    if parent:
        tags[PARENT_TAG] = parent
    return client(uri).create_run(experiment_id, run_name=name, tags=tags).info.run_id


def reopen_run(uri: str, run_id: str) -> None:
    """A resumed search's run is RUNNING again (it ended KILLED when the search was interrupted)."""
    try:
        client(uri).update_run(run_id, status="RUNNING")
    except Exception as exc:
        warnings.warn(f"MLflow ({redact(uri)}): could not reopen run {run_id}: {exc}", stacklevel=2)


def end_runs_of(uri: str, experiment_id: str, parent: str, status: str) -> None:
    """End ``parent`` with ``status`` (FINISHED, FAILED, KILLED), and every run below it still RUNNING (a
    trial ended with its search) with the same status, FINISHED excepted: an open run of a finished search
    did not finish."""
    try:
        c = client(uri)
        todo, below = [parent], []
        while todo:
            runs = c.search_runs([experiment_id], f"tags.`{PARENT_TAG}` = '{todo.pop()}'", max_results=5000)
            below += [r for r in runs if r.info.status == "RUNNING"]
            todo += [r.info.run_id for r in runs]
        for r in below:
            c.set_terminated(r.info.run_id, status="KILLED" if status == "FINISHED" else status)
        c.set_terminated(parent, status=status)
    except Exception as exc:
        warnings.warn(f"MLflow ({redact(uri)}): could not end run {parent} as {status}: {exc}", stacklevel=2)


def _params(values: dict) -> list:
    from mlflow.entities import Param

    def text(v: Any) -> str:
        return (json.dumps(v) if isinstance(v, (list, dict, tuple)) else str(v))[:6000]  # MLflow's limit

    return [Param(k, text(v)) for k, v in sorted(values.items())]


def _flag(v: bool | None) -> str:
    return "unknown" if v is None else str(bool(v)).lower()


def run_tags(cfg: ExperimentConfig, run: RunIdentity | RunRecord, extra: dict | None = None) -> dict:
    """The tags of one seed's run: what it is (method, model, phase, seed, configuration, trial) and, once it has
    a record, what came of it (``learned``, ``diverged``, ``transductive``: true, false or unknown)."""
    outcome = ({"transductive": _flag(run.transductive), "learned": _flag(run.learned),
                "diverged": _flag(run.diverged)} if isinstance(run, RunRecord) else {"transductive": "unknown"})
    return _tags(cfg, run.phase, {"seed": run.seed, "config_id": run.config_id, "trial_id": run.trial_id or "",
                                  **outcome, **(extra or {})})


def config_run_name(phase: str, hp: dict) -> str:
    """A configuration's run, named by what differs: ``search: lr=1e-05 temperature=0.05`` (its hash is a tag)."""
    text = " ".join(f"{k.split('.')[-1]}={_short(v)}" for k, v in sorted(hp.items()))
    return f"{phase}: {text or 'defaults'}"


def run_name(phase: str, hp: dict, seed: int) -> str:
    """One seed's run: its configuration's name and the seed, ``search: lr=1e-05 · seed 1``."""
    return f"{config_run_name(phase, hp)} · seed {seed}"


def _short(v: Any) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)


class LiveRun:
    """One seed's MLflow run, open while it trains: params and tags when it starts, the dev scores and the
    training loss at every evaluation as they happen, the test scores, config and record when it ends, and
    FINISHED, FAILED or KILLED as its status. MLflow errors become warnings: training never waits on them."""

    def __init__(self, uri: str, run_id: str | None):
        self.uri, self.run_id = uri, run_id

    @classmethod
    def open(cls, uri: str, experiment_id: str, cfg: ExperimentConfig, identity: RunIdentity, parent: str | None,
             id_file: Path | None = None) -> LiveRun:
        """Start the run of ``identity``, or continue the one whose id ``id_file`` holds (a trial resumed from its
        checkpoint logs into the same run)."""
        try:
            c = client(uri)
            run_id = id_file.read_text().strip() if id_file is not None and id_file.is_file() else None
            if run_id:
                c.update_run(run_id, status="RUNNING")
                cls._clear_error(c, run_id)
                return cls(uri, run_id)
            run_id = start_run(uri, experiment_id, run_name(identity.phase, identity.hp, identity.seed),
                               run_tags(cfg, identity), parent)
            c.log_batch(run_id, params=_params({**hyperparameters(cfg), "seed": identity.seed}))
            if id_file is not None:
                id_file.parent.mkdir(parents=True, exist_ok=True)
                id_file.write_text(run_id)
            return cls(uri, run_id)
        except Exception as exc:
            warnings.warn(f"MLflow ({redact(uri)}) did not open the run: {exc}; its JSON is in results/",
                          stacklevel=2)
            return cls(uri, None)

    @staticmethod
    def _clear_error(c, run_id: str) -> None:
        """Drop the ``error`` tag of a run that goes on or ends with its record: what :meth:`fail` wrote when the
        trial was cut off (``interrupted``) no longer holds once the trial is resumed; if it fails again, the tag
        is set anew."""
        try:
            if "error" in c.get_run(run_id).data.tags:
                c.delete_tag(run_id, "error")
        except Exception as exc:
            warnings.warn(f"MLflow: run {run_id} keeps its error tag from before it was resumed: {exc}", stacklevel=3)

    def log(self, metrics: dict[str, float], step: int) -> None:
        """One evaluation's numbers (``dev_spearman``, ``dev/<set>``, ``loss``, ...) at its step (its callers log
        the loop's evaluations, not the end-of-run report, which repeats the last one:
        :attr:`raysent.tune.protocol.TrialResult.logged_step`)."""
        if self.run_id is None:
            return
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(_key(k), float(v), now, int(step)) for k, v in metrics.items()
                 if isinstance(v, (int, float)) and not isinstance(v, bool)]
        try:
            client(self.uri).log_batch(self.run_id, metrics=batch)
        except Exception as exc:
            warnings.warn(f"MLflow ({redact(self.uri)}): metrics at step {step} not logged: {exc}", stacklevel=2)

    def finish(self, cfg: ExperimentConfig, record: RunRecord, status: str = "FINISHED", tags: dict | None = None,
               curve: bool = False, artifacts: bool = True) -> str | None:
        """End the run with the record: its scores and summary numbers, its outcome tags, config.yaml and the
        record as result.json (``curve``: also log the dev curve, for a run that was not live)."""
        if self.run_id is None:
            return None
        from mlflow.entities import RunTag

        try:
            c = client(self.uri)
            c.log_batch(self.run_id, metrics=record_metrics(record, curve),
                        tags=[RunTag(k, v) for k, v in run_tags(cfg, record, tags).items()])
            if artifacts:  # else the driver logs them (a trial on another node: the artifact folder is not there)
                log_record_artifacts(self.uri, self.run_id, cfg.to_yaml(), record)
            self._clear_error(c, self.run_id)
            c.set_terminated(self.run_id, status=status)
            return self.run_id
        except Exception as exc:
            warnings.warn(f"MLflow ({redact(self.uri)}) did not record the run's end: {exc}; its JSON is in "
                          "results/", stacklevel=2)
            return self.run_id

    def fail(self, reason: str, status: str = "FAILED") -> None:
        """End the run as FAILED (or KILLED), with the reason as its ``error`` tag; its curve so far stays."""
        if self.run_id is None:
            return
        try:
            c = client(self.uri)
            c.set_tag(self.run_id, "error", reason[:5000])
            c.set_terminated(self.run_id, status=status)
        except Exception as exc:
            warnings.warn(f"MLflow ({redact(self.uri)}): could not end run {self.run_id}: {exc}", stacklevel=2)


def record_metrics(record: RunRecord, curve: bool = False) -> list[Any]:
    """The MLflow metrics of a finished run: its test scores and summary numbers at its end (``curve``: and its
    dev curve, each evaluation at its step)."""
    from mlflow.entities import Metric

    # when the run ended (a record made before finished_at was recorded: now)
    now = int((record.finished_at if record.finished_at is not None else time.time()) * 1000)
    metrics = []
    if curve:
        for point in record.dev_curve:
            metrics += [Metric(_key(k), v, now, point.step) for k, v in point.scores().items()]
    metrics += [Metric(_key(k), float(v), now, 0) for k, v in record.scores.items()]
    summary = {"best_dev_spearman": record.best_dev_spearman, "train_seconds": record.train_seconds,
               "sentences_per_second": record.sentences_per_second}
    metrics += [Metric(k, float(v), now, 0) for k, v in summary.items() if v is not None]
    return metrics


def log_record_artifacts(uri: str, run_id: str, config_yaml: str, record: RunRecord) -> None:
    """A seed's run's files: the resolved config.yaml and the record as result.json."""
    c = client(uri)
    c.log_text(run_id, config_yaml, "config.yaml")
    c.log_dict(run_id, record.to_json(), "result.json")


def log_training_run(uri: str, experiment_id: str, cfg: ExperimentConfig, record: RunRecord,
                     parent: str | None, status: str = "FINISHED", tags: dict | None = None) -> str | None:
    """One seed's run written at once, after it ended (a stopped trial whose live run is not known here):
    params, the dev curve per evaluation step, test scores, config and result."""
    return LiveRun.open(uri, experiment_id, cfg, record.identity, parent).finish(cfg, record, status, tags,
                                                                                 curve=True)


def _key(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_\-. /]", "_", name)


def log_configuration(uri: str, experiment_id: str, cfg: ExperimentConfig, phase: str, hp: dict, cid: str,
                      scores: dict, seed_runs: list[str], parent: str | None, seeds: list[int]) -> str | None:
    """The child run of one configuration: its params (``seeds``, the seeds its scores average, in place of
    one seed), its mean scores; its seeds' runs below it."""
    from mlflow.entities import Metric

    try:
        c = client(uri)
        run_id = start_run(uri, experiment_id, config_run_name(phase, hp), _tags(cfg, phase, {"config_id": cid}),
                           parent)
        c.log_batch(run_id, metrics=[Metric(_key(k), float(v), 0, 0) for k, v in scores.items()],
                    params=_params({**{k: v for k, v in hyperparameters(cfg).items() if k != "seed"},
                                    "seeds": sorted(seeds), **{f"searched.{k}": v for k, v in hp.items()}}))
        for seed_run in seed_runs:
            c.set_tag(seed_run, PARENT_TAG, run_id)
        c.set_terminated(run_id)
        return run_id
    except Exception as exc:
        warnings.warn(f"MLflow ({redact(uri)}) did not record configuration {cid}: {exc}", stacklevel=2)
        return None


@contextmanager
def fluent(uri: str):
    """MLflow's fluent API (``mlflow.start_run``, a flavour's ``log_model``) at ``uri`` inside the block, and the
    process as it was after it: ``mlflow.set_tracking_uri`` also sets ``MLFLOW_TRACKING_URI``, which the next
    search in this process (a notebook's second experiment) would otherwise read as its store."""
    import mlflow

    before = os.environ.get("MLFLOW_TRACKING_URI")
    mlflow.set_tracking_uri(uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(None)  # type: ignore[arg-type]  # None unsets it (MLflow's code; its hint omits None)
        if before is not None:
            os.environ["MLFLOW_TRACKING_URI"] = before


def log_text(uri: str, run_id: str, text: str, name: str) -> None:
    try:
        client(uri).log_text(run_id, text, name)
    except Exception as exc:
        warnings.warn(f"MLflow ({redact(uri)}): could not store {name}: {exc}", stacklevel=2)


def log_budget(uri: str, run_id: str, metrics: dict[str, float], curve: list[float], markdown: str) -> bool:
    """A search's budget curve on its parent run (:mod:`raysent.report.budget`): ``metrics``
    (``budget/expected_best_at_{n}``, ...), the curve again as ``budget/expected_best`` at step n (MLflow's chart)
    and ``budget.md``; once per run (a resumed search does not log it twice). False when MLflow did not take it
    (a warning says why: the search's results do not depend on it)."""
    from mlflow.entities import Metric

    try:
        c = client(uri)
        if "budget/configurations" in c.get_run(run_id).data.metrics:
            return True
        now = int(time.time() * 1000)
        c.log_batch(run_id, metrics=[Metric(k, float(v), now, 0) for k, v in metrics.items()]
                    + [Metric("budget/expected_best", float(v), now, n) for n, v in enumerate(curve, 1)])
        c.log_text(run_id, markdown, "budget.md")
        return True
    except Exception as exc:
        warnings.warn(f"MLflow ({redact(uri)}): the budget curve of run {run_id} not logged: {exc}", stacklevel=2)
        return False
