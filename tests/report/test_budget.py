"""Budget curves (raysent.report.budget): the closed forms of the expected best of n configurations against
brute-force enumeration and a case worked by hand, the bootstrap band, the verdict, the steps a search spent,
and a search's curve from its run records."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest

from raysent.report.budget import (
    BudgetCurve,
    bootstrap_band,
    budget_curve,
    budget_markdown,
    budget_metrics,
    expected_max,
    expected_max_curve,
    pooled_seed_sd,
    search_budget,
    steps_spent,
)
from raysent.train.records import RunRecord


def brute_without(scores, n, best=max):
    subsets = list(itertools.combinations(scores, n))
    return sum(best(s) for s in subsets) / len(subsets)


def brute_with(scores, n, best=max):
    draws = list(itertools.product(scores, repeat=n))
    return sum(best(d) for d in draws) / len(draws)


@pytest.mark.parametrize("n_total", [1, 2, 3, 5, 8])
def test_the_closed_forms_equal_enumeration_over_every_subset_and_every_draw(n_total):
    rng = np.random.default_rng(n_total)
    for trial in range(4):
        scores = list(np.round(rng.normal(50, 3, size=n_total), 1))
        if trial == 3 and n_total > 2:  # ties
            scores[1] = scores[0]
            scores[-1] = scores[0]
        curve = expected_max_curve(scores)
        low = expected_max_curve(scores, mode="min")
        for n in range(1, n_total + 1):
            assert curve[n - 1] == pytest.approx(brute_without(scores, n), abs=1e-9)
            assert low[n - 1] == pytest.approx(brute_without(scores, n, min), abs=1e-9)
        if n_total <= 5:
            rep = expected_max_curve(scores, replacement=True)
            for n in range(1, n_total + 1):
                assert rep[n - 1] == pytest.approx(brute_with(scores, n), abs=1e-9)


def test_a_case_worked_by_hand():
    scores = [3.0, 1.0, 4.0, 2.0]
    # without replacement: n=2 over the 6 pairs, maxima 2,3,4,3,4,4 -> 20/6; n=3: 3,4,4,4 -> 15/4
    assert expected_max_curve(scores).tolist() == pytest.approx([2.5, 20 / 6, 3.75, 4.0])
    # with replacement (Dodge et al. 2019): n=2 is 1·1/16 + 2·3/16 + 3·5/16 + 4·7/16 = 50/16
    assert expected_max(scores, 2, replacement=True) == pytest.approx(50 / 16)
    assert expected_max(scores, 4, replacement=True) == pytest.approx((1 + 2 * 15 + 3 * 65 + 4 * 175) / 256)
    # the unbiased curve ends at the best found; the V-statistic below it
    assert expected_max(scores, 4) == 4.0 > expected_max(scores, 4, replacement=True)
    with pytest.raises(ValueError):
        expected_max(scores, 5)
    with pytest.raises(ValueError):
        expected_max_curve([1.0, math.nan])


def test_the_bootstrap_band_is_seeded_holds_the_curve_and_is_flat_for_equal_scores():
    scores = [50.1, 52.3, 49.8, 55.0, 53.2, 51.1]
    lo, hi = bootstrap_band(scores)
    lo2, hi2 = bootstrap_band(scores)
    assert lo.tolist() == lo2.tolist() and hi.tolist() == hi2.tolist()
    curve = expected_max_curve(scores)
    assert np.all(lo <= curve + 1e-9) and np.all(curve <= hi + 1e-9) and np.all(hi - lo > 0)
    assert np.all(np.diff(hi) >= -1e-9)  # more configurations never lower the expected best
    flat_lo, flat_hi = bootstrap_band([50.0] * 4)
    assert flat_lo.tolist() == flat_hi.tolist() == [50.0] * 4
    mlo, mhi = bootstrap_band(scores, mode="min")
    low = expected_max_curve(scores, mode="min")
    assert np.all(mlo <= low + 1e-9) and np.all(low <= mhi + 1e-9)


def test_the_verdict_compares_the_last_gain_with_the_seed_noise():
    assert pooled_seed_sd([[1.0, 3.0], [5.0, 5.0, 8.0], [7.0]]) == pytest.approx(math.sqrt((2 + 6) / 3))
    assert pooled_seed_sd([[1.0], [2.0]]) is None
    # the last configuration's gain is (v_(N) − v_(N−1)) / N without replacement
    rising = budget_curve([50.0, 51.0, 52.0, 55.0], seeds_per_configuration=2, seed_sd=0.5)
    assert rising.last_gain == pytest.approx(0.75) and rising.seed_noise == pytest.approx(0.5 / math.sqrt(2))
    assert rising.flattened is False and rising.verdict.startswith("Still rising at 4 configurations")
    flat = budget_curve([50.0, 54.8, 54.9, 55.0], seeds_per_configuration=2, seed_sd=0.5)
    assert flat.last_gain == pytest.approx(0.025) and flat.flattened is True
    assert "Flattened at 4 configurations" in flat.verdict and "0.35" in flat.verdict
    unknown = budget_curve([50.0, 55.0])
    assert unknown.flattened is None and unknown.verdict.startswith("Cannot tell")
    assert budget_curve([50.0]).verdict.startswith("one configuration")
    # mode min: a gain is a fall
    assert budget_curve([3.0, 2.0, 1.0], mode="min", seed_sd=0.1).last_gain == pytest.approx(1 / 3)


def test_steps_the_observed_best_and_what_is_logged():
    c = budget_curve([52.0, 50.0, 55.0, 54.0], steps=[80, 40, 80, 80], seeds_per_configuration=2, seed_sd=1.0)
    assert c.steps_total == 280 and c.steps_per_configuration == 70.0 and c.expected_steps == [70, 140, 210, 280]
    assert c.observed_best == [52.0, 52.0, 55.0, 55.0]
    assert budget_curve([1.0, 2.0], steps=[10, None]).steps_total is None
    m = budget_metrics(c)
    assert m["budget/expected_best_at_4"] == pytest.approx(55.0) and m["budget/expected_best_at_1"] == 52.75
    assert m["budget/steps_total"] == 280 and set(m) >= {f"budget/expected_best_at_{n}" for n in range(1, 5)}
    md = budget_markdown(c)
    assert "| 4 | 55.00 |" in md and "280 optimizer steps" in md and c.verdict in md
    assert BudgetCurve.model_validate(json.loads(c.model_dump_json())) == c


def _record(cid, seed, best, final_step, curve, stopped=None, finished_at=0.0, method="simcse-unsup", config=None):
    return RunRecord(experiment="e", phase="search", search="s1", config_id=cid, hp={"lr": 1.0}, seed=seed,
                     method=method, model="m", config=config or {}, best_dev_spearman=best, final_step=final_step,
                     dev_curve=[{"step": s, "dev_spearman": v} for s, v in curve], stopped=stopped,
                     finished_at=finished_at)


def test_steps_spent_counts_stopped_runs_to_the_stop_and_every_stage_they_reached():
    assert steps_spent(_record("a", 1, 50, 40, [(0, 40), (20, 45), (40, 50)])) == 40
    assert steps_spent(_record("a", 1, 45, 20, [(0, 40), (20, 45)], stopped={"by": "scheduler", "at_step": 20})) == 20
    # a two-stage run stopped in its second stage: the first stage's 40 steps, then 20
    two = _record("a", 1, 45, 20, [(0, 40), (20, 45), (40, 46), (0, 46), (20, 47)], stopped={"by": "scheduler", "at_step": 20})
    assert steps_spent(two) == 60


def test_consert_joint_unsup_finished_runs_count_their_first_stage():
    from raysent.config import parse_config

    cfg = parse_config({"name": "c", "method": "consert", "model": {"name": "raw-bert-mini-mlm"},
                        "params": {"supervision": "joint-unsup"},
                        "data": {"train": "sts-unlabeled", "sup": "snli:dev"},
                        "train": {"max_steps": 40}}, check_search=False)
    rec = _record("a", 1, 50, 40, [(0, 40), (20, 45), (40, 50)], method="consert", config=cfg.to_dict())
    assert steps_spent(rec) == 80


def test_a_search_curve_from_its_records(tmp_path):
    exp = tmp_path / "e"
    recs = [_record("a", 1, 50.0, 40, [(0, 40), (40, 50)], finished_at=3),
            _record("a", 2, 51.0, 40, [(0, 40), (40, 51)], finished_at=4),
            _record("b", 1, 54.0, 40, [(0, 40), (40, 54)], finished_at=1),
            _record("b", 2, 56.0, 40, [(0, 40), (40, 56)], finished_at=2),
            _record("c", 1, 45.0, 20, [(0, 40), (20, 45)], stopped={"by": "scheduler", "at_step": 20}, finished_at=5),
            _record("c", 2, 46.0, 20, [(0, 40), (20, 46)], stopped={"by": "scheduler", "at_step": 20}, finished_at=5)]
    for r in recs:
        r.to_disk(exp / ("stopped" if r.stopped else "runs") / r.filename)
    c = search_budget(exp, "s1")
    assert c is not None and c.config_ids == ["b", "a", "c"] and c.scores == [55.0, 50.5, 45.5]
    assert c.stopped_configurations == 1 and c.steps_total == 40 * 4 + 20 * 2
    assert c.seed_sd == pytest.approx(math.sqrt((0.5 + 2.0) / 2)) and c.seed_sd_from == "search"  # finished only
    assert c.seeds_per_configuration == 2 and c.at(3) == 55.0
    assert c.expected_best == pytest.approx([brute_without(c.scores, n) for n in (1, 2, 3)])
    assert search_budget(exp, "other") is None


def test_the_summary_and_compare_show_the_curve_and_its_verdict():
    from raysent.report.compare import ComparisonResult, Side, SideComparison, format_budgets
    from raysent.report.summary import format_summary
    from raysent.tune.state import Summary

    c = budget_curve([52.0, 50.0, 55.0, 54.0], steps=[80, 40, 80, 80], seeds_per_configuration=2, seed_sd=1.0)
    text = format_summary(Summary(experiment="e", results="r", search="s1", budget=c))
    assert "budget curve (expected best dev of n configurations, without replacement" in text
    assert "n=1 52.75" in text and "n=4 55.00" in text and "280 optimizer steps" in text and c.verdict in text
    other = budget_curve([40.0, 41.0, 42.0], seed_sd=0.1)
    def side(budget):
        return Side(spec="x", experiment="e", phase="final", config_id="c", search="s", method="m", model="mo", hp={},
                    seeds=[1], learned=True, budget=budget)

    def result(base, *others, budgets=True):
        return ComparisonResult(aggregation="all", correlation="spearman", baseline=side(base), budgets=budgets,
                                comparisons=[SideComparison(run=side(o), tasks={}, same_runs=False, only_in_a=[],
                                                            only_in_b=[]) for o in others])

    lines = format_budgets(result(c, other, None))
    assert any(line.startswith("  A: n=1 52.75") and "n=3 54.75" in line and "N=4" in line for line in lines)  # n every side has
    assert any(line.startswith("  B1: n=1 41.00") and "n=3 42.00" in line for line in lines)
    assert lines[-1].startswith("  B2: no search's budget curve")
    assert format_budgets(result(None, budgets=False)) == []
