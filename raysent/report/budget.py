"""Budget curves: how good the best configuration a search finds is, as a function of how much it searched.

Given the N configurations a search tried, each scored by the mean over its seeds of the best dev score (the
number the search ranks them by), the **expected best of n configurations**, n = 1..N, is the expected maximum
of n scores drawn from those N:

* **without replacement** (the default here): n distinct configurations of the N, every subset equally likely.
  With the scores sorted, v_(1) ≤ … ≤ v_(N),

      E[max of n] = Σ_i v_(i) · C(i−1, n−1) / C(N, n)

  (v_(i) is the maximum of exactly the C(i−1, n−1) subsets whose other n−1 members are below it). It is the
  unbiased estimator (a U-statistic) of the expected maximum of n configurations drawn from the distribution
  the N came from (Dodge, Gururangan, Card, Schwartz, Smith 2021, "Expected Validation Performance and
  Estimation of a Random Variable's Maximum", Findings of EMNLP, arXiv:2110.00613), and at n = N it is the
  best score the search found.
* **with replacement**: n draws from the empirical distribution of the N scores,
  E[max of n] = Σ_i v_(i) · [F̂(v_(i))^n − F̂(v_(i−1))^n] with F̂ the empirical CDF. This is *expected
  validation performance* as Dodge, Gururangan, Card, Schwartz, Smith 2019 ("Show Your Work: Improved
  Reporting of Experimental Results", EMNLP, arXiv:1909.03004, Eq. 1-2) defined it; a V-statistic, biased
  low for n > 1 (the 2021 paper), below the best found at n = N.

Both treat the N configurations as independent draws. That is how random search draws them; TPE and GP choose
each configuration from the ones before, so for them the curve answers "how much better is the best of n than
one of these N at random", not "what would this sampler have found after n" (the observed best so far, in the
order the configurations finished, is kept beside it).

The **band** is a bootstrap: the N scores resampled with replacement (1,000 times, seeded) and the curve
computed on each; the band holds the middle 95 % at each n. Against **optimizer steps**: n configurations cost
n times the search's mean steps per configuration in expectation (every seed's steps; a trial an early-stopping
scheduler cut short counts the steps it trained). The **verdict** says whether the curve had flattened: the
expected gain of the last configuration, E[max of N] − E[max of N−1], against the seed noise of one
configuration's score, the standard error of a seed mean (the pooled sample std over seeds of the search's
configurations, / √seeds): a last gain below that noise is *flattened*, above it *still rising*.

Pure numpy and scipy (and the run records' schema); imports no Ray and no MLflow.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict

Estimator = Literal["without replacement", "with replacement"]
RESAMPLES = 1000
LEVEL = 0.95
METRIC_PREFIX = "budget/expected_best_at_"
CITATION = {
    "without replacement": "Dodge et al. 2021, arXiv:2110.00613 (the unbiased estimator)",
    "with replacement": "Dodge et al. 2019, Show Your Work, arXiv:1909.03004 (expected validation performance)",
}


# --------------------------------------------------------------------------- the closed forms
def _weights(n_total: int, replacement: bool) -> np.ndarray:
    """W[n−1, i]: the weight of the (i+1)-th smallest of N scores in E[max of n], n = 1..N."""
    w = np.zeros((n_total, n_total))
    for n in range(1, n_total + 1):
        if replacement:
            i = np.arange(1, n_total + 1)
            w[n - 1] = (i / n_total) ** n - ((i - 1) / n_total) ** n
        else:
            total = math.comb(n_total, n)
            w[n - 1] = [math.comb(i, n - 1) / total for i in range(n_total)]
    return w


def expected_max_curve(scores: Sequence[float], mode: str = "max", replacement: bool = False) -> np.ndarray:
    """E[best of n of ``scores``], n = 1..N (``mode`` "min": the expected minimum); see the module docstring."""
    v = np.asarray(scores, dtype=float)
    if v.ndim != 1 or len(v) == 0:
        raise ValueError("expected_max_curve needs a non-empty list of scores")
    if not np.all(np.isfinite(v)):
        raise ValueError(f"expected_max_curve: scores must be finite, got {v.tolist()}")
    sign = -1.0 if mode == "min" else 1.0
    return sign * (_weights(len(v), replacement) @ np.sort(sign * v))


def expected_max(scores: Sequence[float], n: int, mode: str = "max", replacement: bool = False) -> float:
    """E[best of n of ``scores``] for one n (1 ≤ n ≤ N)."""
    if not 1 <= n <= len(scores):
        raise ValueError(f"n must be between 1 and {len(scores)}, got {n}")
    return float(expected_max_curve(scores, mode, replacement)[n - 1])


def bootstrap_band(scores: Sequence[float], mode: str = "max", replacement: bool = False,
                   resamples: int = RESAMPLES, level: float = LEVEL, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The middle ``level`` of the curve over ``resamples`` bootstrap resamples of the N scores (seeded)."""
    v = np.asarray(scores, dtype=float)
    sign = -1.0 if mode == "min" else 1.0
    rng = np.random.default_rng(seed)
    draws = np.sort(sign * v[rng.integers(0, len(v), size=(resamples, len(v)))], axis=1)
    curves = sign * (draws @ _weights(len(v), replacement).T)
    tail = (1 - level) / 2 * 100
    lo, hi = np.percentile(curves, [tail, 100 - tail], axis=0)
    return (np.minimum(lo, hi), np.maximum(lo, hi)) if mode == "min" else (lo, hi)


def pooled_seed_sd(groups: Iterable[Sequence[float]]) -> float | None:
    """The pooled sample std over seeds of configurations with 2+ seeds: sqrt(Σ (n_i−1) s_i² / Σ (n_i−1));
    None without such a configuration."""
    num = den = 0.0
    for g in groups:
        x = np.asarray(g, dtype=float)
        if len(x) > 1:
            num += float(np.var(x, ddof=1)) * (len(x) - 1)
            den += len(x) - 1
    return math.sqrt(num / den) if den else None


# --------------------------------------------------------------------------- a search's curve
class BudgetCurve(BaseModel):
    """A search's budget curve, as summary.json holds it (``budget``)."""

    model_config = ConfigDict(extra="forbid")

    metric: str = "best_dev_spearman"  # what each configuration's score is: the mean over its seeds of this
    mode: Literal["max", "min"] = "max"
    estimator: Estimator = "without replacement"
    configurations: int  # N
    scores: list[float]  # each configuration's seed mean, in the order the configurations finished
    config_ids: list[str] = []
    stopped_configurations: int = 0  # of N, cut short by an early-stopping scheduler (their score so far)
    expected_best: list[float]  # n = 1..N
    band_low: list[float]
    band_high: list[float]
    band: str = f"bootstrap {LEVEL:.0%} ({RESAMPLES} resamples of the N configurations)"
    observed_best: list[float]  # the best so far, in the order the configurations finished
    steps: list[int] | None = None  # each configuration's optimizer steps (every seed), in the order of scores
    steps_total: int | None = None  # optimizer steps of every seed of every configuration (None: unknown)
    steps_per_configuration: float | None = None
    expected_steps: list[float] | None = None  # n × steps_per_configuration
    seeds_per_configuration: int = 1
    seed_sd: float | None = None  # the pooled sample std over seeds of one configuration's score
    seed_sd_from: str | None = None  # "search" (its configurations' seeds) or "final phase" (the winner's)
    seed_noise: float | None = None  # seed_sd / √seeds_per_configuration
    last_gain: float | None = None  # E[best of N] − E[best of N−1]
    flattened: bool | None = None
    verdict: str

    def at(self, n: int) -> float:
        return self.expected_best[n - 1]


def verdict(curve: Sequence[float], seed_noise: float | None, mode: str = "max",
            noise_text: str = "") -> tuple[float | None, bool | None, str]:
    """(last gain, flattened?, the sentence) for a curve: the expected gain of the last configuration against the
    seed noise of one configuration's score (see the module docstring)."""
    n = len(curve)
    if n < 2:
        return None, None, "one configuration: no curve to judge whether more search would help."
    gain = float(curve[-1] - curve[-2]) * (-1 if mode == "min" else 1)
    test = f"test: E[best of {n}] − E[best of {n - 1}] against the seed noise of one configuration's score"
    if seed_noise is None:
        return gain, None, (f"Cannot tell whether the curve has flattened: configuration {n} added an expected "
                            f"{gain:.2f} points, and there is no seed noise to compare it with (one seed per "
                            f"configuration and no final phase; {test}).")
    if gain < seed_noise:
        return gain, True, (f"Flattened at {n} configurations: the last one added an expected {gain:.2f} points, less "
                            f"than the seed noise of one configuration's score, {seed_noise:.2f}{noise_text}; more "
                            f"configurations of this space would mostly add seed noise ({test}).")
    return gain, False, (f"Still rising at {n} configurations: the last one added an expected {gain:.2f} points, more "
                         f"than the seed noise of one configuration's score, {seed_noise:.2f}{noise_text}; more "
                         f"configurations would likely find a better one ({test}).")


def budget_curve(scores: Sequence[float], steps: Sequence[int | None] | None = None, mode: str = "max",
                 seeds_per_configuration: int = 1, seed_sd: float | None = None, seed_sd_from: str | None = None,
                 replacement: bool = False, config_ids: Sequence[str] = (), stopped: int = 0,
                 metric: str = "best_dev_spearman", seed: int = 0) -> BudgetCurve:
    """The curve of N configuration scores (in the order they finished; ``steps``: each one's optimizer steps,
    None where unknown) with its bootstrap band and verdict."""
    curve = expected_max_curve(scores, mode, replacement)
    lo, hi = bootstrap_band(scores, mode, replacement, seed=seed)
    running = (np.minimum if mode == "min" else np.maximum).accumulate(np.asarray(scores, dtype=float))
    total = per = expected = each = None
    if steps is not None and len(steps) == len(scores) and all(s is not None for s in steps):
        each = [int(s) for s in steps if s is not None]
        total = sum(each)
        per = total / len(scores)
        expected = [per * n for n in range(1, len(scores) + 1)]
    noise = seed_sd / math.sqrt(seeds_per_configuration) if seed_sd is not None else None
    text = (f" (the pooled seed std of the {seed_sd_from or 'search'}, {seed_sd:.2f}, / √{seeds_per_configuration})"
            if seed_sd is not None else "")
    gain, flat, sentence = verdict(curve.tolist(), noise, mode, text)
    return BudgetCurve(metric=metric, mode=mode, estimator="with replacement" if replacement else "without replacement",
                       configurations=len(scores), scores=[float(s) for s in scores], config_ids=list(config_ids),
                       stopped_configurations=stopped, expected_best=curve.tolist(), band_low=lo.tolist(),
                       band_high=hi.tolist(), observed_best=running.tolist(), steps=each, steps_total=total,
                       steps_per_configuration=per, expected_steps=expected,
                       seeds_per_configuration=seeds_per_configuration, seed_sd=seed_sd, seed_sd_from=seed_sd_from,
                       seed_noise=noise, last_gain=gain, flattened=flat, verdict=sentence)


# --------------------------------------------------------------------------- from a search's run records
def steps_spent(record) -> int | None:
    """The optimizer steps one run record trained, every stage: a run a scheduler stopped counts the steps up to the
    stop (its dev curve holds every stage it reached, a new stage starting again at step 0); a finished run its
    last stage's steps and the steps of the stages before it (:func:`earlier_stage_steps`)."""
    if record.stopped:
        segments, last = 0, None
        for p in record.dev_curve:
            if last is not None and p.step < last:
                segments += last
            last = p.step
        return segments + int(record.final_step if record.final_step is not None else (last or 0))
    if record.final_step is None:
        return None
    earlier = earlier_stage_steps(record)
    return None if earlier is None else int(record.final_step) + earlier


def earlier_stage_steps(record) -> int | None:
    """The steps of a multi-stage run's stages before its last (ConSERT's sup-unsup, joint-unsup): each
    ``train.max_steps`` of that stage's config (an earlier stage runs without patience); None when a stage is
    given in epochs only. 0 for a one-stage method."""
    from raysent.methods.spec import PREVIOUS_STAGE_BEST, MethodSpec, get_spec

    method = get_spec(record.method)
    if next(k for k in method.__mro__ if "stages" in vars(k)) is MethodSpec:  # it keeps the one stage of MethodSpec
        return 0
    from raysent.config import parse_config, with_overrides

    cfg = parse_config(record.config, source=f"the record of {record.config_id} seed {record.seed}",
                       check_search=False)
    stages = method.stages(cfg) or []
    total = 0
    for _, overrides in stages[:-1]:
        stage = with_overrides(cfg, {k: v for k, v in overrides.items() if v != PREVIOUS_STAGE_BEST})
        if not stage.train.max_steps:
            return None
        total += stage.train.max_steps
    return total


def search_budget(exp: str | Path, run: str, mode: str = "max", seeds: int | None = None,
                  final_config: str | None = None, replacement: bool = False) -> BudgetCurve | None:
    """The budget curve of search ``run`` of the experiment folder ``exp``, from its run records: every
    configuration that finished (``runs/``) or that a scheduler stopped (``stopped/``, at its score so far); failed
    trials left no score and are not counted. The seed noise comes from the search's configurations with 2+ seeds,
    else from the final phase of ``final_config`` (the winner, on every seed). None: no configuration."""
    from raysent.train.records import read_record

    exp = Path(exp)
    groups: dict[str, list] = {}
    for folder in ("runs", "stopped"):
        for p in sorted((exp / folder).glob(f"search-{run}-*.json")):
            rec = read_record(p)
            groups.setdefault(rec.config_id, []).append(rec)
    if not groups:
        return None
    order = sorted(groups, key=lambda c: (max(r.finished_at or 0.0 for r in groups[c]), c))
    scores = [float(np.mean([r.best_dev_spearman for r in groups[c]])) for c in order]
    steps = [_sum_or_none(steps_spent(r) for r in groups[c]) for c in order]
    finished = [[r.best_dev_spearman for r in groups[c]] for c in order if not any(r.stopped for r in groups[c])]
    sd, source = pooled_seed_sd(finished), "search"
    if sd is None and final_config:
        final = [read_record(p).best_dev_spearman for p in sorted((exp / "runs").glob(f"final-{run}-{final_config}-*"))]
        sd, source = pooled_seed_sd([final]), "final phase"
    k = seeds or int(np.median([len(groups[c]) for c in order]))
    stopped = sum(1 for c in order if any(r.stopped for r in groups[c]))
    return budget_curve(scores, steps, mode, seeds_per_configuration=k, seed_sd=sd,
                        seed_sd_from=source if sd is not None else None, replacement=replacement, config_ids=order,
                        stopped=stopped)


def _sum_or_none(values: Iterable[int | None]) -> int | None:
    vals = list(values)
    return None if any(v is None for v in vals) else int(sum(v for v in vals if v is not None))


# --------------------------------------------------------------------------- how it is shown
def budget_metrics(curve: BudgetCurve) -> dict[str, float]:
    """The parent MLflow run's metrics: ``budget/expected_best_at_{n}`` for n = 1..N, and the verdict's numbers."""
    out = {f"{METRIC_PREFIX}{n}": v for n, v in enumerate(curve.expected_best, 1)}
    out.update({f"budget/band_low_at_{n}": v for n, v in enumerate(curve.band_low, 1)})
    out.update({f"budget/band_high_at_{n}": v for n, v in enumerate(curve.band_high, 1)})
    extra: dict[str, Any] = {"budget/configurations": curve.configurations, "budget/steps_total": curve.steps_total,
                             "budget/last_gain": curve.last_gain, "budget/seed_noise": curve.seed_noise,
                             "budget/flattened": None if curve.flattened is None else float(curve.flattened)}
    out.update({k: float(v) for k, v in extra.items() if v is not None})
    return out


def budget_markdown(curve: BudgetCurve, title: str = "## Budget curve", label: str = "") -> str:
    """The curve as a markdown section: a row per n, then the verdict (summary.md, the model card)."""
    what = "max" if curve.mode == "max" else "min"
    lines = [title, "",
             f"Expected best dev score (the {what} over configurations of each one's mean {curve.metric} over its "
             f"{curve.seeds_per_configuration} seed(s)) of n of the {curve.configurations} configurations "
             f"{label or 'this search'} tried, drawn {curve.estimator} ({CITATION[curve.estimator]}); "
             f"band: {curve.band}."
             + (f" {curve.stopped_configurations} configuration(s) were stopped early and count with their score "
                "at the stop." if curve.stopped_configurations else ""), "",
             "| n | expected best | 95 % band | observed best so far | expected optimizer steps |",
             "| ---: | ---: | :---: | ---: | ---: |"]
    for n in range(1, curve.configurations + 1):
        steps = f"{curve.expected_steps[n - 1]:,.0f}" if curve.expected_steps else "—"
        lines.append(f"| {n} | {curve.at(n):.2f} | {curve.band_low[n - 1]:.2f}–{curve.band_high[n - 1]:.2f} | "
                     f"{curve.observed_best[n - 1]:.2f} | {steps} |")
    lines += ["", f"Steps: {curve.steps_total:,} optimizer steps over every seed of every configuration "
              f"({curve.steps_per_configuration:,.0f} per configuration)." if curve.steps_total is not None else
              "Steps: unknown (a stage given in epochs only).", "", curve.verdict]
    return "\n".join(lines) + "\n"


def budget_lines(curve: BudgetCurve) -> list[str]:
    """The summary's lines: the curve at a few n, the steps, the verdict."""
    n_total = curve.configurations
    shown = sorted({1, *(n for n in (2, 4, 8, 16, 32, 64) if n < n_total), n_total})
    points = ", ".join(f"n={n} {curve.at(n):.2f} [{curve.band_low[n - 1]:.2f}, {curve.band_high[n - 1]:.2f}]"
                       for n in shown)
    steps = (f"; {curve.steps_total:,} optimizer steps ({curve.steps_per_configuration:,.0f} per configuration)"
             if curve.steps_total is not None else "")
    return [f"budget curve (expected best dev of n configurations, {curve.estimator}; 95 % bootstrap band): "
            f"{points}{steps}", f"  {curve.verdict}"]
