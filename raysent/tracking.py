"""MLflow tracking: one experiment per YAML, a run per search (parent), per configuration (child)
and per seed (grandchild); params under the project's hyperparameter names.

The store defaults to sqlite under the results folder (``sqlite:///results/mlflow.db``: MLflow's
own default kind; its plain file store is deprecated), or ``tracking.mlflow_uri``, or
``MLFLOW_TRACKING_URI``. The database and the experiment are created by the driver before any
trial starts (two trials creating a new sqlite store at once race in its migrations). Runs are
written through ``MlflowClient`` (no global "active run" state shared between trials), and only at
the end of a run, so a tracking server that is down never stops training: the run's JSON under
results/ is written first and MLflow errors are reported as warnings.

URIs are printed with any password removed.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from pathlib import Path
from typing import Any

from raysent.config import ExperimentConfig, hyperparameters

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


def ensure_experiment(cfg: ExperimentConfig) -> str | None:
    """Create the store and the experiment (driver side); its id, or None when tracking is off."""
    if not cfg.tracking.enabled:
        return None
    uri = tracking_uri(cfg)
    if uri.startswith("sqlite:///"):
        Path(uri[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
    c = client(uri)
    exp = c.get_experiment_by_name(experiment_name(cfg))
    if exp is not None:
        return exp.experiment_id
    return c.create_experiment(experiment_name(cfg))


def _tags(cfg: ExperimentConfig, phase: str, extra: dict | None = None) -> dict:
    return {"method": cfg.method, "model": cfg.model.name, "phase": phase, "train_data": str(cfg.data.train),
            **{k: str(v) for k, v in (extra or {}).items()}}


def start_run(uri: str, experiment_id: str, name: str, tags: dict, parent: str | None = None) -> str:
    tags = dict(tags)
    if parent:
        tags[PARENT_TAG] = parent
    return client(uri).create_run(experiment_id, run_name=name, tags=tags).info.run_id


def end_run(uri: str, run_id: str, status: str = "FINISHED") -> None:
    client(uri).set_terminated(run_id, status=status)


def _params(values: dict) -> list:
    from mlflow.entities import Param

    def text(v: Any) -> str:
        return (json.dumps(v) if isinstance(v, (list, dict, tuple)) else str(v))[:6000]  # MLflow's limit

    return [Param(k, text(v)) for k, v in sorted(values.items())]


def log_training_run(uri: str, experiment_id: str, cfg: ExperimentConfig, record: dict,
                     parent: str | None, status: str = "FINISHED", tags: dict | None = None) -> str | None:
    """One seed's run: params, the dev curve per evaluation step, test scores, config and result
    (``status`` ``KILLED`` and ``tags`` for a trial the scheduler stopped)."""
    from mlflow.entities import Metric

    try:
        c = client(uri)
        transductive = record.get("transductive")
        run_id = start_run(uri, experiment_id, f"{record['phase']}-{record['config_id']}-seed{record['seed']}",
                           _tags(cfg, record["phase"], {"seed": record["seed"], "config_id": record["config_id"],
                                                        "trial_id": record.get("trial_id", ""),
                                                        "transductive": "unknown" if transductive is None
                                                        else str(bool(transductive)).lower(), **(tags or {})}),
                           parent)
        now = int(record.get("finished_at", 0) * 1000)
        metrics = []
        for point in record.get("dev_curve", []):
            for k, v in point.items():
                if k != "step" and isinstance(v, (int, float)):
                    metrics.append(Metric(_key(k), float(v), now, int(point["step"])))
        for k, v in record.get("scores", {}).items():
            metrics.append(Metric(_key(k), float(v), now, 0))
        for k in ("best_dev_spearman", "train_seconds", "sentences_per_second"):
            if isinstance(record.get(k), (int, float)):
                metrics.append(Metric(k, float(record[k]), now, 0))
        c.log_batch(run_id, metrics=metrics, params=_params({**hyperparameters(cfg), "seed": record["seed"]}))
        c.log_text(run_id, cfg.to_yaml(), "config.yaml")
        c.log_dict(run_id, record, "result.json")
        c.set_terminated(run_id, status=status)
        return run_id
    except Exception as exc:
        warnings.warn(f"MLflow ({redact(uri)}) did not record the run: {exc}; its JSON is in results/", stacklevel=2)
        return None


def _key(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_\-. /]", "_", name)


def log_configuration(uri: str, experiment_id: str, cfg: ExperimentConfig, phase: str, hp: dict, cid: str,
                      scores: dict, seed_runs: list[str], parent: str | None) -> str | None:
    """The child run of one configuration: its params, its mean scores; its seeds' runs below it."""
    from mlflow.entities import Metric

    try:
        c = client(uri)
        run_id = start_run(uri, experiment_id, f"{phase}-{cid}", _tags(cfg, phase, {"config_id": cid}), parent)
        c.log_batch(run_id, metrics=[Metric(_key(k), float(v), 0, 0) for k, v in scores.items()],
                    params=_params({**hyperparameters(cfg), **{f"searched.{k}": v for k, v in hp.items()}}))
        for seed_run in seed_runs:
            c.set_tag(seed_run, PARENT_TAG, run_id)
        c.set_terminated(run_id)
        return run_id
    except Exception as exc:
        warnings.warn(f"MLflow ({redact(uri)}) did not record configuration {cid}: {exc}", stacklevel=2)
        return None


def log_text(uri: str, run_id: str, text: str, name: str) -> None:
    try:
        client(uri).log_text(run_id, text, name)
    except Exception as exc:
        warnings.warn(f"MLflow ({redact(uri)}): could not store {name}: {exc}", stacklevel=2)


def metric_history(uri: str, run_id: str, key: str) -> list[Any]:
    return client(uri).get_metric_history(run_id, key)
