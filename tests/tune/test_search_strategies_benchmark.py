"""benchmarks/search_strategies.py: the study file expands into one valid search per (method, strategy, repeat),
the random-sampler strategies differ only in their early stopping, the dry run sizes it by the cost model, and the
report computes its numbers from the records (synthetic searches here; a real smoke run is in the final report)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from raysent.report.budget import budget_curve

from conftest import REPO

pytestmark = [pytest.mark.shared]
sys.path.insert(0, str(REPO / "benchmarks"))
import search_strategies as ss  # noqa: E402

STUDY = REPO / "benchmarks" / "search_strategies.yaml"


def test_the_study_expands_into_valid_searches_and_its_dry_run_sizes_it(tmp_path):
    study = ss.load_study(STUDY)
    sel = ss.Selection(results_dir=str(tmp_path))
    found = list(ss.searches(study, STUDY, sel))
    ran = [m for m in study.methods if m.run]
    assert len(found) == len(ran) * len(study.strategies) * len(study.repeats)
    by = {(m.name, s.name, rep): cfg for m, s, rep, cfg in found}
    for (m, s, rep), cfg in by.items():
        assert cfg.name == f"{m}-{s}-r{rep}" and cfg.search.seed == rep and cfg.tracking.results_dir == str(tmp_path)
        assert cfg.train.max_steps == 40 and cfg.search.seeds == 2 and list(cfg.seeds) == study.final_seeds
        # the random strategies of a repeat: the same sampler and seed, so the same configurations
        if s.startswith("random"):
            base = by[(m, "random", rep)]
            assert (cfg.search.algorithm, cfg.search.seed, cfg.search.space) == \
                (base.search.algorithm, base.search.seed, base.search.space)
    assert by[(ran[0].name, "random-asha", 0)].search.scheduler.type == "asha"
    assert by[(ran[0].name, "random-wilcoxon", 0)].search.pruner.type == "wilcoxon"
    assert by[(ran[0].name, "gp", 0)].search.algorithm == "optuna-gp"
    plan = ss.plan(STUDY, sel)
    assert len(plan["searches"]) == len(found) and all(r["status"] == "new" for r in plan["searches"])
    assert 2.0 < plan["search phase hours (upper bound: early stopping trains less)"] < 4.0
    assert set(plan.get("not run (run: false; --only NAME adds it)", {})) == {m.name for m in study.methods
                                                                               if not m.run}
    assert not plan["missing"]
    with pytest.raises(Exception, match="no strategy nope"):
        list(ss.searches(study, STUDY, ss.Selection(strategies=["nope"])))


def _fake_search(root: Path, name: str, scores: list[float], steps: list[int], pick: str, pick_dev: float,
                 finished: dict[str, list[float]]) -> None:
    exp = root / name
    (exp / "runs").mkdir(parents=True)
    curve = budget_curve(scores, steps, seeds_per_configuration=2, seed_sd=0.3,
                         config_ids=[f"c{i}" for i in range(len(scores))])
    (exp / "summary.json").write_text(json.dumps({
        "experiment": name, "results": str(exp), "search": "s1", "budget": curve.model_dump(),
        "best": {"config_id": pick, "hp": {"lr": 1.0}, "dev_mean": pick_dev}, "wall_seconds": 1.0}))
    for cid, vals in finished.items():
        for seed, v in enumerate(vals, 1):
            (exp / "runs" / f"search-s1-{cid}-seed{seed}.json").write_text(json.dumps(
                {"config_id": cid, "best_dev_spearman": v}))


def test_the_report_is_computed_from_the_records(tmp_path):
    sel = ss.Selection(methods=["supcon"], repeats=[0], strategies=["random", "random-asha"],
                       results_dir=str(tmp_path))
    # random tried 3 configurations (best 55.0); ASHA the same 3, one stopped at half the steps
    _fake_search(tmp_path, "supcon-random-r0", [50.0, 55.0, 52.0], [80, 80, 80], "b", 55.0,
                 {"a": [49.0, 51.0], "b": [54.0, 56.0], "c": [52.0, 52.0]})
    _fake_search(tmp_path, "supcon-random-asha-r0", [50.0, 55.0, 51.0], [80, 80, 40], "b", 55.0,
                 {"a": [49.0, 51.0], "b": [54.0, 56.0]})
    out = tmp_path / "report.md"
    res = ss.report(STUDY, sel, out)
    text = out.read_text()
    assert res["searches"] == 2 and "Best configuration any search found" in text and "supcon 55.00" in text
    # steps 240 and 200; ASHA spent 200/240 of random's and picked the same configuration
    assert "| random | 1 | 240 ± 0 | 0 | 1/1 | 0.00 |" in text
    assert "| random + ASHA (seed mean) | random | 1 | 83% | 1/1 | +0.00 |" in text
    # n=1: regret 55 − 50 = 5 for both (the first configuration); at n=2 both have seen 55
    assert "| 1 | 5.00 (0/1) | 5.00 (0/1) |" in text and "| 2 | 0.00 (1/1) | 0.00 (1/1) |" in text
    # what to run, in words: the lead is not a finding on one pair; ASHA's steps and picks as in the table
    assert "## What to run, on this evidence" in text and "a lead, not a finding" in text
    assert "**random + ASHA (seed mean)** trained 83% of random's optimizer steps (median) and picked the same " \
           "configuration in 1 of 1 searches" in text
    assert (tmp_path / "study.json").is_file() and (tmp_path / "search-strategies-supcon.png").is_file()
    saved = json.loads((tmp_path / "study.json").read_text())
    assert saved["best_found"] == {"supcon": 55.0} and len(saved["searches"]) == 2


def test_the_report_counts_the_repeats_each_method_finished(tmp_path):
    """A method with fewer finished repeats than the others (a study continued later) is counted as it ran: the
    page says which repeats it has, the paired counts add up per method, and a method with none says so."""
    sel = ss.Selection(methods=["supcon", "simcse-sup", "consert-joint-unsup"], repeats=[0, 1],
                       strategies=["random"], results_dir=str(tmp_path))
    runs = {"a": [49.0, 51.0], "b": [54.0, 56.0]}
    for name in ("supcon-random-r0", "supcon-random-r1", "simcse-sup-random-r0"):
        _fake_search(tmp_path, name, [50.0, 55.0], [80, 80], "b", 55.0, runs)
    out = tmp_path / "report.md"
    ss.report(STUDY, sel, out)
    text = out.read_text()
    assert "simcse-sup: repeat [0] only, for the time (the same command continues it)." in text
    assert "supcon: repeat" not in text and "consert-joint-unsup: no search finished yet." in text
    assert "- Each strategy has 3 searches (supcon 2 + simcse-sup 1); " in text
    assert "smallest two-sided p over 3 pairs is 0.25" in text and "at most 2 repeats" in text
    assert "### Per method (descriptive: 2 repeats cannot separate strategies)" in text
