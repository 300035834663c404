"""What an interrupted search or final phase says it did (raysent.tune.records_transport.check_complete), from Tune's
results as ``tuner.fit()`` returns them after Ctrl-C: the trials Tune ended because of Ctrl-C are TERMINATED
there like the finished ones, so only the run records tell finished from cut off. (tests/tune/test_tune.py
checks the same line after a real Ctrl-C.)"""

from __future__ import annotations

import json

import pytest

from raysent.config import parse_config
from raysent.errors import Interrupted
from raysent.tune.protocol import RECORD_KEY, STOPPED_DIR
from raysent.tune.records_transport import check_complete
from raysent.tune.storage import experiment_dir

CONFIG = {"name": "cut", "method": "simcse-unsup", "model": {"name": "raw-bert-mini-mlm"},
          "data": {"train": "sts-unlabeled"}}


class Result:
    """A ``ray.tune.Result``'s fields that check_complete reads."""

    def __init__(self, trial_id: str, how: str):
        self.metrics = {"trial_id": trial_id, "best_dev_spearman": 50.0}
        self.error = RuntimeError("the loss became nan") if how == "failed" else None
        if how == "finished":
            self.metrics[RECORD_KEY] = json.dumps({"trial_id": trial_id})
        self.status = "ERROR" if how == "failed" else "TERMINATED"  # Ctrl-C'd and stopped trials too


class Grid(list):
    """A ``ray.tune.ResultGrid`` after Ctrl-C: Tune's own counts include the trials Ctrl-C ended."""

    @property
    def num_terminated(self) -> int:
        return sum(r.status == "TERMINATED" for r in self)

    @property
    def num_errors(self) -> int:
        return sum(r.status == "ERROR" for r in self)


@pytest.fixture
def cfg(tmp_path):
    return parse_config({**CONFIG, "tracking": {"results_dir": str(tmp_path)}})


def message(results, expected, cfg, what="search") -> str:
    with pytest.raises(Interrupted) as info:
        check_complete(results, expected, cfg, what)
    return str(info.value)


def test_ctrl_c_with_two_finished_and_two_running_says_so(cfg):
    results = Grid([Result("t1", "finished"), Result("t2", "finished"), Result("t3", "cut"), Result("t4", "cut")])
    assert results.num_terminated == 4  # what the message used to report as "after 4 of 6"
    assert message(results, 6, cfg).startswith("search of cut interrupted after 2 of 6 trial(s) finished "
                                               "(2 were running); its state is saved: `raysent tune --resume`")


def test_ctrl_c_during_the_last_trials_is_not_taken_for_the_end(cfg):
    """Every trial of the phase exists and Tune calls them all TERMINATED: the two without a record were cut."""
    results = Grid([Result(f"t{i}", "finished") for i in range(4)] + [Result("t4", "cut"), Result("t5", "cut")])
    assert results.num_terminated == len(results) == 6
    assert "after 4 of 6 trial(s) finished (2 were running)" in message(results, 6, cfg, "final phase")


def test_failed_and_scheduler_stopped_trials_have_ended(cfg):
    stopped = experiment_dir(cfg) / STOPPED_DIR / "search-s1-c9-seed1-t3.json"
    stopped.parent.mkdir(parents=True)
    stopped.write_text("{}")
    done = [Result("t1", "finished"), Result("t2", "failed"), Result("t3", "stopped")]
    check_complete(Grid(done), 3, cfg, "search")  # complete: no error
    assert "after 1 of 5 trial(s) finished (1 failed, 1 stopped by the scheduler, 1 were running)" in \
        message(Grid([*done, Result("t4", "cut")]), 5, cfg)
    assert "after 1 of 5 trial(s) finished (1 failed, 1 stopped by the scheduler, 0 were running)" in \
        message(Grid(done), 5, cfg)  # Ctrl-C before Tune created the last trials


def test_the_trial_gate_numbers_trials_as_they_start_and_holds_those_past_its_allowance(tmp_path):
    """The point a test interrupts a search at (tests/tune/test_tune.py, interrupt_and_resume): the first trial
    passes, the second signals its start and waits until it is allowed."""
    import threading

    from raysent.tune.trial import wait_at_gate

    (tmp_path / "allow").write_text("1")
    wait_at_gate(str(tmp_path), poll=0.01)  # the first: through at once
    second = threading.Thread(target=wait_at_gate, args=(str(tmp_path), 0.01), daemon=True)
    second.start()
    second.join(0.5)
    assert (tmp_path / "arrived-2").exists() and second.is_alive()  # arrived, and held
    (tmp_path / "allow").write_text("2")
    second.join(5)
    assert not second.is_alive()
    wait_at_gate(None)  # no gate: nothing to wait for
    assert sorted(p.name for p in tmp_path.iterdir()) == ["allow", "arrived-1", "arrived-2"]
