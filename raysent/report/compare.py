"""Is a difference beyond seed noise? ``raysent compare RUN_A RUN_B [RUN_C ...]``.

Each RUN is an experiment (its final-phase runs), ``EXPERIMENT:CONFIG_ID``, a config_id, or a glob
of run files (:func:`raysent.report.runs.resolve`); it must name one configuration per seed. The
runs of B (and C, ...) are paired with A's by seed; for every data set (STS12 ... SICK-R, Avg, and
the best dev score) over the seeds both sides have:

* Δ = mean of (B − A) over the paired seeds, with the sample std of the differences (n−1);
* the paired t-test (``scipy.stats.ttest_rel(B, A)``, two-sided): needs n ≥ 2 and differences
  that are not all equal;
* Wilcoxon's signed-rank test (``scipy.stats.wilcoxon(B, A)``, two-sided, exact for small n):
  with n paired seeds its smallest possible p is 2/2^n, so it needs n ≥ 6 to reach p < 0.05.

Seeds that only one side has are left out and named.

Each side is also marked where its runs did not learn (``learned``, ``not_learned_seeds``: seeds whose
best dev checkpoint is step 0, so they report the untouched encoder, as ``raysent table``'s
``[no learning: k/n at step 0]``), and each comparison names the paired seeds on which neither side
learned (``neither_learned_seeds``; ``neither_learned`` when that is every paired seed): there Δ is
between two untrained encoders (the input model as each side reads it, e.g. another pooling), not a
gain from training. Imports no Ray.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from raysent.errors import RaysentError
from raysent.eval.results import Aggregation, Correlation
from raysent.report.budget import BudgetCurve
from raysent.report.runs import (
    AGGREGATIONS,
    CORRELATIONS,
    TASK_LABELS,
    TASKS,
    Run,
    check_aggregation,
    check_choice,
    format_value,
    resolve,
    short_model,
)

# Lazy imports: scipy (heavy; only the paired tests need it).

COLUMNS = (*TASKS, "avg", "dev")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Paired(_Model):
    """One data set's paired statistics over the seeds both sides have (:func:`paired`); a side with no score
    there has its own mean and std only, and ``note`` says why."""

    seeds: list[int]
    n: int
    a_mean: float | None = None
    a_std: float | None = None
    b_mean: float | None = None
    b_std: float | None = None
    diff_mean: float | None = None
    diff_std: float | None = None
    t_p: float | None = None
    wilcoxon_p: float | None = None
    note: str = ""
    unpaired_seeds: list[int] = Field(default_factory=list, description="seeds only one side has, left out")


class Side(_Model):
    """One side of a comparison: the runs a RUN argument names, and whether they learned."""

    spec: str
    experiment: str
    phase: str
    config_id: str
    search: str
    method: str
    model: str
    hp: dict[str, str]
    seeds: list[int]
    # None: nothing trained (a baseline) or records without best_step; False: some seed kept step 0
    learned: bool | None
    not_learned_seeds: list[int] = Field(default_factory=list)
    budget: BudgetCurve | None = Field(None, description="its search's budget curve (compare(..., budget=True))")

    def no_learning_mark(self) -> str:
        """``[no learning: k/n at step 0]`` (and which seeds, when not all) for a side whose runs did not learn."""
        flat = self.not_learned_seeds
        if not flat:
            return ""
        which = ("" if len(flat) == len(self.seeds)
                 else f", seed{'s' if len(flat) > 1 else ''} {', '.join(map(str, flat))}")
        return f"[no learning: {len(flat)}/{len(self.seeds)} at step 0{which}]"


class SideComparison(_Model):
    """One RUN (B) against the first (A): per data set the paired statistics, and which seeds pair."""

    run: Side
    tasks: dict[str, Paired]
    same_runs: bool
    only_in_a: list[int]
    only_in_b: list[int]
    neither_learned_seeds: list[int] = Field(default_factory=list)
    neither_learned: bool = False  # neither side learned on any paired seed

    @property
    def paired_seeds(self) -> int:
        """The most seeds any data set pairs."""
        return max((r.n for r in self.tasks.values()), default=0)


class ComparisonResult(_Model):
    """What ``raysent compare`` finds (:func:`compare`); its JSON is ``--format json``'s output."""

    aggregation: Aggregation
    correlation: Correlation
    baseline: Side
    comparisons: list[SideComparison]
    budgets: bool = Field(False, description="whether each side's budget curve was looked for")

    def to_json(self) -> dict[str, Any]:
        """As ``raysent compare --format json`` prints it and a suite's compare.json holds it: a side's ``budget``
        only where the curves were looked for, a data set's ``unpaired_seeds`` only where there are some."""
        out = self.model_dump(exclude={"budgets"})
        for side in [out["baseline"], *(c["run"] for c in out["comparisons"])]:
            if not self.budgets:
                del side["budget"]
        for comp in out["comparisons"]:
            for row in comp["tasks"].values():
                if not row["unpaired_seeds"]:
                    del row["unpaired_seeds"]
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ComparisonResult:
        """What :meth:`to_json` wrote (a side with a ``budget`` key: the curves were looked for)."""
        return cls.model_validate({**data, "budgets": "budget" in data.get("baseline", {})})


def by_seed(runs: list[Run], spec: str) -> dict[int, Run]:
    out: dict[int, Run] = {}
    for r in runs:
        if r.seed in out:
            other = out[r.seed]
            configs = sorted({x.config_id for x in runs})
            raise RaysentError(
                f"{spec!r} names more than one run of seed {r.seed} ({other.path.name}, {r.path.name}; config_ids "
                f"{', '.join(configs)}): name one configuration, e.g. {r.experiment}:{r.config_id} or a glob of its "
                "run files")
        out[r.seed] = r
    return out


def _p(fn: Callable[..., Any], b: np.ndarray, a: np.ndarray) -> float | None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            p = float(fn(b, a).pvalue)
    except ValueError:
        return None
    return p if math.isfinite(p) else None


def paired(a: dict[int, float], b: dict[int, float]) -> Paired:
    """The paired statistics of two {seed: value} maps (seeds in both only)."""
    from scipy import stats

    seeds = sorted(set(a) & set(b))
    av = np.array([a[s] for s in seeds], dtype=float)
    bv = np.array([b[s] for s in seeds], dtype=float)
    d = bv - av
    n = len(seeds)
    res = Paired(seeds=seeds, n=n, a_mean=float(av.mean()) if n else None,
                 a_std=float(av.std(ddof=1)) if n > 1 else None, b_mean=float(bv.mean()) if n else None,
                 b_std=float(bv.std(ddof=1)) if n > 1 else None, diff_mean=float(d.mean()) if n else None,
                 diff_std=float(d.std(ddof=1)) if n > 1 else None)
    if n < 2:
        res.note = "fewer than 2 paired seeds: no test"
        return res
    if np.ptp(d) <= 1e-9 * max(1.0, float(np.abs(d).max())):  # equal up to float rounding
        res.note = "all differences equal: the t-test is undefined"
    else:
        res.t_p = _p(stats.ttest_rel, bv, av)
    if np.all(np.abs(d) <= 1e-12):
        res.note = "no difference on any seed"
    else:
        res.wilcoxon_p = _p(stats.wilcoxon, bv, av)
    return res


def _one_sided(vals: dict[int, float], side: str, runs: dict[int, Run], column: str) -> Paired:
    """A data set only one side (``side``: "a" or "b") has a score on: that side's mean and std, and why."""
    values = list(vals.values())
    mean, std = float(np.mean(values)), float(np.std(values, ddof=1)) if len(values) > 1 else None
    res = paired({}, {})
    res.a_mean, res.a_std = (mean, std) if side == "a" else (None, None)
    res.b_mean, res.b_std = (mean, std) if side == "b" else (None, None)
    searched = column in (*TASKS, "avg") and any(r.phase == "search" for r in runs.values())
    res.note = f"{'B' if side == 'a' else 'A'} has no {TASK_LABELS[column]} score" + (
        " (search-phase runs are not evaluated on the test sets)" if searched else "")
    return res


def paired_tasks(base: dict[int, Run], other: dict[int, Run], aggregation: Aggregation,
                 correlation: Correlation) -> dict[str, Paired]:
    """Every column (:data:`COLUMNS`) either side has a score for: B against A, paired by seed."""
    rows: dict[str, Paired] = {}
    for c in COLUMNS:
        a = {s: v for s, r in base.items() if (v := r.score(c, aggregation, correlation)) is not None}
        b = {s: v for s, r in other.items() if (v := r.score(c, aggregation, correlation)) is not None}
        if not a and not b:
            continue
        if not a or not b:
            rows[c] = _one_sided(a, "a", base, c) if a else _one_sided(b, "b", other, c)
            continue
        rows[c] = paired(a, b)
        rows[c].unpaired_seeds = sorted(set(a) ^ set(b))
    return rows


def compare(specs: list[str], results_dir: str | Path = "results", phase: str | None = "final",
            aggregation: str = "all", correlation: str = "spearman", budget: bool = False,
            search: str | None = None) -> ComparisonResult:
    """Every RUN after the first against the first (see the module docstring); ``budget``: each side's search's
    budget curve too (``budget`` of the baseline and of each comparison's run; None where there is none)."""
    if len(specs) < 2:
        raise RaysentError("raysent compare needs at least two runs: RUN_A RUN_B [RUN_C ...]")
    agg: Aggregation = check_choice(aggregation, AGGREGATIONS, "--aggregation")
    corr: Correlation = check_choice(correlation, CORRELATIONS, "--correlation")
    sides = []
    for spec in specs:
        runs = resolve(spec, results_dir, phase, search)
        check_aggregation(runs, agg)
        sides.append((spec, by_seed(runs, spec)))
    base_spec, base = sides[0]
    comparisons = []
    for spec, other in sides[1:]:
        both = sorted(set(base) & set(other))
        neither = [s for s in both if base[s].learned is False and other[s].learned is False]
        comparisons.append(SideComparison(
            run=describe(spec, other, results_dir if budget else None),
            tasks=paired_tasks(base, other, agg, corr),
            same_runs={r.path.resolve() for r in base.values()} == {r.path.resolve() for r in other.values()},
            only_in_a=sorted(set(base) - set(other)), only_in_b=sorted(set(other) - set(base)),
            neither_learned_seeds=neither, neither_learned=bool(neither) and neither == both))
    return ComparisonResult(aggregation=agg, correlation=corr,
                            baseline=describe(base_spec, base, results_dir if budget else None),
                            comparisons=comparisons, budgets=budget)


def search_budget_of_runs(runs: dict[int, Run], results_dir: str | Path) -> BudgetCurve | None:
    """The budget curve (:mod:`raysent.report.budget`) of the search the runs come from: the one its summary.json
    holds, else computed from the search's records; None for runs of several searches or of none."""
    import json

    from raysent.report.budget import search_budget

    rs = list(runs.values())
    keys = {(r.experiment, r.search) for r in rs}
    if len(keys) != 1:
        return None
    (experiment, search) = keys.pop()
    exp = Path(results_dir) / experiment
    summary = exp / "summary.json"
    if summary.is_file():
        data = json.loads(summary.read_text())
        if data.get("search") == search and data.get("budget"):
            return BudgetCurve.model_validate(data["budget"])
    search_cfg = rs[0].record.config.get("search") or {}
    return search_budget(exp, search, search_cfg.get("mode", "max"), seeds=search_cfg.get("seeds"),
                         final_config=rs[0].config_id if rs[0].phase == "final" else None)


def describe(spec: str, runs: dict[int, Run], budget_from: str | Path | None = None) -> Side:
    """The side a RUN argument names (``budget_from``: the results folder to find its search's budget curve in)."""
    rs = list(runs.values())
    r0 = rs[0]
    flat = sorted(s for s, r in runs.items() if r.learned is False)
    return Side(spec=spec, experiment=r0.experiment, phase=",".join(sorted({r.phase for r in rs})),
                config_id=",".join(sorted({r.config_id for r in rs})),
                search=",".join(sorted({r.search for r in rs})), method=r0.method,
                model=short_model(r0.model), hp={k: format_value(v) for k, v in r0.hp.items()},
                seeds=sorted(runs), learned=None if all(r.learned is None for r in rs) else not flat,
                not_learned_seeds=flat,
                budget=search_budget_of_runs(runs, budget_from) if budget_from is not None else None)


def _fmt(m: float | None, s: float | None) -> str:
    if m is None:
        return "—"
    return f"{m:.2f}" + (f"±{s:.2f}" if s is not None else "")


def _fmt_p(p: float | None, alpha: float) -> str:
    if p is None:
        return "—"
    return (f"{p:.3g}" if p >= 1e-3 else f"{p:.1e}") + (" *" if p < alpha else "")


def _who(d: Side) -> str:
    hp = ", ".join(f"{k}={v}" for k, v in d.hp.items())
    return (f"{d.spec}: {d.experiment} {d.phase} {d.config_id} {d.method} {d.model}"
            + (f" [search {d.search}]" if d.search else "")
            + (f" ({hp})" if hp else "") + f", seeds {', '.join(map(str, d.seeds))}"
            + (f" {mark}" if (mark := d.no_learning_mark()) else ""))


def _task_rows(comp: SideComparison, alpha: float) -> list[str]:
    """The table of one comparison: a row per data set."""
    head = ["set", "A", "B", "Δ (B−A)", "n", "t-test p", "Wilcoxon p", ""]
    body = []
    for c, r in comp.tasks.items():
        body.append([TASK_LABELS[c] + (" (best)" if c == "dev" else ""), _fmt(r.a_mean, r.a_std),
                     _fmt(r.b_mean, r.b_std),
                     "—" if r.diff_mean is None else f"{r.diff_mean:+.2f}"
                     + (f"±{r.diff_std:.2f}" if r.diff_std is not None else ""),
                     str(r.n), _fmt_p(r.t_p, alpha), _fmt_p(r.wilcoxon_p, alpha),
                     r.note + (f" (seeds {', '.join(map(str, r.unpaired_seeds))} unpaired, left out)"
                               if r.unpaired_seeds else "")])
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body)]
    return ["  ".join(str(x).ljust(w) if i in (0, 7) else str(x).rjust(w)
                      for i, (x, w) in enumerate(zip(row, widths))).rstrip() for row in [head, *body]]


def _notes(res: ComparisonResult, comp: SideComparison) -> list[str]:
    """What a comparison's table does not say: sides that did not learn, unpaired seeds, too few seeds."""
    lines = []
    flat_sides = [x for x, d in (("A", res.baseline), ("B", comp.run)) if d.not_learned_seeds]
    if flat_sides:
        lines.append(f"note: {' and '.join(flat_sides)} {'are' if len(flat_sides) > 1 else 'is'} marked "
                     "[no learning: k/n at step 0]: in k of n runs the best dev checkpoint is step 0, so those "
                     "runs report the untouched encoder, not what training made of it")
    neither = comp.neither_learned_seeds
    if comp.neither_learned:
        lines.append("note: NEITHER A NOR B LEARNED (best dev checkpoint at step 0 on every paired seed): Δ is "
                     "between two untrained encoders (the input model as each side reads it, e.g. another "
                     "pooling), not a gain from training")
    elif neither:
        lines.append(f"note: on seed{'s' if len(neither) > 1 else ''} {', '.join(map(str, neither))} neither A "
                     "nor B learned (both best at step 0): there Δ is between two untrained encoders, not a "
                     "gain from training")
    if comp.same_runs:
        lines.append("note: A and B are the same run files")
    if comp.only_in_a or comp.only_in_b:
        lines.append(f"unpaired seeds left out: only in A {comp.only_in_a or '-'}, only in B "
                     f"{comp.only_in_b or '-'}")
    n = comp.paired_seeds
    if 0 < n < 6:
        lines.append(f"note: with {n} paired seeds Wilcoxon's smallest possible p is {2 / 2 ** n:.3g} "
                     "(it needs 6 seeds to reach p < 0.05)")
    return lines


def format_comparison(res: ComparisonResult, alpha: float = 0.05) -> str:
    lines = [f"A = {_who(res.baseline)}"]
    for comp in res.comparisons:
        lines += ["", f"B = {_who(comp.run)}",
                  f"{res.correlation.capitalize()} x100; STS12-16 '{res.aggregation}'; mean±std over the "
                  f"paired seeds (sample std); Δ = B − A; p two-sided; * p < {alpha}"]
        lines += _task_rows(comp, alpha)
        lines += _notes(res, comp)
    lines += format_budgets(res)
    return "\n".join(lines)


def format_budgets(res: ComparisonResult) -> list[str]:
    """The budget curves of the sides' searches, side by side: the expected best of n configurations (95 %
    bootstrap band) at the n every side has, its steps and its verdict (``compare(..., budget=True)``)."""
    sides = [("A", res.baseline.budget)] + [(f"B{'' if len(res.comparisons) == 1 else i}", c.run.budget)
                                           for i, c in enumerate(res.comparisons, 1)]
    curves = [(name, b) for name, b in sides if b is not None]
    if not curves:
        return ["", "budget curves: none of the sides comes from one search"] if res.budgets else []
    common = min(c.configurations for _, c in curves)
    shown = sorted({1, *(n for n in (2, 4, 8, 16, 32) if n < common), common})
    lines = ["", "budget curves: expected best dev of n configurations of each side's search (mean over seeds; "
             f"{curves[0][1].estimator}; [95 % bootstrap band])"]
    for name, c in curves:
        cells = "  ".join(f"n={n} {c.at(n):.2f} [{c.band_low[n - 1]:.2f}, {c.band_high[n - 1]:.2f}]" for n in shown)
        steps = f"; {c.steps_total:,} steps" if c.steps_total is not None else ""
        lines.append(f"  {name}: {cells}  (N={c.configurations}{steps})")
        lines.append(f"     {c.verdict}")
    missing = [name for name, b in sides if b is None]
    if missing:
        lines.append(f"  {', '.join(missing)}: no search's budget curve (runs of several searches, or of none)")
    return lines
