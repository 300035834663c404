"""Two schemas. The training summary: what one training run returns, on every path, and writes to its
``result.json``. The run record: what one finished (configuration, seed) of a search leaves in
``results/<experiment>/runs/`` (or ``stopped/`` for a trial the scheduler ended), one schema for the
writer (``raysent tune``) and every reader (tables, comparisons, plots, the suite).

A record file is read with :meth:`RunRecord.from_disk`, which migrates an older version to this one (as
mteb's ``TaskResult.from_disk`` does) and resolves its paths; it is written with :meth:`RunRecord.to_disk`.
On disk, paths are portable: the run's folders (``best_model_dir``, ``config.train.output_dir``) relative to
the experiment's folder, data files as ``$RAYSENT_DATA_DIR/<path>``; in memory, the run's folders are
absolute (where the experiment folder is now). A file with fields no version knows is refused with an error
that names the file and the field. Version history:

* 0 — the fields of version 1 without ``schema_version`` (written before 2026-11-25): read as version 1.
* 1 — the fields below (2026-11-25; ``diverged`` added, optional, the same day), with absolute paths of the
  machine that wrote them: read as version 2 (the paths made relative).
* 2 — ``node`` added (optional); paths relative on disk (2026-11-25): read as version 3.
* 3 — ``eval`` typed (:class:`~raysent.eval.results.Evaluation`: each task's result by its name, in place of
  version 2's ``{"metrics", "details"}``, whose metrics are the results' own), ``stopped`` typed
  (:class:`StoppedBy`), ``initial_dev`` a map of numbers (2026-11-28); ``sources`` added, optional (2026-12-01).

A record answers :meth:`RunRecord.score` (a test number by task, aggregation and correlation, or its best dev
score), as mteb's ``TaskResult.get_score`` does.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from raysent.errors import RaysentError
from raysent.eval.results import (
    STS_LABELS,
    Aggregation,
    Correlation,
    Evaluation,
    migrate_v2_evaluation,
)
from raysent.io import write_json_atomic

SCHEMA_VERSION: Final = 3
DIVERGED_DROP: Final = 10.0  # Spearman points (×100) below the untrained start that make a run "diverged"
PHASES = ("final", "search")
STS_SETS = tuple(STS_LABELS)  # sts12 ... sickr: the papers' column order, whose mean is ``avg``


class CurvePoint(BaseModel):
    """One evaluation during training: the step and the dev score(s) (``dev/<set>`` for each dev set, as extra
    fields): the one type of a dev curve, in a training summary and in a run record."""

    model_config = ConfigDict(extra="allow")
    step: int
    dev_spearman: float

    def scores(self) -> dict[str, float]:
        """``dev_spearman`` and every ``dev/<set>`` score of this evaluation (the step left out)."""
        return {"dev_spearman": self.dev_spearman,
                **{k: float(v) for k, v in (self.model_extra or {}).items() if isinstance(v, (int, float))}}


class StoppedBy(BaseModel):
    """By whom and where a trial was ended before its last step (a scheduler: :mod:`raysent.tune.stopped`)."""

    model_config = ConfigDict(extra="forbid")
    by: str
    at_step: int | None = None
    training_iteration: int | None = None
    total_steps: int | None = None


class RunIdentity(BaseModel):
    """What names one (configuration, seed) of a search before it trains (its MLflow run's name and tags, its
    record's file name); a record's :attr:`RunRecord.identity`."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    phase: Literal["final", "search"]
    hp: dict[str, Any]
    seed: int
    config_id: str
    trial_id: str | None = None

    def filename(self, search: str) -> str:
        """Its record's file under results/<experiment>/runs/: ``<phase>-<search>-<config_id>-seed<seed>.json``."""
        return f"{self.phase}-{search}-{self.config_id}-seed{self.seed}.json"


class RunRecord(BaseModel):
    """One (configuration, seed) of a search or of its final phase."""

    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[3] = Field(SCHEMA_VERSION, description="the record format (this module's history)")
    # identity
    experiment: str
    phase: Literal["final", "search"]
    search: str = Field(description="the search's run id (its start time)")
    config_id: str = Field(description="hash of the searched values")
    hp: dict[str, Any] = Field(description="the searched values, by their experiment-file path")
    seed: int
    trial_id: str | None = None
    method: str
    model: str
    hyperparameters: dict[str, Any] = Field(default_factory=dict,
                                            description="every hyperparameter under its raysent name")
    config: dict[str, Any] = Field(description="the resolved experiment")
    # training
    transductive: bool | None = None
    best_dev_spearman: float
    best_step: int | None = None
    initial_dev: dict[str, float] | None = Field(None, description="the dev scores of the untouched encoder")
    dev_curve: list[CurvePoint] = Field(default_factory=list)
    final_step: int | None = None
    learned: bool | None = Field(None, description="best checkpoint after step 0 (None: a method that does not train)")
    diverged: bool | None = Field(None, description=f"its last dev score is NaN or more than {DIVERGED_DROP:g} "
                                  "points below its start (None: no evaluation at the start)")
    train_seconds: float | None = None
    sentences_per_second: float | None = None
    workers: int | None = None
    sources: dict[str, str] | None = Field(None, description="what it read: the model and the training and dev data, "
                                           "each with the hub commit read (hf://...@<commit>) or its local path")
    best_model_dir: str | None = None
    device: str | None = Field(None, description="what it trained on (cpu, cuda); absent before 2026-12-03")
    precision: str | None = Field(None, description="its resolved precision; absent before 2026-12-03")
    settings: dict[str, Any] | None = Field(None, description="the device's speed settings it trained with, auto "
                                            "resolved (compile, CUDA graphs, …: the training summary's); absent "
                                            "before 2026-12-03")
    attention: str | None = Field(None, description="the encoder's attention implementation; absent before "
                                  "2026-12-03")
    node: str | None = Field(None, description="the Ray node the run trained on (its best model is on that node's "
                                               "disk)")
    resources: dict[str, Any] | None = Field(None, description="what it was given: GPUs per trial, trials per GPU and "
                                             "at once, the memory cap of a trial sharing a GPU, how auto chose "
                                             "(raysent.train.resources.run_record); absent before 2026-12")
    wall_seconds: float | None = None
    finished_at: float | None = None
    stopped: StoppedBy | None = Field(None, description="by whom and at which step a scheduler ended it")
    trained_in: str | None = Field(None, description="final phase: the search run (its record's file) that trained "
                                   "this configuration on this seed as this run would, whose best model it evaluates")
    # evaluation (final phase)
    scores: dict[str, float] = Field(default_factory=dict, description="the test metrics, flat (eval.metrics())")
    eval: Evaluation | None = Field(None, description="each test task's full result")
    # tracking
    mlflow_run_id: str | None = None

    @classmethod
    def from_disk(cls, path: str | Path) -> RunRecord:
        """The record in ``path``: validated, migrated from an older version, its folders absolute."""
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise RaysentError(f"{path}: run file not found") from None
        except json.JSONDecodeError as exc:
            raise RaysentError(f"{path}: not a valid run file (JSON error at line {exc.lineno}: {exc.msg})") from None
        record = validate_record(data, str(path))
        exp = path.parent.parent  # results/<experiment>/(runs|stopped)/<file>
        return record.model_copy(update=_run_folders(record, lambda p: _absolute(_relative(p, exp), exp)))

    def to_disk(self, path: str | Path) -> None:
        """Write the record to ``path`` (under results/<experiment>/runs/ or stopped/), atomically, its folders
        relative to the experiment's folder."""
        path = Path(path)
        portable = self.model_copy(update=_run_folders(self, lambda p: _relative(p, path.parent.parent)))
        write_json_atomic(path, portable.to_json())

    @property
    def identity(self) -> RunIdentity:
        return RunIdentity(phase=self.phase, hp=self.hp, seed=self.seed, config_id=self.config_id,
                           trial_id=self.trial_id)

    @property
    def filename(self) -> str:
        """Its file under results/<experiment>/runs/: ``<phase>-<search>-<config_id>-seed<seed>.json``."""
        return self.identity.filename(self.search)

    def to_json(self) -> dict:
        """The record as plain data for ``json.dump`` (NaN scores stay NaN, as the loop reported them)."""
        return self.model_dump()

    # ------------------------------------------------------------------ scores
    def headline_aggregation(self) -> str:
        """The STS12-16 aggregation of its headline scores (``scores``): the evaluation's, else the config's."""
        if self.eval is not None and self.eval.sts is not None:
            return self.eval.sts.aggregation
        return str((self.config.get("eval") or {}).get("aggregation") or "all")

    def has_test_scores(self) -> bool:
        return any(k.startswith("sts/") for k in self.scores)

    def available_aggregations(self) -> list[str]:
        """The STS12-16 aggregations this record holds numbers for (all three with an STS evaluation)."""
        if self.eval is not None and self.eval.sts is not None and self.eval.sts.tasks:
            return ["all", "mean", "wmean"]
        return [self.headline_aggregation()]

    def score(self, task: str, aggregation: Aggregation = "all", correlation: Correlation = "spearman"
              ) -> float | None:
        """One number ×100 (None: the record has no such score, or it is not finite).

        ``task`` is an STS set (``sts12`` … ``sickr``), ``avg`` (the mean of the seven, only when all seven are
        there) or ``dev`` (the best dev score the run selected its checkpoint on); ``aggregation`` applies to
        STS12-16 (``all``, ``mean``, ``wmean``), ``correlation`` is ``spearman`` or ``pearson``.
        """
        if task == "dev":
            return _finite(self.best_dev_spearman)
        if task == "avg":
            vals = [self.score(t, aggregation, correlation) for t in STS_SETS]
            present = [v for v in vals if v is not None]
            return sum(present) / len(present) if len(present) == len(vals) else None
        if self.eval is not None and self.eval.sts is not None:
            found = self.eval.sts.score(task, aggregation, correlation)
            if found is not None:
                return _finite(found)
        key = f"sts/{task}" + ("/pearson" if correlation == "pearson" else "")
        if key in self.scores and (aggregation == self.headline_aggregation() or task in ("stsb", "sickr")):
            return _finite(self.scores[key])
        return None


def _finite(v: float | None) -> float | None:
    return float(v) if v is not None and math.isfinite(v) else None


class TrainSummary(BaseModel):
    """What one training run returns, the same on every path (in this process, on Ray Train, in a Tune trial):
    the loop's numbers, then what the driver adds (name, seed, folders, wall time, config) before it writes
    ``<output_dir>/result.json``. A field the loop or the driver does not know is refused, so the two cannot
    drift apart."""

    model_config = ConfigDict(extra="forbid")

    # the loop (raysent.train.loop.run_training)
    method: str
    best_dev_spearman: float
    best_step: int
    final_step: int
    total_steps: int
    stopped_early: bool = False
    resumed_at_step: int | None = None
    resumed_from: str | None = None
    initial_dev: dict[str, float] | None = None
    dev_curve: list[CurvePoint] = Field(default_factory=list)
    loss_curve: list[dict[str, Any]] = Field(default_factory=list)
    train_seconds: float
    steps_per_second: float | None = None
    sentences_per_second: float | None = None
    workers: int
    device: str
    torch_threads: int
    precision: str
    settings: dict[str, Any] | None = Field(None, description="the device's speed settings, each auto resolved "
                                            "(raysent.train.device); absent before 2026-11-27")
    attention: str | None = Field(None, description="the encoder's attention implementation (transformers' "
                                  "_attn_implementation: sdpa, eager, …); absent before 2026-12-03")
    prepare: dict[str, Any] | None = Field(None, description="what the method computed before training")
    phases: dict[str, float] = Field(default_factory=dict, description="seconds per part of a step")
    data: dict[str, Any] = Field(default_factory=dict, description="what it trained on")
    sources: dict[str, str] = Field(default_factory=dict, description="what it read: the model and the data, each "
                                    "with the hub commit read (hf://...@<commit>) or its local path")
    startup: dict[str, Any] = Field(default_factory=dict, description="seconds to build the method, the data")
    best_model_dir: str | None = None
    # the driver (raysent.train.run.finish, train_stages; Ray Train's storage)
    name: str | None = None
    seed: int | None = None
    model: str | None = None
    transductive: bool | None = None
    output_dir: str | None = None
    wall_seconds: float | None = None
    config: dict[str, Any] | None = None
    stages: list[dict[str, Any]] | None = Field(None, description="one entry per stage of a multi-stage method")
    ray: dict[str, Any] | None = Field(None, description="Ray Train's storage path and last checkpoint")

    def to_json(self) -> dict:
        return self.model_dump()


def _problems(exc: ValidationError) -> str:
    """The first five problems of a failed validation: the field, what is wrong, what was found."""
    return "; ".join(f"field '{'.'.join(map(str, e['loc']))}': {e['msg']}" +
                     (f" (found {e['input']!r})" if e["type"] != "missing" else "") for e in exc.errors()[:5])


def read_summary(path: str | Path) -> TrainSummary:
    """The training summary in ``path`` (a run's result.json), validated."""
    path = Path(path)
    try:
        return TrainSummary.model_validate(json.loads(path.read_text(encoding="utf-8")))
    except (ValidationError, json.JSONDecodeError) as exc:
        problems = str(exc) if isinstance(exc, json.JSONDecodeError) else _problems(exc)
        raise RaysentError(f"{path}: not a valid training summary: {problems}") from None


def learned(method: str, best_step: int | None) -> bool | None:
    """Whether a run improved on the untouched encoder: its best checkpoint is after step 0 (None for a method
    that does not train). A run whose best is step 0 reports the input model, not what training made of it."""
    if method == "baseline" or best_step is None:
        return None
    return int(best_step) > 0


def diverged(initial_dev: dict[str, float] | None, dev_curve: Sequence[CurvePoint]) -> bool | None:
    """Whether a run ended far below where it started: its last dev score is NaN or more than
    :data:`DIVERGED_DROP` points below the untouched encoder's (a learning rate too high collapses the
    embeddings without any NaN). None when the start was not evaluated."""
    start = (initial_dev or {}).get("dev_spearman")
    if start is None or not dev_curve:
        return None
    last = dev_curve[-1].dev_spearman
    return last != last or last < start - DIVERGED_DROP


def _absolute(path: str, exp_dir: Path) -> str:
    return path if Path(path).is_absolute() else str(exp_dir.resolve() / path)


def _relative(path: str, exp_dir: Path) -> str:
    """``path`` relative to the experiment's folder when it is inside it (a run of another machine's folder,
    whose own results folder had the experiment's name, counts as inside), else unchanged."""
    p = Path(os.path.normpath(path))
    if not p.is_absolute():
        return path
    for root in (exp_dir.resolve(), exp_dir):
        try:
            return str(p.relative_to(os.path.normpath(root)))
        except ValueError:
            pass
    parts = p.parts
    if exp_dir.name in parts:  # written on another machine: the part after the experiment's folder
        return str(Path(*parts[len(parts) - parts[::-1].index(exp_dir.name):]))
    return path


def _run_folders(record: RunRecord, convert: Callable[[str], str]) -> dict[str, Any]:
    """The record's path fields with ``convert`` applied (as a model_copy update)."""
    update: dict[str, Any] = {}
    if record.best_model_dir:
        update["best_model_dir"] = convert(record.best_model_dir)
    out = (record.config.get("train") or {}).get("output_dir")
    if out:
        update["config"] = {**record.config, "train": {**record.config["train"], "output_dir": convert(out)}}
    return update


def _portable_data(obj: Any) -> Any:
    """Every absolute path of a file under RAYSENT_DATA_DIR in ``obj`` (a version-1 record's eval sources) as
    ``$RAYSENT_DATA_DIR/<path>``."""
    root = os.environ.get("RAYSENT_DATA_DIR")
    if isinstance(obj, dict):
        return {k: _portable_data(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_portable_data(v) for v in obj]
    if isinstance(obj, str) and root and "/" in obj:
        roots = {os.path.normpath(root), os.path.normpath(os.path.realpath(root))}
        parts = []
        for piece in obj.split(" + "):
            # as written, and through the links of this machine (a data folder reached by a symbolic link)
            names = (os.path.normpath(piece), os.path.realpath(piece)) if piece.startswith("/") else (piece,)
            piece = next(("$RAYSENT_DATA_DIR/" + n[len(r) + 1:] for n in names for r in roots
                          if n.startswith(r + os.sep)), piece)
            parts.append(piece)
        return " + ".join(parts)
    return obj


def migrate(data: dict, source: str) -> dict:
    """A record of an older version (this module's history) as the current one."""
    version = data.get("schema_version", 0)
    if version == 0:
        known = set(RunRecord.model_fields)
        if not ({"phase", "config_id", "seed"} <= set(data) and set(data) <= known):
            raise RaysentError(f"{source}: not a raysent run record (no 'schema_version'; a run record holds "
                               f"{', '.join(sorted(known))})")
        data, version = {**data, "schema_version": 1}, 1
    if version == 1:  # paths made portable: absolute on the machine that wrote them
        data, version = {**data, "schema_version": 2}, 2
        if isinstance(data.get("eval"), dict):
            data["eval"] = _portable_data(data["eval"])
    if version == 2:  # the evaluation typed: each task's result by its name
        data = {**data, "schema_version": 3}
        if isinstance(data.get("eval"), dict):
            data["eval"] = migrate_v2_evaluation(data["eval"])
    return data


def validate_record(data: Any, source: str) -> RunRecord:
    """``data`` as a :class:`RunRecord` (migrated from an older version), or a :class:`RaysentError` naming
    ``source`` and what is wrong."""
    if not isinstance(data, dict):
        raise RaysentError(f"{source}: not a run record (expected a JSON object, found {type(data).__name__})")
    version = data.get("schema_version", 0)
    if not isinstance(version, int) or not 0 <= version <= SCHEMA_VERSION:
        raise RaysentError(f"{source}: run record schema_version {version!r}; this raysent reads versions up to "
                           f"{SCHEMA_VERSION} (written by a newer raysent)")
    try:
        return RunRecord.model_validate(migrate(data, source))
    except ValidationError as exc:
        raise RaysentError(f"{source}: not a valid run record: {_problems(exc)}") from None


def read_record(path: str | Path) -> RunRecord:
    """The run record in ``path`` (:meth:`RunRecord.from_disk`)."""
    return RunRecord.from_disk(path)


RECORD_FOLDERS = ("runs", "stopped")  # under results/<experiment>/: finished runs, runs a scheduler stopped


def check_records(exp_dir: str | Path, fix: str) -> int:
    """Read every run record of an experiment folder before anything uses them; one :class:`RaysentError`
    naming each broken file (``fix``: what to do about one) instead of a failure after a search trained on.
    Returns how many records were read."""
    exp_dir = Path(exp_dir)
    broken, n = [], 0
    for folder in RECORD_FOLDERS:
        for path in sorted((exp_dir / folder).glob("*.json")):
            n += 1
            try:
                read_record(path)
            except RaysentError as exc:
                broken.append(str(exc))
    if broken:
        raise RaysentError(f"{len(broken)} of the {n} run records of {exp_dir} cannot be read:\n  - "
                           + "\n  - ".join(broken) + f"\n{fix}")
    return n
