"""The final phase runs the searched best and the warm-start configuration in one Tune run (a trial per arm and
seed); a search an earlier raysent left between its two final phases (state.json's phase "paper") resumes with
the warm-start arm alone, in the Tune run that raysent named for it. What the phases hand each other, with the Tune
runs replaced by their outcomes (tests/tune/test_tune.py runs the real thing)."""

from __future__ import annotations

import pytest

from raysent.config import parse_config
from raysent.tune import driver
from raysent.tune.driver import final_run_name
from raysent.tune.plan import SearchPlan
from raysent.tune.space import config_id
from raysent.tune.state import ArmOutcome, Best, Comparison, SearchState

CONFIG = {"name": "warm", "method": "simcse-unsup", "model": {"name": "raw-bert-mini-mlm"},
          "data": {"train": "sts-unlabeled"}, "train": {"lr": 1.0e-4}, "seeds": [1, 2],
          "search": {"algorithm": "grid", "space": {"lr": {"type": "choice", "values": [1.0e-9, 3.0e-4]}}}}
BEST = {"lr": 1.0e-9}
WARM = {"lr": 1.0e-4}


@pytest.fixture
def phases(tmp_path, monkeypatch):
    """_phases with the Tune runs replaced: each call of run_final is noted and returns an outcome per arm."""
    cfg = parse_config({**CONFIG, "tracking": {"results_dir": str(tmp_path)}})
    calls: list[dict] = []

    def run_final(cfg, exp, state, arms, mlflow, resume, say):
        calls.append(dict(arms))
        # each outcome says whose it is (errors is a free list of lines)
        return {arm: ArmOutcome(seeds=list(cfg.seeds), errors=[config_id(hp)]) for arm, hp in arms.items()}

    monkeypatch.setattr(driver, "run_final", run_final)
    monkeypatch.setattr(driver, "versus_paper",
                        lambda exp, run, paper, best: Comparison(paper=paper, searched=best, tasks={}))

    def go(phase: str, best: dict = BEST, paper_arm: bool = True) -> SearchState:
        state = SearchState(run="r1", phase=phase, config=cfg.to_dict(),
                            best=Best(config_id=config_id(best), hp=best))
        if phase == "paper":  # the searched best's seeds are done
            state.final = ArmOutcome(seeds=[1, 2], errors=[config_id(best)])
        driver._phases(cfg, SearchPlan.of(cfg), tmp_path, state, None, resume=True, say=lambda m: None,
                       paper_arm=paper_arm, search_only=False)
        return state

    return go, calls


def test_both_arms_run_in_one_final_phase_and_are_compared(phases):
    go, calls = phases
    state = go("final")
    assert calls == [{"": BEST, "paper": WARM}]
    assert state.phase == "publish" and state.final.errors == [config_id(BEST)]
    assert state.paper.errors == [config_id(WARM)] and state.warm_source == "file"
    assert (state.vs_paper.paper, state.vs_paper.searched) == (config_id(WARM), config_id(BEST))
    assert final_run_name(calls[0], "r1") == "final-r1"


def test_no_second_arm_when_the_best_is_the_warm_start_or_the_suite_runs_its_own(phases):
    go, calls = phases
    assert go("final", best=WARM).paper is None
    assert go("final", paper_arm=False).vs_paper is None
    assert calls == [{"": WARM}, {"": BEST}]


def test_a_search_left_between_the_two_final_phases_resumes_with_the_warm_start_arm_alone(phases):
    go, calls = phases
    state = go("paper")
    assert calls == [{"paper": WARM}]  # the searched best's seeds are not run again
    assert state.phase == "publish" and state.paper.errors == [config_id(WARM)] and state.vs_paper is not None
    assert state.final.errors == [config_id(BEST)]
    assert final_run_name(calls[0], "r1") == "final-paper-r1"  # the Tune run the earlier raysent started


def test_a_final_run_the_search_trained_alike_is_reused_and_no_other(tmp_path):
    """trial.trained_in_search: the search's finished run of the same configuration and seed, trained with the same
    method, model, data, training settings and parameters, whose best model is on this disk, is the final run's
    training; a stopped one, one trained otherwise, one whose model is gone, a seed the search did not train: None."""
    from raysent.train.records import RunRecord
    from raysent.tune.protocol import TrialContext
    from raysent.tune.trial import resolve_trial, trained_in_search

    cfg = parse_config({**CONFIG, "tracking": {"results_dir": str(tmp_path)}})
    exp = tmp_path / "warm"
    ctx = TrialContext(config=cfg.to_dict(), source="<test>", phase="final", run="r1", exp_dir=str(exp),
                       metric="best_dev_spearman", arms={"": BEST})
    _, seed, _, final_cfg = resolve_trial({"seed": 1}, ctx, "t0001")
    search_ctx = ctx.model_copy(update={"phase": "search"})
    _, _, _, search_cfg = resolve_trial({"lr": BEST["lr"]}, search_ctx, "s0001")
    assert search_cfg.train.output_dir != final_cfg.train.output_dir  # each trial's own folder
    best = tmp_path / "search-best"
    best.mkdir()
    (best / "raysent.json").write_text("{}")

    def searched(**changes) -> RunRecord:
        fields = {"config": search_cfg.to_dict(), **changes}
        rec = RunRecord(experiment="warm", phase="search", search="r1", config_id=config_id(BEST), hp=BEST, seed=1,
                        method="simcse-unsup", model="raw-bert-mini-mlm", best_dev_spearman=50.0, best_step=4,
                        final_step=4, best_model_dir=str(best), **fields)
        rec.to_disk(exp / "runs" / rec.filename)
        return rec

    assert trained_in_search(ctx, final_cfg, BEST, 1) is None  # the search has no such run
    rec = searched()
    assert trained_in_search(ctx, final_cfg, BEST, 1) == rec
    assert trained_in_search(ctx, final_cfg, BEST, 2) is None  # seed 2: not searched
    assert trained_in_search(search_ctx, search_cfg, BEST, 1) is None  # only the final phase reuses
    other = search_cfg.to_dict()
    other["train"]["max_steps"] = 99
    searched(config=other)
    assert trained_in_search(ctx, final_cfg, BEST, 1) is None  # trained otherwise
    searched(stopped={"by": "asha", "at_step": 2})
    assert trained_in_search(ctx, final_cfg, BEST, 1) is None  # a scheduler stopped it
    searched()
    (best / "raysent.json").unlink()
    assert trained_in_search(ctx, final_cfg, BEST, 1) is None  # its model is not on this disk


def test_a_reused_run_shares_the_weights_and_owns_its_card(tmp_path):
    """The final run's best model is the search run's: its weights hard-linked, its small files copied, so that the
    card publishing writes into the final run's folder leaves the search run's card as it was."""
    from raysent.methods.card import write_card
    from raysent.train.records import RunRecord
    from raysent.tune.trial import reuse_search_run

    cfg = parse_config({**CONFIG, "train": {"lr": 1.0e-4, "output_dir": str(tmp_path / "final" / "seed1")}})
    searched_best = tmp_path / "search" / "best"
    searched_best.mkdir(parents=True)
    (searched_best / "model.safetensors").write_bytes(b"\0" * (2 << 20))
    (searched_best / "raysent.json").write_text('{"method": "simcse-unsup", "pooling": "mean"}')
    (searched_best / "README.md").write_text("the search run's card\n")
    searched = RunRecord(experiment="warm", phase="search", search="r1", config_id="c", hp={}, seed=1,
                         method="simcse-unsup", model="m", config={}, best_dev_spearman=50.0, best_step=4,
                         final_step=4, dev_curve=[{"step": 0, "dev_spearman": 40.0}, {"step": 4, "dev_spearman": 50.0}],
                         best_model_dir=str(searched_best))
    fields = reuse_search_run(searched, cfg, live=None)
    best = tmp_path / "final" / "seed1" / "best"
    assert fields["best_model_dir"] == str(best) and fields["trained_in"] == searched.filename
    assert fields["best_dev_spearman"] == 50.0 and [p.step for p in fields["dev_curve"]] == [0, 4]
    assert (best / "model.safetensors").stat().st_ino == (searched_best / "model.safetensors").stat().st_ino
    write_card(best, results="the final phase's table")
    assert (searched_best / "README.md").read_text() == "the search run's card\n"
    assert "the final phase's table" in (best / "README.md").read_text()


def test_an_arm_where_no_seed_finished_is_kept_and_not_compared(tmp_path, monkeypatch):
    """The warm-start arm failed on every seed (a diverged loss): the phase goes on to publish the searched best,
    the failed arm's errors in the state, and no paired comparison is attempted (it has no pairs)."""
    cfg = parse_config({**CONFIG, "tracking": {"results_dir": str(tmp_path)}})

    def run_final(cfg, exp, state, arms, mlflow, resume, say):
        assert set(arms) == {"", "paper"}
        return {"": ArmOutcome(seeds=[1, 2]), "paper": ArmOutcome(seeds=[], missing_seeds=[1, 2], errors=["nan"])}

    monkeypatch.setattr(driver, "run_final", run_final)
    monkeypatch.setattr(driver, "versus_paper", lambda *a: pytest.fail("an arm without seeds has nothing to pair"))
    state = SearchState(run="r1", phase="final", config=cfg.to_dict(), best=Best(config_id=config_id(BEST), hp=BEST))
    driver._phases(cfg, SearchPlan.of(cfg), tmp_path, state, None, resume=False, say=lambda m: None,
                   paper_arm=True, search_only=False)
    assert state.phase == "publish" and state.final.seeds == [1, 2]
    assert state.paper.errors == ["nan"] and state.paper.missing_seeds == [1, 2] and state.vs_paper is None
