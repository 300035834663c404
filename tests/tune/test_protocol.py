"""The one protocol between a trial and the driver (raysent.tune.protocol): what a trial writes reads back as it was
written, in the keys raysent has always written (an experiment saved before the module resumes), and no other module
of the search reads one of those keys by its string."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from raysent.train.records import read_record
from raysent.tune.protocol import RECORD_KEY, SEED_POINTS, TrialResult, from_record, seed_point

REPO = Path(__file__).resolve().parents[2]
RUNS = sorted((REPO / "results" / "quick" / "runs").glob("final-*.json"))


def loop_report(step: int, dev: float, best: float, best_step: int, finished: bool = False) -> dict:
    """What raysent.train.loop.evaluate_and_save reports at an evaluation (finished: run_training's end)."""
    return {"step": step, "epoch": 0, "loss": None if step == 0 else 1.25, "lr": 3e-5, "dev_spearman": dev,
            "dev/stsb:dev": dev, "best_dev_spearman": best, "best_step": best_step, "finished": finished}


def test_a_finished_trial_s_records_read_back_as_written():
    record = read_record(RUNS[0])
    sent = TrialResult.done([record], {"best_dev_spearman": record.best_dev_spearman}, seed=record.seed).to_tune()
    assert json.loads(sent[RECORD_KEY]) == json.loads(json.dumps(record.to_json(), default=str))  # one: an object
    assert sent["finished"] is True and sent["seed"] == record.seed
    back = TrialResult.from_tune({**sent, "trial_id": "abc_00001", "training_iteration": 3, "time_total_s": 9.5,
                                  "timestamp": 1764000000})
    assert back.records == [record] and back.sent and back.finished and back.seed == record.seed
    assert (back.trial_id, back.training_iteration, back.time_total_s) == ("abc_00001", 3, 9.5)
    assert back.metrics["best_dev_spearman"] == record.best_dev_spearman
    # what decides that a trial finished reads no record: not even a broken one
    assert TrialResult.from_tune({RECORD_KEY: "{not json"}, read_records=False).sent


def test_a_trial_of_all_seeds_sends_a_list_and_an_older_experiment_s_result_reads():
    records = [read_record(p) for p in RUNS[:2]]
    sent = TrialResult.done(records, {"best_dev_spearman": 50.0}, seeds=2).to_tune()
    assert isinstance(json.loads(sent[RECORD_KEY]), list) and sent["seeds"] == 2
    assert TrialResult.from_tune(sent).records == records
    # run_trial's last result as raysent wrote it before the protocol had a module (2026-12-03)
    old = {"best_dev_spearman": records[0].best_dev_spearman, "seed": 1, "finished": True,
           RECORD_KEY: json.dumps(records[0].to_json(), default=str), "sts/avg": 60.5}
    back = TrialResult.from_tune(old)
    assert back.records == records[:1] and back.metrics == {"best_dev_spearman": records[0].best_dev_spearman,
                                                           "sts/avg": 60.5}


def test_the_loop_s_reports_become_results_with_their_step_and_curve_point():
    at = TrialResult.from_loop(loop_report(20, 52.4, 52.4, 20))
    assert at.logged_step == 20 and at.metrics["loss"] == 1.25 and "step" not in at.metrics
    assert at.curve_point() == {"step": 20, "dev_spearman": 52.4, "dev/stsb:dev": 52.4}
    assert at.best() == (52.4, 20)
    start = TrialResult.from_loop(loop_report(0, 47.9, 47.9, 0))
    assert "loss" not in start.metrics  # None at step 0: no number
    end = TrialResult.from_loop(loop_report(60, 55.1, 55.2, 40, finished=True))
    assert end.logged_step is None and end.finished  # the end repeats the last evaluation: not logged again
    assert end.to_tune() == {**{k: float(v) for k, v in loop_report(60, 55.1, 55.2, 40).items()
                                if k not in ("step", "finished") and v is not None}, "step": 60, "finished": True}
    assert TrialResult.from_loop({"finished": True, "best_dev_spearman": 50.0}).curve_point() is None


def test_a_round_s_seed_points_travel_as_json_and_a_resumed_seed_reads_as_its_last_report():
    points = {"3": seed_point(loop_report(4, 51.0, 52.0, 2)), "5": seed_point(loop_report(4, 49.0, 49.0, 4))}
    assert points["3"] == {"step": 4, "dev_spearman": 51.0, "dev/stsb:dev": 51.0, "best_dev_spearman": 52.0,
                           "best_step": 2}  # no loss, lr, epoch: what a stopped trial's record needs
    sent = TrialResult(metrics={"dev_spearman": 50.0, "dev_spearman_std": 1.41}, step=4, seeds=2,
                       seed_points=points).to_tune()
    assert json.loads(sent[SEED_POINTS]) == points and sent["finished"] is False
    back = TrialResult.from_tune(sent)
    assert back.seed_points == points and back.step == 4 and back.seeds == 2 and not back.sent
    record = read_record(RUNS[0])
    last = from_record(record)
    assert last["best_dev_spearman"] == record.best_dev_spearman and last["best_step"] == record.best_step
    assert last["dev_spearman"] == record.dev_curve[-1].dev_spearman


PROTOCOL_KEYS = ("finished", "seed_points", "raysent_record", "step", "best_step", "seeds")


SEARCH_MODULES = [p for p in sorted((REPO / "raysent" / "tune").glob("*.py")) if p.name != "protocol.py"] + \
    [REPO / "raysent" / "tracking.py"]


@pytest.mark.parametrize("path", SEARCH_MODULES, ids=lambda p: p.name)
def test_no_other_module_of_the_search_reads_a_key_of_the_protocol_by_its_string(path: Path):
    text = path.read_text()
    found = [key for key in PROTOCOL_KEYS if re.search(rf"""(\[|\.get\(|in |== )["']{key}["']""", text)]
    assert not found, f"{path.name} reads {found} by string: use raysent.tune.protocol.TrialResult"
