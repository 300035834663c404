"""What a trial and the search's driver tell each other (issue 62, "One typed protocol").

The driver gives every trial of a phase a :class:`TrialContext` (through ``tune.with_parameters``), with the
:class:`MlflowTarget` its runs log to. A trial tells the driver how it goes in Tune results, each a
:class:`TrialResult`: after every evaluation its step and scores, at its end ``finished`` and its run records (one,
or one per seed for a trial that trains all its configuration's seeds), after each round of such a trial every seed's
latest point (``seed_points``). :meth:`TrialResult.to_tune` is the one way to write one, :meth:`TrialResult.from_tune`
the one way to read one back (a scheduler's result, a callback's, the last result Tune keeps of a trial, one of an
experiment saved before this module); no other module reads a key of the protocol by its string.

A Tune result is a flat mapping of numbers (Tune flattens what is nested, and its searchers and schedulers read
numbers), so the records and the seed points travel as JSON text under :data:`RECORD_KEY` and :data:`SEED_POINTS`.
The keys are the ones raysent has always written, so an experiment saved before reads as it was (``--resume``).
Imports no Ray.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from raysent.train.records import RunRecord, validate_record

RECORD_KEY = "raysent_record"  # a finished trial's run record(s), JSON: one record, or a list (a trial of all seeds)
SEED_POINTS = "seed_points"  # a round's per-seed points, JSON: {seed: {step, dev_spearman, dev/<set>, best...}}
STOPPED_DIR = "stopped"  # results/<experiment>/stopped/: the records of the trials a scheduler stopped

# the loop's report (raysent.train.loop: evaluate_and_save, run_training) as it reaches a trial: "finished", not
# "done" (Tune reads a reported "done" as the end of the trial)
STEP, FINISHED = "step", "finished"
_SEED, _SEEDS = "seed", "seeds"
_TUNE_OWN = ("trial_id", "training_iteration", "time_total_s")  # Tune's own keys of a result that the driver reads
DEV = "dev_spearman"  # an evaluation's mean dev Spearman (raysent.eval.sts)
BEST, BEST_STEP = "best_dev_spearman", "best_step"  # the run's best dev score so far, and its step
_POINT = (STEP, DEV, BEST, BEST_STEP)  # what a seed's point keeps (with dev/<set>)


class MlflowTarget(BaseModel):
    """Where a trial logs its MLflow run: the tracking URI, the experiment and the parent run."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    uri: str
    experiment_id: str
    parent: str | None = None


class TrialContext(BaseModel):
    """What every trial of one phase is given (through ``tune.with_parameters``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    config: dict[str, Any]  # the experiment (the final phase's: with the best configuration applied)
    source: str  # the experiment file, for errors
    phase: Literal["search", "final"]
    run: str  # the search's run id
    exp_dir: str  # results/<experiment>
    metric: str  # what the trial reports to the searcher
    mlflow: MlflowTarget | None = None
    env: dict[str, str] = {}  # RAYSENT_DATA_DIR & co. as the driver resolved them
    # the final phase's configurations by arm, run together in one Tune run: "" the searched best (or the
    # configuration as given), "paper" search.warm_start's comparison (its folders are named after it); a trial's
    # Tune config names its arm (``arm``; absent: "")
    arms: dict[str, dict[str, Any]] = {}
    driver_node: str | None = None  # the Ray node of the search's driver (its disk holds results/)
    # RAYSENT_TRIAL_GATE of the driver (tests): a folder in which each trial signals its start and waits for its turn
    # (raysent.tune.trial.wait_at_gate), so that a test interrupts a search at a point the code signals, not after a
    # delay
    gate: str | None = None
    # what every run of the phase was given (raysent.train.resources.run_record): GPUs per trial, trials per GPU and
    # at once, the memory cap of a trial that shares a GPU, how auto chose; kept in each run record
    resources: dict[str, Any] = {}

    @property
    def experiment(self) -> str:
        return Path(self.exp_dir).name


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


class TrialResult(BaseModel):
    """One result a trial reports to Tune (see the module)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    step: int | None = Field(None, description="the step of the evaluation (a round's: its seeds' lowest)")
    finished: bool = Field(False, description="the trial's last result: its training ended")
    metrics: dict[str, float] = Field(default_factory=dict, description="every number: dev_spearman, dev/<set>, "
                                      "best_dev_spearman, best_step, loss, lr, epoch; a round's seed means with "
                                      "<name>_std; a final run's test scores")
    seed: int | None = None
    seeds: int | None = Field(None, description="how many seeds a round's means are over")
    records: list[RunRecord] | None = Field(None, description="a finished trial's run records, as it wrote them")
    sent: bool = Field(False, description="it carries run records (read back with read_records=False: not parsed)")
    seed_points: dict[str, dict[str, float]] | None = Field(None, description="a round's point of each seed, by seed")
    # Tune's, in what it hands back (never written by a trial)
    trial_id: str | None = None
    training_iteration: int | None = None
    time_total_s: float | None = None

    # ------------------------------------------------------------------ writing
    @classmethod
    def from_loop(cls, report: Mapping[str, Any]) -> TrialResult:
        """What the training loop reported (its hooks' ``report``): the step, whether it finished, its numbers."""
        return cls(step=int(report[STEP]) if _number(report.get(STEP)) else None,
                   finished=bool(report.get(FINISHED)),
                   metrics={k: float(v) for k, v in report.items() if _number(v) and k != STEP})

    @classmethod
    def done(cls, records: list[RunRecord], metrics: Mapping[str, float], seed: int | None = None,
             seeds: int | None = None) -> TrialResult:
        """A trial's last result: what the searcher is told (``metrics``) and its run records."""
        return cls(finished=True, metrics=dict(metrics), seed=seed, seeds=seeds, records=list(records), sent=True)

    def to_tune(self) -> dict[str, Any]:
        """The flat mapping ``tune.report`` takes. One record travels as one JSON object, several as a list."""
        out: dict[str, Any] = dict(self.metrics)
        if self.step is not None:
            out[STEP] = self.step
        out[FINISHED] = self.finished
        if self.seed is not None:
            out[_SEED] = self.seed
        if self.seeds is not None:
            out[_SEEDS] = self.seeds
        if self.records is not None:
            sent = [r.to_json() for r in self.records]
            out[RECORD_KEY] = json.dumps(sent[0] if len(sent) == 1 and self.seeds is None else sent, default=str)
        if self.seed_points is not None:
            out[SEED_POINTS] = json.dumps(self.seed_points)
        return out

    # ------------------------------------------------------------------ reading
    @classmethod
    def from_tune(cls, result: Mapping[str, Any] | None, read_records: bool = True) -> TrialResult:
        """A result as Tune hands it back (None or empty: a trial that reported nothing); ``read_records`` False:
        whether it carries run records (``sent``) without reading them (what decides that a trial finished)."""
        result = result or {}
        text = result.get(RECORD_KEY)
        records = None
        if text and read_records:
            sent = json.loads(text)  # one record, or a list: the seeds of a trial that trains them all
            records = [validate_record(data, f"the record trial {result.get('trial_id')} sent")
                       for data in (sent if isinstance(sent, list) else [sent])]
        points = result.get(SEED_POINTS)
        own = (STEP, FINISHED, _SEED, _SEEDS, RECORD_KEY, SEED_POINTS, *_TUNE_OWN)
        return cls(step=int(result[STEP]) if _number(result.get(STEP)) else None,
                   finished=bool(result.get(FINISHED)),
                   metrics={k: float(v) for k, v in result.items() if _number(v) and k not in own},
                   seed=int(result[_SEED]) if _number(result.get(_SEED)) else None,
                   seeds=int(result[_SEEDS]) if _number(result.get(_SEEDS)) else None, records=records,
                   sent=bool(text),
                   seed_points={str(s): dict(p) for s, p in json.loads(points).items()} if points else None,
                   trial_id=result.get("trial_id"),
                   training_iteration=result.get("training_iteration"), time_total_s=result.get("time_total_s"))

    @property
    def logged_step(self) -> int | None:
        """The step a live MLflow run logs this result at: one the loop reported at an evaluation during training;
        None for its end, which repeats the last evaluation."""
        return None if self.finished else self.step

    def value(self, key: str) -> float | None:
        return self.metrics.get(key)

    def curve_point(self) -> dict[str, Any] | None:
        """The dev-curve point of this result (as the loop's ``dev_curve`` holds it); None if not an evaluation."""
        if DEV not in self.metrics or self.step is None:
            return None
        return {STEP: self.step, **{k: v for k, v in self.metrics.items() if k == DEV or k.startswith("dev/")}}

    def best(self) -> tuple[float | None, int | None]:
        """(the run's best dev score so far, its step), as the loop reported them."""
        step = self.metrics.get(BEST_STEP)
        return self.metrics.get(BEST), (int(step) if step is not None and not math.isnan(step) else None)


def seed_point(report: Mapping[str, Any]) -> dict[str, float]:
    """What the driver needs of one seed's latest evaluation to record it if the trial is stopped: its step, its
    scores and its best so far (``seed_points``)."""
    return {k: v for k, v in report.items() if (k in _POINT or k.startswith("dev/")) and _number(v)}


def from_record(record: RunRecord) -> dict[str, Any]:
    """A finished run's record as the loop's last report held it: its last evaluation and its best (a seed that
    finished before a search was interrupted, in a trial of all seeds)."""
    last = record.dev_curve[-1].scores() if record.dev_curve else {}
    return {**last, BEST: record.best_dev_spearman, BEST_STEP: record.best_step}


def reported(record: RunRecord, metric: str) -> dict[str, float]:
    """What a finished run tells the searcher: its best dev score, or ``metric`` at its last evaluation."""
    if metric == BEST:
        return {metric: record.best_dev_spearman}
    last = record.dev_curve[-1].scores() if record.dev_curve else {}
    return {metric: float(last.get(metric, math.nan))}


def numbers(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The numbers of an evaluation that a seed mean averages (not its step, epoch or best step)."""
    return {k: float(v) for k, v in metrics.items() if _number(v) and k not in (STEP, "epoch", BEST_STEP)}
