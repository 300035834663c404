"""A configuration's seeds trained in turns in one trial (raysent.tune.seeds): each seed's run is the one
it trains alone, and what the trial reports after each round is the seed mean and std of those runs."""

from __future__ import annotations

import numpy as np
import pytest

from raysent.config import parse_config, with_overrides

from conftest import RAW_BERT

pytestmark = [pytest.mark.shared]

CONFIG = {
    "name": "seeds", "method": "simcse-unsup", "model": {"name": RAW_BERT},  # dropout: draws from torch's RNG
    "data": {"train": "sts-unlabeled", "dev": "sickr:dev", "max_train_samples": 96},
    "train": {"batch_size": 16, "max_steps": 6, "eval_every": 2, "max_length": 24, "lr": 1.0e-4},
    "params": {"pooling": "mean"},
    "eval": {"tasks": ["sts"], "sts_sets": ["stsb"], "batch_size": 64, "max_length": 64},
    "seeds": [3, 5],
    "search": {"algorithm": "grid", "seeds": 2, "scheduler": {"type": "asha"},
               "space": {"lr": {"type": "choice", "values": [1.0e-4, 3.0e-4]}}},
}


@pytest.mark.slow  # trains 4 runs of 6 steps
def test_seeds_in_turns_train_as_alone_and_the_trial_reports_their_mean(tiny_bert, tmp_path, trial_in_this_process):
    from raysent.train.run import train_in_process
    from raysent.tune.protocol import TrialContext
    from raysent.tune.reporter import MemoryReporter
    from raysent.tune.seeds import run_seed_group
    from raysent.tune.trial import seeds_in_one_trial

    cfg = parse_config({**CONFIG, "model": {"name": tiny_bert},  # plumbing, not learning: the tiny random BERT
                        "tracking": {"results_dir": str(tmp_path / "results"), "enabled": False}})
    assert seeds_in_one_trial(cfg)
    reporter = MemoryReporter("t1")  # what Tune would hand the driver, in this process
    exp = tmp_path / "results" / "seeds"
    ctx = TrialContext(config=cfg.to_dict(), source="seeds.yaml", phase="search", run="r1", exp_dir=str(exp),
                       metric="best_dev_spearman")
    records = run_seed_group({"hp": {"lr": 3.0e-4}}, ctx, reporter)

    # every seed is the run it is alone: the same dev curve and losses, to the last bit
    alone = {}
    for seed in (3, 5):
        solo = with_overrides(cfg, {"lr": 3.0e-4, "train.seed": seed, "train.output_dir": str(tmp_path / f"alone{seed}")})
        alone[seed] = train_in_process(solo, quiet=True)
    assert [r.seed for r in records] == [3, 5]
    for rec in records:
        solo = alone[rec.seed]
        assert rec.dev_curve == solo.dev_curve, rec.seed
        assert rec.best_dev_spearman == solo.best_dev_spearman and rec.best_step == solo.best_step
        assert rec.trial_id == "t1" and rec.hp == {"lr": 3.0e-4} and rec.final_step == 6
        assert (exp / "runs" / f"search-r1-{rec.config_id}-seed{rec.seed}.json").is_file()
        assert rec.best_model_dir == str(exp / "search" / "r1" / "t1" / f"seed{rec.seed}" / "best")
        assert not (exp / "search" / "r1" / "t1" / f"seed{rec.seed}" / "checkpoint").exists()
    # the seeds differ (else the mean would say nothing about them)
    assert len({a.dev_curve[-1].dev_spearman for a in alone.values()}) == 2

    # one report per round of evaluations (steps 0, 2, 4, 6): the mean and sample std over the seeds of their
    # best score so far and of their score at that step, and each seed's point
    assert [r.step for r in reporter.results] == [0, 2, 4, 6]
    for r in reporter.results:
        best = [max(p.dev_spearman for p in alone[s].dev_curve if p.step <= r.step) for s in (3, 5)]
        now = [next(p.dev_spearman for p in alone[s].dev_curve if p.step == r.step) for s in (3, 5)]
        assert r.metrics["best_dev_spearman"] == pytest.approx(np.mean(best), abs=1e-12)
        assert r.metrics["best_dev_spearman_std"] == pytest.approx(np.std(best, ddof=1), abs=1e-12)
        assert r.metrics["dev_spearman"] == pytest.approx(np.mean(now), abs=1e-12)
        assert r.metrics["dev_spearman_std"] == pytest.approx(np.std(now, ddof=1), abs=1e-12)
        points = r.seed_points or {}
        assert sorted(points) == ["3", "5"] and points["5"]["dev_spearman"] == pytest.approx(now[1], abs=1e-12)
        assert r.seeds == 2 and not r.finished
    # a seed's training time is its own turns', not the trial's
    assert all(a.train_seconds > 0 for a in alone.values())
    assert sum(r.train_seconds or 0 for r in records) < 1.5 * sum(a.train_seconds for a in alone.values()) + 10


@pytest.mark.slow  # starts training
def test_a_failing_seed_fails_the_configuration_and_ends_the_others(tiny_bert, tmp_path, trial_in_this_process):
    import threading

    from raysent.train.loop import NonFiniteLossError
    from raysent.tune.protocol import TrialContext
    from raysent.tune.reporter import MemoryReporter
    from raysent.tune.seeds import run_seed_group

    cfg = parse_config({**CONFIG, "model": {"name": tiny_bert},  # plumbing, not learning: the tiny random BERT
                        "tracking": {"results_dir": str(tmp_path / "results"), "enabled": False}})
    ctx = TrialContext(config=cfg.to_dict(), source="seeds.yaml", phase="search", run="r1",
                       exp_dir=str(tmp_path / "results" / "seeds"), metric="best_dev_spearman")
    with pytest.raises(NonFiniteLossError):  # τ = 1e-45: cos/τ overflows, the loss is NaN at the first step
        run_seed_group({"hp": {"lr": 1.0e-4, "temperature": 1.0e-45}}, ctx, MemoryReporter("t2"))
    assert not [t for t in threading.enumerate() if t.name.startswith("seed-")]  # no seed left training
    assert not list((tmp_path / "results" / "seeds").glob("runs/*.json"))


def test_the_plan_counts_one_trial_per_configuration_and_every_seed_s_run():
    """`raysent tune --dry-run`'s plan: with seeds in one trial, Tune has one trial per configuration and the
    search trains every seed of each; without a scheduler, one trial per (configuration, seed)."""
    from raysent.tune.cost import Estimate, estimate_seconds
    from raysent.tune.driver import experiment_dir
    from raysent.tune.plan import dry_run

    def plan(c):
        return dry_run(c, experiment_dir(c)).to_dict()

    cfg = parse_config({**CONFIG, "search": {**CONFIG["search"], "seeds": 3}})
    together = plan(cfg)["search"]
    assert (together["trials"], together["runs"]) == (2, 6)
    assert together["seeds per configuration"].startswith("3 (in one trial, in turns")
    apart = plan(with_overrides(cfg, {"search.scheduler": None}))["search"]
    assert (apart["trials"], apart["runs"], apart["seeds per configuration"]) == (6, 6, 3)
    # the same runs to train, the same time by the cost model when one trial runs at a time
    one = {"search.max_concurrent_trials": 1}
    est = [estimate_seconds(with_overrides(c, one), "searched", Estimate()) for c in
           (cfg, with_overrides(cfg, {"search.scheduler": None}))]
    assert est[0]["search_runs"] == est[1]["search_runs"] == 6
    # ... and the final phase: with the scheduler, which may stop the winner's seeds 3 and 5, both train again;
    # without, they are the search's runs, evaluated (raysent.tune.trial.trained_in_search): two trainings less
    assert (est[0]["final_runs_reused"], est[1]["final_runs_reused"]) == (0, 2)
    e, s = Estimate(), 6 * Estimate().step_seconds["default"] * 16 * 24 / (64 * 32)
    train = s + (6 // 2 + 2) * e.dev_eval_seconds + e.run_overhead_seconds
    assert est[0]["seconds"] - est[1]["seconds"] == pytest.approx(2 * train - 2 * e.run_overhead_seconds)
