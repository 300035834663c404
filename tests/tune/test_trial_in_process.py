"""A search's trial run in the test's own process, through the reporter seam (raysent.tune.reporter): what it
reports is what Tune would hand the driver (each result through the wire format), its record is on disk and in its
last result, and run again (``--resume`` after its record was written) it reports that record without training."""

from __future__ import annotations

import pytest

from raysent.config import parse_config

from conftest import RAW_BERT

pytestmark = [pytest.mark.shared]

CONFIG = {
    "name": "inproc", "method": "simcse-unsup", "model": {"name": RAW_BERT},
    "data": {"train": "sts-unlabeled", "dev": "sickr:dev", "max_train_samples": 64},
    "train": {"batch_size": 16, "max_steps": 4, "eval_every": 2, "max_length": 24},
    "params": {"pooling": "mean"},
    "eval": {"tasks": ["sts"], "sts_sets": ["stsb"], "batch_size": 64, "max_length": 64},
    "seeds": [7],
    "search": {"algorithm": "grid", "seeds": 1, "space": {"lr": {"type": "choice", "values": [1.0e-4, 3.0e-4]}}},
}


@pytest.mark.slow  # trains one run of 4 steps
def test_a_trial_reports_its_evaluations_and_record_and_a_second_run_reads_the_record(tiny_bert, tmp_path,
                                                                                       trial_in_this_process):
    from raysent.train.records import read_record
    from raysent.tune.protocol import TrialContext
    from raysent.tune.reporter import MemoryReporter
    from raysent.tune.trial import run_trial

    cfg = parse_config({**CONFIG, "model": {"name": tiny_bert},  # plumbing, not learning: the tiny random BERT
                        "tracking": {"results_dir": str(tmp_path / "results"), "enabled": False}})
    exp = tmp_path / "results" / "inproc"
    ctx = TrialContext(config=cfg.to_dict(), source="inproc.yaml", phase="search", run="r1", exp_dir=str(exp),
                       metric="best_dev_spearman")
    reporter = MemoryReporter("t9")
    run_trial({"hp": {"lr": 3.0e-4}}, ctx, reporter=reporter)

    *evals, end, last = reporter.results
    assert [r.step for r in evals] == [0, 2, 4] and not any(r.finished for r in evals)
    # the loop's end repeats its last evaluation (a live MLflow run logs no step twice), then the trial's record
    assert end.finished and end.step == 4 and end.logged_step is None and not end.sent
    assert last.finished and last.seed == 7 and len(last.records or []) == 1
    [record] = last.records or []
    assert (record.trial_id, record.seed, record.hp, record.phase) == ("t9", 7, {"lr": 3.0e-4}, "search")
    # the record's curve is what the trial reported at each evaluation, and the searcher is told its best
    assert [p.model_dump() for p in record.dev_curve] == [r.curve_point() for r in evals]
    assert last.metrics["best_dev_spearman"] == record.best_dev_spearman == \
        max(r.metrics["dev_spearman"] for r in evals)
    on_disk = exp / "runs" / record.filename
    assert read_record(on_disk) == record
    assert not (exp / "search" / "r1" / "t9" / "checkpoint").exists()  # a finished trial's checkpoints go

    written = on_disk.stat().st_mtime_ns
    again = MemoryReporter("t9")  # the same trial once more (a resumed search): the record, nothing trained
    run_trial({"hp": {"lr": 3.0e-4}}, ctx, reporter=again)
    assert len(again.results) == 1 and again.last.records == [record] and again.last.finished
    assert on_disk.stat().st_mtime_ns == written and read_record(on_disk) == record
