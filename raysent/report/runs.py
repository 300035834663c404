"""Run files: ``results/<experiment>/runs/*.json``, one per finished (configuration, seed).

What a run file holds (written by ``raysent tune``; see README "Tune"): ``experiment``, ``phase``
(``search`` | ``final``), ``search`` (the search's run id), ``config_id``, ``hp`` (the searched
values), ``seed``, ``method``, ``model``, ``hyperparameters`` (every hyperparameter under its
raysent name), ``transductive``, ``best_dev_spearman``, ``dev_curve`` ([{step, dev_spearman}]),
``config`` (the resolved experiment) and, in the final phase, ``scores`` (``sts/sts12``,
``sts/sts12/pearson``, ..., ``sts/avg``: the headline aggregation) with ``eval.sts.tasks``
holding every aggregation (``spearman_all``, ``spearman_mean``, ``spearman_wmean``, ``pearson_*``).

This module reads them, picks the number a table asks for (task × aggregation × correlation) and
resolves what a user names on the command line (an experiment, a config_id, a glob of files).
Imports no Ray and no MLflow.
"""

from __future__ import annotations

import glob as globlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from raysent.errors import RaysentError, did_you_mean
from raysent.eval.results import AGGREGATIONS, CORRELATIONS, STS_LABELS, Aggregation, Correlation
from raysent.train.records import PHASES, STS_SETS, RunRecord, check_records, learned, read_record

__all__ = ["AGGREGATIONS", "CORRELATIONS", "TASKS", "TASK_LABELS", "Run", "load_experiment", "resolve"]

C = TypeVar("C", bound=str)

TASKS = STS_SETS  # the papers' column order
TASK_LABELS = {**STS_LABELS, "avg": "Avg", "dev": "Dev"}

# run-file keys that say nothing about the configuration (never offered for --group-by)
_VOLATILE = {"best_model_dir", "train_seconds", "sentences_per_second", "wall_seconds", "finished_at",
             "mlflow_run_id", "trial_id", "final_step", "best_step", "best_dev_spearman", "workers",
             "train.output_dir", "output_dir"}


def _hashable(v: Any) -> Any:
    if isinstance(v, list):
        return tuple(_hashable(x) for x in v)
    if isinstance(v, dict):
        return tuple(sorted((k, _hashable(x)) for k, x in v.items()))
    return v


def _flatten(prefix: str, obj: Any, out: dict) -> None:
    if isinstance(obj, dict):
        for k, v in obj.items():
            _flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    else:
        out[prefix] = _hashable(obj)


def _finite(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) else None


@dataclass
class Run:
    """One run file: its typed record (:class:`~raysent.train.records.RunRecord`) and where it is; what the tables
    read of it (a score by task, aggregation and correlation; every named value, for --group-by)."""

    path: Path
    record: RunRecord
    _fields: dict | None = field(default=None, repr=False)

    @property
    def data(self) -> dict:
        """The record as the file holds it (the fields that were set)."""
        return self.record.model_dump(exclude_unset=True)

    # ------------------------------------------------------------------ identity
    @property
    def experiment(self) -> str:
        return self.record.experiment or self.path.parent.parent.name

    @property
    def phase(self) -> str:
        return self.record.phase

    @property
    def search(self) -> str:
        return self.record.search

    @property
    def config_id(self) -> str:
        return self.record.config_id

    @property
    def seed(self) -> int:
        return self.record.seed

    @property
    def method(self) -> str:
        return self.record.method

    @property
    def model(self) -> str:
        return self.record.model

    @property
    def hp(self) -> dict:
        return dict(self.record.hp)

    @property
    def transductive(self) -> bool:
        return bool(self.record.transductive)

    @property
    def learned(self) -> bool | None:
        """Whether training improved on the untouched encoder (:func:`raysent.train.records.learned`)."""
        return learned(self.record.method, self.record.best_step)

    @property
    def unit(self) -> tuple[str, str, str, str]:
        """(experiment, phase, search, config_id): the seeds of one configuration."""
        return (self.experiment, self.phase, self.search, self.config_id)

    @property
    def config(self) -> dict:
        return self.record.config

    def expected_seeds(self) -> list[int] | None:
        """The seeds this run's configuration was meant to run on (None: not derivable from the file).

        Final phase: ``config.seeds``. Search phase: the first ``search.seeds`` of ``config.seeds``
        (raysent.tune.trial.search_seed; beyond that list the seeds depend on the base train.seed,
        which a search run file no longer holds).
        """
        seeds = self.config.get("seeds")
        if not isinstance(seeds, list):
            return None
        if self.phase == "final":
            return [int(s) for s in seeds]
        if self.phase == "search":
            n = (self.config.get("search") or {}).get("seeds")
            if isinstance(n, int) and n <= len(seeds):
                return [int(s) for s in seeds[:n]]
        return None

    # ------------------------------------------------------------------ fields
    def fields(self) -> dict[str, Any]:
        """Every named value of the run, for --group-by: run keys, hyperparameters, hp, dotted config paths."""
        if self._fields is None:
            out: dict[str, Any] = {}
            _flatten("", self.config, out)  # dotted: train.lr, params.temperature, data.train, ...
            for k, v in self.data.items():
                if k not in ("config", "hyperparameters", "hp", "scores", "eval", "dev_curve", "initial_dev") \
                        and not isinstance(v, dict):
                    out[k] = _hashable(v)
            for k, v in (self.data.get("hyperparameters") or {}).items():
                out[k] = _hashable(v)
            for k, v in self.hp.items():
                out[k] = _hashable(v)
            self._fields = {k: v for k, v in out.items() if k not in _VOLATILE
                            and not k.startswith(("search.space.", "tracking."))}
        return self._fields

    # ------------------------------------------------------------------ scores (the record answers them)
    def headline_aggregation(self) -> str:
        return self.record.headline_aggregation()

    def has_test_scores(self) -> bool:
        return self.record.has_test_scores()

    def available_aggregations(self) -> list[str]:
        """The STS12-16 aggregations this file holds numbers for."""
        return self.record.available_aggregations()

    def score(self, task: str, aggregation: Aggregation = "all", correlation: Correlation = "spearman"
              ) -> float | None:
        """One number ×100 (None: this run has no such score): :meth:`RunRecord.score
        <raysent.train.records.RunRecord.score>`."""
        return self.record.score(task, aggregation, correlation)

    def dev_curve(self) -> list[tuple[int, float]]:
        out = []
        for point in self.record.dev_curve:
            val = _finite(point.dev_spearman)
            if val is not None:
                out.append((int(point.step), val))
        return out


# --------------------------------------------------------------------------- loading
def read_run(path: str | Path) -> Run:
    """A run file, validated against the run record's schema (:mod:`raysent.train.records`)."""
    path = Path(path)
    return Run(path, read_record(path))


def experiments(results_dir: str | Path) -> list[str]:
    """The experiments under ``results_dir`` that have run files."""
    root = Path(results_dir)
    return sorted(p.parent.name for p in root.glob("*/runs") if p.is_dir() and any(p.glob("*.json")))


def load_experiment(name: str, results_dir: str | Path, phase: str | None = None) -> list[Run]:
    """Every run file of ``results_dir/name/runs`` (of one phase when given)."""
    root = Path(results_dir)
    folder = root / name / "runs"
    if not folder.is_dir():
        have = experiments(root)
        raise RaysentError(f"experiment {name!r}: no folder {folder}{did_you_mean(name, have)}; experiments with run "
                           f"files under {root}: {', '.join(have) or 'none'}")
    check_records(folder.parent, "Delete each broken file and run `raysent tune FILE --resume` with the experiment's "
                                 "file: a finished run's record is written again from the result Tune kept for it "
                                 "(nothing is trained again)")
    runs = [read_run(p) for p in sorted(folder.glob("*.json"))]
    if not runs:
        raise RaysentError(f"experiment {name!r}: {folder} holds no run files (*.json)")
    if phase is not None:
        check_choice(phase, PHASES, "--phase")
        kept = [r for r in runs if r.phase == phase]
        if not kept:
            present = sorted({r.phase for r in runs})
            raise RaysentError(f"experiment {name!r}: no {phase}-phase runs in {folder} (phases present: "
                               f"{', '.join(present)}); use --phase {present[0]}")
        runs = kept
    return runs


def check_choice(value: str, allowed: Sequence[C], option: str) -> C:
    """``value`` as the one of ``allowed`` it names, or an error naming the option and what is allowed."""
    for choice in allowed:
        if choice == value:
            return choice
    raise RaysentError(f"{option} {value!r}: unknown{did_you_mean(value, allowed)}; allowed: {', '.join(allowed)}")


def resolve(spec: str, results_dir: str | Path, phase: str | None = "final", search: str | None = None
            ) -> list[Run]:
    """The runs a user names: an experiment, ``EXPERIMENT:CONFIG_ID``, a config_id, or a glob of run files.

    For an experiment or a config_id only runs of ``phase`` are kept (None: any phase), of the search ``search``
    names (default: the experiment's newest, :func:`pick_search`). A glob is taken as given (every file it matches,
    whatever the phase or search).
    """
    root = Path(results_dir)
    if any(ch in spec for ch in "*?[") or spec.endswith(".json"):
        files = sorted(globlib.glob(spec))
        if not files:
            raise RaysentError(f"{spec!r}: no run file matches this glob")
        return [read_run(p) for p in files]
    return pick_search(_resolve_named(spec, root, phase), search, spec)[0]


def pick_search(runs: list[Run], search: str | None, what: str) -> tuple[list[Run], list[str]]:
    """The runs of one search of each experiment, and a note for each experiment that holds others. ``search``:
    None, the newest (an experiment searched again holds both: a user's second `raysent tune` must not mix into the
    first one's table or comparison); ``all``, every search; else that search id (an error lists the ones there
    are)."""
    if search == "all":
        return runs, []
    by_exp: dict[str, set[str]] = {}
    for r in runs:
        by_exp.setdefault(r.experiment, set()).add(r.search)
    if search is not None:
        kept = [r for r in runs if r.search == search]
        if not kept:
            have = "; ".join(f"{e}: {', '.join(sorted(s))}" for e, s in sorted(by_exp.items()))
            raise RaysentError(f"{what}: no runs of search {search!r}; the searches there are {have} (or --search "
                               "all)")
        return kept, []
    notes = [f"{e}: the newest of its {len(s)} searches, {max(s)} (the others: {', '.join(sorted(s)[:-1])}; "
             "--search ID picks one, --search all takes every one)" for e, s in sorted(by_exp.items()) if len(s) > 1]
    return latest_search(runs), notes


def latest_search(runs: list[Run]) -> list[Run]:
    """The runs of the newest search of each experiment (an experiment run twice holds both searches; a
    search id is its start time, so the newest sorts last). A glob of run files picks another search."""
    newest: dict[str, str] = {}
    for r in runs:
        newest[r.experiment] = max(newest.get(r.experiment, ""), r.search)
    return [r for r in runs if r.search == newest[r.experiment]]


def _resolve_named(spec: str, root: Path, phase: str | None) -> list[Run]:
    if ":" in spec:
        exp, _, cid = spec.partition(":")
        runs = [r for r in load_experiment(exp, root) if r.config_id == cid and (phase is None or r.phase == phase)]
        if not runs:
            have = sorted({f"{r.config_id} ({r.phase})" for r in load_experiment(exp, root)})
            raise RaysentError(f"{spec!r}: experiment {exp!r} has no {phase + '-phase ' if phase else ''}runs of "
                               f"config_id {cid!r}; it has {', '.join(have)} (--phase picks the phase)")
        return runs
    if (root / spec / "runs").is_dir():
        return load_experiment(spec, root, phase)
    matches: list[Run] = []
    for exp in experiments(root):
        matches += [r for r in load_experiment(exp, root) if r.config_id == spec]
    if not matches:
        have = experiments(root)
        raise RaysentError(f"{spec!r} is neither an experiment under {root} ({', '.join(have) or 'none'}), nor a "
                           "config_id of their run files, nor a glob of run files (e.g. "
                           "'results/quick/runs/final-*.json')")
    in_phase = [r for r in matches if phase is None or r.phase == phase]
    if not in_phase:
        present = sorted({r.phase for r in matches})
        raise RaysentError(f"config_id {spec!r} has no {phase}-phase runs (phases present: {', '.join(present)}); "
                           f"use --phase {present[0]}")
    exps = sorted({r.experiment for r in in_phase})
    if len(exps) > 1:
        raise RaysentError(f"config_id {spec!r} is in several experiments ({', '.join(exps)}); name one as "
                           f"EXPERIMENT:{spec}")
    return in_phase


def check_aggregation(runs: list[Run], aggregation: str) -> None:
    """Refuse an aggregation a run file does not hold, saying which ones it does."""
    check_choice(aggregation, AGGREGATIONS, "--aggregation")
    for r in runs:
        if r.has_test_scores() and aggregation not in r.available_aggregations():
            have = r.available_aggregations()
            raise RaysentError(
                f"{r.path}: holds STS12-16 only in the aggregation(s) {', '.join(have)} (eval.sts.tasks has "
                f"no spearman_{aggregation}/pearson_{aggregation}); use --aggregation {have[0]}")


def available_fields(runs: list[Run]) -> list[str]:
    names: set[str] = set()
    for r in runs:
        names.update(r.fields())
    return sorted(names)


def check_fields(runs: list[Run], names: list[str], option: str = "--group-by") -> None:
    have = available_fields(runs)
    for n in names:
        if n not in have:
            plain = [h for h in have if "." not in h]
            raise RaysentError(
                f"{option} {n!r}: not a field of these run files{did_you_mean(n, have)}; available: "
                f"{', '.join(plain)}; or a dotted config path ({', '.join(h for h in have if '.' in h)})")


def format_value(v: Any) -> str:
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, float):
        return f"{v:.3g}"
    if isinstance(v, tuple):
        return "[" + ", ".join(format_value(x) for x in v) + "]"
    return str(v)


def short_model(name: str) -> str:
    return name.rstrip("/").split("/")[-1]
