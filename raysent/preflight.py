"""Checks before any training (`raysent train`, `raysent tune`, and their ``--dry-run``).

A search that cannot work should say so once, before Ray starts a trial, not in every trial's traceback:
the model resolves and its config, tokenizer and weights file are there; every data spec a run reads
loads, with its row count; the largest batch the run (or its search space) asks for fits the training
data; the resources one trial asks for exist on this machine or in the Ray cluster; a Ray address answers;
the MLflow store can be written or answers. Every problem found is listed in one :class:`PreflightError`
(exit status 2).
"""

from __future__ import annotations

import os
import socket
import sqlite3
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import urlparse

from raysent.config import ExperimentConfig, with_overrides
from raysent.data import DATASETS, STS_TASKS, load
from raysent.data.datasets import check_scores_vary
from raysent.data.transfer import load_task, task_names
from raysent.errors import RaysentError, advice, set_field
from raysent.io import not_a_folder
from raysent.tracking import redact, tracking_uri

# Lazy imports: torch, raysent's heavier modules (heavy, and only the functions that need them import them).


class PreflightError(RaysentError):
    """What would fail in every trial, found before any trial started."""


def stage_configs(cfg: ExperimentConfig) -> list[ExperimentConfig]:
    """The config of every stage of a run (one for most methods; a later stage's model is the earlier one's
    output, so the first stage's model stands for it)."""
    from raysent.methods.spec import PREVIOUS_STAGE_BEST, get_spec

    stages = get_spec(cfg.method).stages(cfg) or [("", {})]  # one stage: the config as it is
    return [with_overrides(cfg, {k: v for k, v in ov.items() if v != PREVIOUS_STAGE_BEST}) for _, ov in stages]


def batch_sizes(cfg: ExperimentConfig) -> list[int]:
    """Every global batch size a run of ``cfg`` may use: the fixed one, and those its search space can pick."""
    sizes = {cfg.train.batch_size}
    if cfg.search is not None:
        for key, entry in cfg.search.space.items():
            if key.split(".")[-1] == "batch_size":
                sizes.update(int(v) for v in (entry.values or [entry.low, entry.high]) if v is not None)
    return sorted(sizes)


def trial_resources(cfg: ExperimentConfig, cluster_gpus: float | None = None) -> dict[str, float]:
    """What one run (one Tune trial) asks Ray for, in all (``gpus_per_worker: auto`` as on a cluster with
    ``cluster_gpus`` GPUs; 0 when not known)."""
    from raysent.train.resources import gpus_per_worker, run_resources

    return run_resources(cfg, gpus_per_worker(cfg, cluster_gpus) or 0.0)


def connected_ray() -> ModuleType | None:
    """The ray module when this process is connected to a Ray, else None. A process that never imported ray is
    not connected: the checks import none (seconds, for a run that trains in this process)."""
    ray = sys.modules.get("ray")
    return ray if ray is not None and ray.is_initialized() else None


def available_resources() -> tuple[dict[str, float], str]:
    """CPUs and GPUs of the Ray this process is connected to (with the nodes its autoscaler can start), else of this
    machine; and where they were read."""
    from raysent.train.resources import cluster_capacity, this_machine

    found = cluster_capacity()
    return found if found is not None else (this_machine(), "this machine")


def check_resources(cfg: ExperimentConfig, one_run: bool = False) -> dict[str, Any]:
    """Whether one trial's resources exist, where each trial trains and how many run at once; a cluster joined by
    address may grow (autoscaler), so there a shortfall is a note, not an error. Returns what was checked; raises
    on a local shortfall. ``one_run``: `raysent train`, which without ``resources.workers`` trains in its own
    process, without Ray, on the device it sees."""
    from raysent.train.resources import placement

    remote = bool(cfg.resources.address or os.environ.get("RAY_ADDRESS"))
    if remote and connected_ray() is None:
        place = placement(cfg, None, "the Ray cluster")
        return {"per trial": place.per_trial or trial_resources(cfg), "gpus_per_worker": place.gpus(),
                "trains on": place.device,
                "available": "not checked (a Ray cluster is joined only when the run starts)"}
    have, where = available_resources()
    place = placement(cfg, have, where)
    need = place.per_trial or trial_resources(cfg)
    per = {"CPU": "cpus_per_worker", "GPU": "gpus_per_worker"}
    asked = {k: (f"resources.trial_cpus + workers × {per[k]}" if k == "CPU" else f"resources.workers × {per[k]}")
             if cfg.resources.workers else f"resources.{per[k]}" for k in per}
    short = [f"{k} {need[k]:g} ({asked[k]}), {where} has {have[k]:g}" for k in per if need[k] > have[k] + 1e-9]
    if short and not remote:
        raise PreflightError("resources: one trial asks for more than there is: " + "; ".join(short)
                             + ". Lower resources.workers / cpus_per_worker / gpus_per_worker, or join a bigger "
                             "Ray cluster (--address or resources.address)")
    out: dict[str, Any] = {"per trial": need, "available": {**have, "in": where}, "gpus_per_worker": place.gpus(),
                           "trains on": place.device}
    if one_run and not cfg.resources.workers:
        out["trains on"] = (f"{'cuda' if have['GPU'] else 'the CPU'} in this process (without resources.workers "
                            "`raysent train` starts no Ray: it trains on the device it sees)")
    elif place.at_once is not None and not short:
        if place.trials_per_gpu:
            out["trials per GPU"] = place.trials_per_gpu
        out["trials at once"] = f"{place.at_once} ({place.limit})"
    if short:
        out["note"] = ("more than the cluster has now: it waits for the autoscaler to add nodes; "
                       + "; ".join(short))
    return out


def check_data(cfg: ExperimentConfig) -> dict[str, Any]:
    """Every data spec the run reads (the training data of each stage, the dev sets) with its row count;
    the largest batch against the training data."""
    from raysent.methods.spec import get_spec

    rows: dict[str, Any] = {}
    problems: list[str] = []
    for stage in stage_configs(cfg):
        method = get_spec(stage.method)
        spec = stage.data.train
        if spec is None or spec in rows:
            continue
        try:
            n = len(load(spec, method.data_kind(stage.method_params)))
        except RaysentError as exc:
            problems.append(f"data.train: {exc}")
            continue
        used = min(n, stage.data.max_train_samples or n)
        rows[spec] = n if used == n else f"{n} ({used} used: data.max_train_samples)"
        if not getattr(method, "trains", True):
            continue
        big = max(batch_sizes(stage))
        if used < big:
            problems.append(f"data.train {spec!r}: {used} training example(s), fewer than the batch size {big} "
                            f"(train.batch_size or the search space): not one full batch. Lower the batch size "
                            "or train on more data")
        elif stage.resources.workers and big < stage.resources.workers:
            problems.append(f"train.batch_size {big} is split over resources.workers={stage.resources.workers}: "
                            "at least one example per worker is needed")
    for spec in cfg.data.dev:
        if spec in rows:
            continue
        try:
            dev = load(spec, "scored_pairs")
            check_scores_vary(dev, "a dev set (data.dev: the best checkpoint is chosen by its Spearman)")
            rows[spec] = len(dev)
        except RaysentError as exc:
            problems.append(f"data.dev: {exc}")
    for field, spec in test_sets(cfg):
        if spec in rows:
            continue
        try:
            if spec.startswith("senteval:"):
                rows[spec] = len(load_task(spec.removeprefix("senteval:")))
                continue
            test = load(spec, "scored_pairs")
            if field in CORRELATED_TEST_FIELDS:
                check_scores_vary(test, f"a test set ({field}: scored by the correlation of cosines with them)")
            rows[spec] = len(test)
        except RaysentError as exc:
            problems.append(f"{field} (the final phase's test sets): {exc}")
    if problems:
        raise PreflightError("; ".join(problems))
    return rows


# the test sets whose number is a correlation with the gold scores (search and geometry read pairs by their score)
CORRELATED_TEST_FIELDS = ("eval.sts_sets", "eval.sts17_tracks")


def test_sets(cfg: ExperimentConfig) -> list[tuple[str, str]]:
    """(field, data spec) of every set the final phase evaluates on (``eval.tasks``): read before the first trial, so
    a set that cannot be read stops the search before it trains, not after. SentEval tasks are ``senteval:<task>``."""
    e = cfg.eval
    out: list[tuple[str, str]] = []
    if "sts" in e.tasks:
        out += [("eval.sts_sets", s) for s in (e.sts_sets or STS_TASKS)]
    if "sts17" in e.tasks:
        out += [("eval.sts17_tracks", f"sts17:{t}") for t in (e.sts17_tracks or DATASETS["sts17"].local)]
    if "search" in e.tasks:
        out.append(("eval.search_data", e.search_data))
    if "geometry" in e.tasks:
        out.append(("eval.geometry_data", e.geometry_data))
    if "senteval" in e.tasks:
        out += [("eval.senteval_tasks", f"senteval:{t}") for t in (e.senteval_tasks or task_names())]
    return out


def max_lengths(cfg: ExperimentConfig) -> dict[str, int]:
    """Every tokens-per-sentence a run of ``cfg`` may use, by the field that sets it: ``train.max_length``,
    ``eval.max_length`` and, when searched, the largest value its search space can pick."""
    out = {"train.max_length": cfg.train.max_length, "eval.max_length": cfg.eval.max_length}
    for key, entry in (cfg.search.space.items() if cfg.search is not None else ()):
        if key.split(".")[-1] == "max_length":
            values = [int(v) for v in (entry.values or [entry.high]) if v is not None]
            if values:
                out[f"search.space.{key}"] = max(values)
    return out


def check_lengths(cfg: ExperimentConfig, model: dict[str, Any]) -> list[str]:
    """The tokens per sentence a run asks for against the positions of its model (``model``: what
    :func:`raysent.models.encoder.check_model` found): a sentence longer than the position embeddings would
    fail in the middle of training, or be cut where the file said otherwise."""
    limit = model.get("positions")
    if not limit:
        return []
    return [f"{cfg._source}: {field}: got {value}: more than the {limit} token positions of model "
            f"{cfg.model.name!r} ({model.get('path')}); allowed: 2..{limit}"
            for field, value in max_lengths(cfg).items() if value > limit]


def check_writable(path: str | Path, field: str) -> str:
    """Whether results can be written under ``path`` (its nearest existing folder is writable)."""
    p = Path(path).expanduser().resolve()
    why = not_a_folder(p)
    if why:
        raise PreflightError(f"{field}: {p} {why}. Point it at a folder: {set_field(field)}")
    here = p
    while not here.exists() and here != here.parent:
        here = here.parent
    try:
        with tempfile.TemporaryFile(dir=here):
            pass
    except OSError as exc:
        raise PreflightError(f"{field}: {p} cannot be written ({here}: {exc.strerror or exc}). Point it at a "
                             f"writable folder: {set_field(field)}") from None
    return str(p)


def check_address(cfg: ExperimentConfig) -> str:
    """The Ray cluster a run joins answers on its address (one TCP connect, 3 s): a wrong address is one line in
    seconds, not a wait of minutes inside ``ray.init``. ``auto`` and no address are not checked here."""
    address = cfg.resources.address or os.environ.get("RAY_ADDRESS")
    if not address or address in ("auto", "local"):
        return address or "a local Ray, started by the run"
    field = "resources.address" if cfg.resources.address else "RAY_ADDRESS"
    parsed = urlparse(address if "://" in address else f"gcs://{address}")
    if not parsed.hostname or not parsed.port:
        raise PreflightError(f"{field} {address!r}: expected HOST:PORT (the head's GCS port, 6379 by default), "
                             "ray://HOST:10001, or auto")
    try:
        with socket.create_connection((parsed.hostname, parsed.port), timeout=3):
            pass
    except OSError as exc:
        raise PreflightError(f"{field} {address!r}: no Ray answers there ({exc.strerror or exc}). Start the "
                             f"cluster (`ray start --head`, `ray up clusters/gpu.yaml`), fix the address, or leave "
                             f"it out to start a local Ray") from None
    return address


def check_mlflow_store(cfg: ExperimentConfig) -> str:
    """The MLflow tracking store can be written (a local sqlite file or folder) or answers (a server: one try,
    5 s), before Ray starts: MLflow itself retries a read-only store or a server that is down for minutes."""
    if not cfg.tracking.enabled:
        return "off"
    uri = tracking_uri(cfg)
    field = "tracking.mlflow_uri" if cfg.tracking.mlflow_uri else ("MLFLOW_TRACKING_URI" if os.environ.get(
        "MLFLOW_TRACKING_URI") else "tracking.results_dir")
    if uri.startswith("sqlite:///") or uri.startswith("file:") or "://" not in uri:
        path = Path(uri.removeprefix("sqlite:///").removeprefix("file://").removeprefix("file:"))
        folder = path.parent if uri.startswith("sqlite:") else path
        check_writable(folder, field)
        if path.is_file() and not os.access(path, os.W_OK):
            raise PreflightError(f"{field}: the MLflow store {path} cannot be written (read-only). Point "
                                 f"{field} at a writable store ({set_field('tracking.mlflow_uri', 'URI')} or "
                                 f"{set_field('tracking.results_dir')})")
        if uri.startswith("sqlite:"):
            check_sqlite_store(path, field, cfg.tracking.results_dir)
        return redact(uri)
    if uri.startswith(("http://", "https://")):
        try:
            with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=5):
                pass
        except OSError as exc:
            reason = getattr(exc, "reason", None) or exc
            off = advice("--set tracking.enabled=false", 'overrides={"tracking.enabled": False}')
            raise PreflightError(f"{field}: the MLflow tracking server {redact(uri)} does not answer ({reason}). "
                                 f"Start it, fix the URI, or turn tracking off ({off})") from None
    return redact(uri)


# how long sqlite's quick_check may take on a local MLflow store: it reads every page, ~0.12 s for a store of 96 MB
# (400,000 metric values; a warm page cache, 2026-12-03); a bigger store is checked as far as this allows
SQLITE_CHECK_SECONDS = 1.0


def check_sqlite_store(path: Path, field: str, results_dir: str | Path = "results") -> str:
    """A local sqlite MLflow store that exists is a whole sqlite database: opened read-only, ``PRAGMA quick_check``
    (every page read, the b-trees' structure checked, no index compared with its table). A damaged one (a copy cut
    short, a disk that filled) is one error naming it, not SQLAlchemy's traceback ("database disk image is
    malformed") in every trial. None there, or an empty file, is a store MLflow makes; a locked or busy one is left
    to MLflow (it waits for it)."""
    if not path.is_file() or path.stat().st_size == 0:
        return "new"
    deadline = time.perf_counter() + SQLITE_CHECK_SECONDS
    try:
        con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=1.0)
        try:
            con.set_progress_handler(lambda: int(time.perf_counter() > deadline), 10_000)
            found = [str(row[0]) for row in con.execute("PRAGMA quick_check(3)")]
        finally:
            con.close()
    except sqlite3.DatabaseError as exc:
        name = getattr(exc, "sqlite_errorname", "")
        if name == "SQLITE_INTERRUPT":
            return f"checked for {SQLITE_CHECK_SECONDS:g} s (not to its end)"
        if isinstance(exc, sqlite3.OperationalError) and name not in ("SQLITE_CORRUPT", "SQLITE_NOTADB"):
            return f"not checked ({exc})"  # locked, busy: MLflow waits for it
        found = [str(exc)]
    if found == ["ok"]:
        return "ok"
    raise PreflightError(
        f"{field}: the MLflow store {path} is damaged (sqlite: {'; '.join(found)[:300]}), so MLflow cannot log to "
        f"it. Fix: move it aside (`mv {path} {path}.damaged`): the next run makes a new, empty store there. The run "
        f"records ({Path(results_dir) / '<experiment>' / 'runs'}/*.json, which `raysent table` reads) are files of "
        f"their own and unharmed; the MLflow runs logged before are only in the damaged file. Or point {field} at "
        f"another store ({set_field('tracking.mlflow_uri', 'URI')})")


def preflight(cfg: ExperimentConfig, resources: bool = True, output_dir: bool = False,
              mlflow: bool = False) -> dict[str, Any]:
    """Run every check (``output_dir``: also that train.output_dir can be written, for `raysent train`;
    ``mlflow``: that the tracking store can be written, for `raysent tune`); one :class:`PreflightError`
    listing every problem, else what was found."""
    from raysent.models.encoder import check_model

    found: dict[str, Any] = {}
    problems: list[str] = []
    stages = stage_configs(cfg)
    for name in dict.fromkeys(s.model.name for s in stages):
        try:
            found[f"model {name}"] = check_model(name)
        except RaysentError as exc:
            problems.append(str(exc))
            continue
        problems += [p for s in stages if s.model.name == name for p in check_lengths(s, found[f"model {name}"])]
    checks = {"results": lambda c: check_writable(c.tracking.results_dir, "tracking.results_dir"),
              "data": check_data, "ray": check_address,
              "resources": (lambda c: check_resources(c, one_run=output_dir)) if resources else None,
              "mlflow": check_mlflow_store if mlflow else None}
    if output_dir:
        checks["output"] = lambda c: check_writable(c.output_dir(), "train.output_dir")
    for what, check in checks.items():
        if check is None:
            continue
        if what == "output" and "results" not in found and Path(cfg.output_dir()).resolve().is_relative_to(
                Path(cfg.tracking.results_dir).resolve()):
            continue  # inside the results folder that cannot be written: said once, above
        try:
            found[what] = check(cfg)
        except RaysentError as exc:
            problems.append(str(exc))
    problems = list(dict.fromkeys(problems))  # the store beside the results (results/mlflow.db): one line, not two
    if problems:
        raise PreflightError(("checked before any training, and found:\n  - " if len(problems) > 1
                              else "checked before any training: ") + "\n  - ".join(problems))
    return found

