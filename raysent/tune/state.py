"""What a search keeps between its phases and leaves behind, typed: ``state.json`` (:class:`SearchState`, what
``--resume`` continues from) and ``summary.json`` (:class:`Summary`, what ``raysent tune`` prints and
:func:`raysent.search` returns). Both are written atomically; their JSON keys are these fields' names.

The pieces: the searched configurations and the winner (:class:`Best`, :mod:`raysent.tune.best`), the final
phase of an arm (:class:`ArmOutcome`: the winner, and the warm-start configuration it is compared with), their
paired comparison (:class:`Comparison`), and what was published (:class:`Published`, :mod:`raysent.tune.publish`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from raysent.errors import RaysentError
from raysent.io import write_json_atomic
from raysent.report.budget import BudgetCurve
from raysent.report.compare import Paired

STATE_FILE = "state.json"
SUMMARY_FILE = "summary.json"
# "final" runs the searched best and the warm-start arm together; "paper" (the warm-start arm alone, after the
# searched best's seeds) is where a search an earlier raysent ran could stop, kept so that --resume continues it
Phase = Literal["search", "final", "paper", "publish", "done"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


def portable(obj: Any, exp: Path) -> Any:
    """``obj`` with every path inside the experiment's folder made relative to it (what the file holds: the
    folder can move, and a committed one names no machine); the folder itself as ``<results>/<experiment>``."""
    root = str(exp.resolve())
    if isinstance(obj, dict):
        return {k: portable(v, exp) for k, v in obj.items()}
    if isinstance(obj, list):
        return [portable(v, exp) for v in obj]
    if isinstance(obj, str):
        if obj == root:
            return f"{exp.parent.name}/{exp.name}"
        if obj.startswith(root + "/"):
            return obj[len(root) + 1:]
        # a store beside it (sqlite:////abs/results/mlflow.db): named from the folder above the results
        return obj.replace(str(exp.parent.resolve()) + "/", exp.parent.name + "/")
    return obj


def _here(path: str | None, exp: Path) -> str | None:
    return path if path is None or Path(path).is_absolute() else str(exp.resolve() / path)


class ConfigScore(_Model):
    """One searched configuration: its seeds' mean best dev score."""

    config_id: str
    hp: dict[str, Any] = Field(default_factory=dict)
    seeds: list[int] = Field(default_factory=list)
    learned: bool = True  # at least one seed's best checkpoint is after step 0
    dev_mean: float | None = None
    dev_std: float = 0.0
    n: int = 0
    tie: dict[str, Any] | None = None  # the winner of a tie: {"with": [config ids], "learned": bool}


class FailedTrial(_Model):
    trial_id: str | None = None
    path: str | None = None
    error: str


class StoppedTrial(_Model):
    trial_id: str | None = None
    config_id: str
    hp: dict[str, Any]
    seed: int
    best_dev_spearman: float
    at_step: int | None = None


class Best(ConfigScore):
    """The winning configuration, and what the search phase did (empty for ``--final-only``)."""

    configurations: list[ConfigScore] = Field(default_factory=list)
    failed: list[FailedTrial] = Field(default_factory=list)
    stopped: list[StoppedTrial] = Field(default_factory=list)
    finished_runs: int = 0
    not_learned_runs: int = 0
    diverged_runs: int = 0


class ScoreStat(_Model):
    mean: float
    std: float
    n: int


class ArmOutcome(_Model):
    """The final phase of one configuration: its seeds' test scores."""

    seeds: list[int]
    missing_seeds: list[int] = Field(default_factory=list)
    scores: dict[str, ScoreStat] = Field(default_factory=dict)
    errors: list[str] = Field(default_factory=list)
    not_learned_seeds: list[int] = Field(default_factory=list)
    diverged_seeds: list[int] = Field(default_factory=list)
    transductive: bool = False


class Comparison(_Model):
    """The winner against the warm-start configuration, paired by seed (:func:`raysent.report.compare.paired`)."""

    paper: str  # the warm-start configuration's id
    searched: str  # the winner's id
    tasks: dict[str, Paired]


class LoggedModel(_Model):
    uri: str
    megabytes: float
    seconds: float = 0.0


class Registered(_Model):
    name: str
    version: str
    uri: str


class PublishedModel(_Model):
    seed: int
    run_id: str | None = None
    path: str | None = None
    uri: str
    seconds: float
    megabytes: float


class Published(_Model):
    """What a finished search left where researchers work (:mod:`raysent.tune.publish`)."""

    files: list[str] = Field(default_factory=list)
    cards: list[str] = Field(default_factory=list)
    best_model_dir: str | None = None
    parent_run_id: str | None = None
    model: PublishedModel | None = None
    registered: Registered | None = None


class SearchState(_Model):
    """state.json: where a search is (``phase``) and what its finished phases found."""

    run: str  # the search's id: its start time
    phase: Phase
    config: dict[str, Any]
    source: str = "<config>"
    parent_run_id: str | None = None
    best: Best | None = None
    final: ArmOutcome | None = None
    paper: ArmOutcome | None = None  # the warm-start configuration's final phase
    vs_paper: Comparison | None = None
    warm_source: Literal["paper", "file"] | None = None  # where the warm-start configuration's values come from
    published: Published | None = None
    logged_models: dict[str, LoggedModel] = Field(default_factory=dict)  # by seed, as they are logged
    registered: Registered | None = None
    # what its trials were given (raysent.train.resources.Placement.record): gpus_per_worker as resolved, the device
    # each trial trains on, trials at once; of the search's latest start (a --resume may run on another cluster)
    resources: dict[str, Any] | None = None
    # the search's Optuna sampler and every option raysent gave it (raysent.tune.searchers.sampler_settings)
    sampler: dict[str, Any] | None = None

    @classmethod
    def load(cls, exp: Path) -> SearchState | None:
        path = exp / STATE_FILE
        if not path.is_file():
            return None
        try:
            state = cls.model_validate(json.loads(path.read_text()))
        except (ValidationError, json.JSONDecodeError) as exc:
            raise RaysentError(f"{path}: not a search state raysent can resume ({str(exc).splitlines()[0]}); "
                               f"delete the folder {exp} to start the search afresh") from None
        if state.published is not None:  # its paths as they are now (the folder may have moved)
            p = state.published
            state.published = p.model_copy(update={
                "best_model_dir": _here(p.best_model_dir, exp), "cards": [_here(c, exp) for c in p.cards],
                "model": p.model.model_copy(update={"path": _here(p.model.path, exp)}) if p.model else None})
        return state

    def save(self, exp: Path) -> None:
        write_json_atomic(exp / STATE_FILE, portable(self.model_dump(mode="json"), exp))


class Summary(_Model):
    """summary.json: a search's outcome as `raysent tune` prints it (:func:`raysent.report.summary.format_summary`)."""

    experiment: str
    results: str
    search: str
    best: Best | None = None
    final: ArmOutcome | None = None
    paper: ArmOutcome | None = None
    vs_paper: Comparison | None = None
    warm_source: Literal["paper", "file"] | None = None
    mlflow: str | None = None
    mlflow_runs_url: str | None = None
    wall_seconds: float | None = None
    budget: BudgetCurve | None = None  # the search's budget curve (raysent.report.budget)
    published: Published | None = None
    publish_error: str | None = None
    resources: dict[str, Any] | None = None  # what the trials were given (SearchState.resources)
    sampler: dict[str, Any] | None = None  # SearchState.sampler

    def save(self, exp: Path) -> None:
        write_json_atomic(exp / SUMMARY_FILE, portable(self.model_dump(mode="json"), exp))
