"""A seed's live MLflow run (raysent.tracking.LiveRun) against a real sqlite store: the ``error`` tag says why a
run ended badly, and only while that is still true; a new store is a copy of an empty one MLflow made."""

from __future__ import annotations

from pathlib import Path

from raysent import tracking
from raysent.config import parse_config
from raysent.tracking import LiveRun, client, ensure_experiment, new_sqlite_store, tracking_uri
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


def test_a_new_store_is_a_copy_of_an_empty_one_mlflow_made(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYSENT_CACHE_DIR", str(tmp_path / "cache"))
    first, second = tmp_path / "a" / "mlflow.db", tmp_path / "b" / "mlflow.db"
    first.parent.mkdir()
    second.parent.mkdir()
    assert new_sqlite_store(first, tmp_path / "a" / "mlartifacts")  # MLflow makes the empty store, once
    assert [p.name for p in (tmp_path / "cache" / "mlflow").iterdir()] == [f"empty-store-{_mlflow_version()}.db"]

    def no_mlflow(uri):
        raise AssertionError(f"MLflow asked to make {uri}")

    with monkeypatch.context() as m:
        m.setattr(tracking, "client", no_mlflow)
        assert new_sqlite_store(second, tmp_path / "b" / "mlartifacts")  # a copy: no migrations
    assert sorted(p.name for p in second.parent.iterdir()) == ["mlflow.db"]  # no temporary file left
    # MLflow opens the copy (it refuses a store not at its schema's head revision) and writes runs and models
    c = client(f"sqlite:///{second}")
    assert [(e.name, e.artifact_location) for e in c.search_experiments()] == [
        ("Default", (tmp_path / "b" / "mlartifacts" / "0").as_uri())]
    run = c.create_run(c.create_experiment("x")).info.run_id
    c.log_metric(run, "dev_spearman", 50.0)
    c.create_registered_model("m")
    assert c.get_run(run).data.metrics == {"dev_spearman": 50.0}
    # a store already there is left as it is
    assert new_sqlite_store(second, tmp_path / "elsewhere")
    assert c.get_experiment_by_name("x") is not None and c.get_registered_model("m").name == "m"
    # a cache folder that cannot be made: False and nothing made (MLflow then makes the store itself)
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("RAYSENT_CACHE_DIR", str(tmp_path / "file" / "cache"))
    assert not new_sqlite_store(tmp_path / "c.db", tmp_path / "mlartifacts")
    assert not (tmp_path / "c.db").exists() and not list(tmp_path.glob(".c.db.*"))
    # MLflow failing halfway through making the empty store: nothing half-made is left in the cache folder
    monkeypatch.setenv("RAYSENT_CACHE_DIR", str(tmp_path / "cache2"))

    def half_made(uri):
        Path(uri.removeprefix("sqlite:///")).write_text("a store cut off by a failed migration")
        raise RuntimeError("migration failed")

    with monkeypatch.context() as m:
        m.setattr(tracking, "client", half_made)
        assert not new_sqlite_store(tmp_path / "d.db", tmp_path / "mlartifacts")
    assert list((tmp_path / "cache2" / "mlflow").iterdir()) == [] and not (tmp_path / "d.db").exists()


def _mlflow_version() -> str:
    import mlflow

    return mlflow.__version__
