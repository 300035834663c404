"""A seed's live MLflow run (raysent.tracking.LiveRun) against a real sqlite store: the ``error`` tag says why a
run ended badly, and only while that is still true."""

from __future__ import annotations

from raysent.config import parse_config
from raysent.tracking import LiveRun, client, ensure_experiment, tracking_uri
from raysent.train.records import RunIdentity, RunRecord

CONFIG = {"name": "tracked", "method": "simcse-unsup", "model": {"name": "raw-bert-mini-mlm"},
          "data": {"train": "sts-unlabeled"}}


def test_a_resumed_run_that_finishes_no_longer_says_interrupted(tmp_path):
    cfg = parse_config({**CONFIG, "tracking": {"results_dir": str(tmp_path / "results")}})
    uri, experiment_id = tracking_uri(cfg), ensure_experiment(cfg)
    identity = RunIdentity(phase="search", hp={"lr": 1e-4}, seed=1, config_id="c0", trial_id="t0")
    id_file = tmp_path / "trial" / "mlflow_run_id"
    c = client(uri)

    first = LiveRun.open(uri, experiment_id, cfg, identity, None, id_file)
    first.fail("interrupted", "KILLED")  # Ctrl-C during training
    run = c.get_run(first.run_id)
    assert run.info.status == "KILLED" and run.data.tags["error"] == "interrupted"

    resumed = LiveRun.open(uri, experiment_id, cfg, identity, None, id_file)  # --resume: the same run goes on
    assert resumed.run_id == first.run_id
    run = c.get_run(resumed.run_id)
    assert run.info.status == "RUNNING" and "error" not in run.data.tags
    resumed.fail("interrupted", "KILLED")  # cut off again: it says so again
    assert c.get_run(first.run_id).data.tags["error"] == "interrupted"

    record = RunRecord(**identity.model_dump(), experiment="tracked", search="s0", method=cfg.method,
                       model=cfg.model.name, config=cfg.to_dict(), best_dev_spearman=50.0, learned=True,
                       scores={"sts/stsb": 70.0}, finished_at=1.7e9)
    LiveRun(uri, first.run_id).finish(cfg, record)  # ends with its record, without being opened again
    run = c.get_run(first.run_id)
    assert run.info.status == "FINISHED" and "error" not in run.data.tags
    assert run.data.metrics["best_dev_spearman"] == 50.0 and run.data.metrics["sts/stsb"] == 70.0
    assert run.data.tags["learned"] == "true" and run.data.tags["diverged"] == "unknown"
    assert [r.info.run_id for r in c.search_runs([experiment_id])] == [first.run_id]  # one run throughout
