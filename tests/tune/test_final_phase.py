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
