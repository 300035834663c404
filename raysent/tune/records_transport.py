"""Run records between the trials and the driver.

A finished trial writes its run record where it runs and sends it in its last result to Tune (a
:class:`~raysent.tune.protocol.TrialResult`: one record, or one per seed for a trial that trains all its
configuration's seeds). On a cluster the trial may run on
another node, whose disk the driver cannot read: the driver writes every record it was sent and does not have
(:func:`write_sent_records`), with the run's MLflow files the trial could not write (the artifact folder is on the
driver). ``--resume`` writes again the records Tune holds a finished result of and that are missing from runs/
(deleted because they were broken; :func:`restore_records`). What the trials sent also decides whether a phase
ended (:func:`check_complete`).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from raysent.config import ExperimentConfig
from raysent.errors import Interrupted
from raysent.tracking import log_record_artifacts, redact
from raysent.train.records import RunRecord
from raysent.tune.storage import experiment_dir, tune_storage
from raysent.tune.protocol import STOPPED_DIR, MlflowTarget, TrialResult

if TYPE_CHECKING:
    from ray.tune import Result, ResultGrid

# Lazy imports: ray (heavy, and only the functions that need them import them).


def sent_records(metrics: Mapping[str, Any]) -> list[RunRecord]:
    """The run records one trial sent in its last result (none: it did not finish)."""
    return TrialResult.from_tune(metrics).records or []


def write_sent_records(last_results: Iterable[Mapping[str, Any]], exp: Path, mlflow: MlflowTarget | None = None) -> int:
    """Write the run records that trials sent in their last result and that are not on this machine's disk: those
    of trials on other nodes, and any record deleted since (a broken one). A record from another node also brings
    its run's MLflow files (config.yaml, result.json), which its trial could not write. Returns how many it
    wrote."""
    written = 0
    for metrics in last_results:
        for rec in sent_records(metrics):
            path = exp / "runs" / rec.filename
            if not path.is_file():
                rec.to_disk(path)
                written += 1
                if mlflow and rec.mlflow_run_id:
                    log_sent_files(mlflow.uri, rec)
    return written


def log_sent_files(uri: str, rec: RunRecord) -> None:
    """The MLflow files (config.yaml, result.json) of a run whose trial sent its record from another node."""
    try:
        log_record_artifacts(uri, str(rec.mlflow_run_id), yaml.safe_dump(rec.config, sort_keys=False), rec)
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


def results_of(grid: ResultGrid) -> list[Result]:
    """Tune's results of a phase as a list (a ``ResultGrid`` is indexed, not typed as iterable)."""
    return [grid[i] for i in range(len(grid))]


def check_complete(results: Sequence[Result], expected: int, cfg: ExperimentConfig, what: str) -> None:
    """Tune returns normally when interrupted (Ctrl-C), having saved its state: an unfinished trial, or fewer
    trials than the phase has, means the phase did not end and must not be summarised as if it had.

    ``results``: Tune's results of the phase (:func:`results_of`). The records decide, not Tune's counts
    (Tune counts the trials it ended because of Ctrl-C as terminated): a trial finished iff it sent its run record
    (its last result carries it), failed iff Tune holds its error, was stopped by the scheduler iff its record is
    in ``stopped/``; any other trial was running."""
    stopped_ids = {p.stem.rsplit("-", 1)[-1] for p in (experiment_dir(cfg) / STOPPED_DIR).glob("*.json")}
    finished = failed = stopped = 0
    for r in results:
        sent = TrialResult.from_tune(r.metrics, read_records=False)
        if sent.sent:
            finished += 1
        elif r.error is not None:
            failed += 1
        elif sent.trial_id in stopped_ids:
            stopped += 1
    running = len(results) - finished - failed - stopped
    if running or len(results) < expected:
        ended = "".join(f"{n} {how}, " for n, how in ((failed, "failed"), (stopped, "stopped by the scheduler")) if n)
        raise Interrupted(f"{what} of {cfg.name} interrupted after {finished} of {expected} trial(s) finished "
                          f"({ended}{running} were running); its state is saved: `raysent tune --resume` with the "
                          "same config continues it (finished trials are kept, unfinished ones go on from their last "
                          "checkpoint)")
