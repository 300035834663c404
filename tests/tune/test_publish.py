"""A search whose outcome MLflow cannot take: each case is one clear error that says what to do, before Ray
starts where it can be known then, and no case loses the search's records; `--resume` then logs the outcome
without training."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from raysent.config import load_config

from conftest import REPO, cli_in_process
from conftest import tiny_experiment as experiment

pytestmark = [pytest.mark.slow, pytest.mark.shared]

ONE_POINT = """\
  algorithm: grid
  warm_start: none
  seeds: 1
  space:
    lr: {type: choice, values: [1.0e-4]}
"""


def unshare_works() -> bool:
    """Whether this machine lets the tests mount a read-only folder in a mount namespace of their own."""
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "--mount", "sh", "-c", "mount -t tmpfs -o ro tmpfs /mnt"],
                           capture_output=True)
    return probe.returncode == 0


def one_error_line(proc) -> str:
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("raysent: error:")]
    assert len(errors) == 1, proc.stderr[-3000:]
    return errors[0]


def test_a_taken_model_name_and_an_unreachable_registry_stop_the_search_before_ray(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    from raysent.tune import driver

    def no_ray(*args, **kwargs):  # in the test's process a session Ray may be up already: starting one is the error
        raise AssertionError("the search started Ray before its registry checks")

    monkeypatch.setattr(driver, "init_ray", no_ray)

    path = experiment(tmp_path, "taken", ONE_POINT, "[1]")
    store = f"sqlite:///{tmp_path / 'results' / 'mlflow.db'}"
    (tmp_path / "results").mkdir()
    MlflowClient(tracking_uri=store).create_registered_model("taken")  # someone else's model of that name
    proc = cli_in_process("tune", path, check=False)
    line = one_error_line(proc)
    assert "already has a model named 'taken'" in line and "--set tracking.registered_model=NAME" in line
    assert "Ray" not in proc.stderr and not (tmp_path / "results" / "taken" / "runs").exists()

    proc = cli_in_process("tune", path, "--set", "tracking.registry_uri=http://127.0.0.1:1", check=False)
    line = one_error_line(proc)
    assert "the MLflow model registry http://127.0.0.1:1 does not answer" in line
    assert "tracking.log_model: none" in line and "Ray" not in proc.stderr


@pytest.mark.skipif(not unshare_works(), reason="needs `unshare --mount` (a read-only mount of the test's own)")
def test_a_read_only_parent_artifact_store_keeps_the_records_and_resume_logs_the_outcome(ray_cluster, tiny_bert,
                                                                                        tmp_path):
    """The search and its final phase finish; the parent run's artifact folder is on a read-only file system when
    the outcome is logged: one error after the summary, every record kept, the search's state at that step.
    `--resume` on a writable store then logs it (table, model, registry) and trains nothing."""
    from mlflow.tracking import MlflowClient

    from raysent.tune.driver import tune_experiment

    path = experiment(tmp_path, "ro", ONE_POINT, "[1]", sts_sets="[stsb]", model=tiny_bert)
    tune_experiment(load_config(path), quiet=True, search_only=True)  # the search; its parent run exists
    exp = tmp_path / "results" / "ro"
    state = json.loads((exp / "state.json").read_text())
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'results' / 'mlflow.db'}")
    artifacts = client.get_run(state["parent_run_id"]).info.artifact_uri.removeprefix("file://")
    os.makedirs(artifacts, exist_ok=True)
    env = {**os.environ, "RAY_ADDRESS": ray_cluster}
    proc = subprocess.run(["unshare", "--mount", "sh", "-c", f"mount -t tmpfs -o ro tmpfs '{artifacts}' && exec "
                           f"'{sys.executable}' -m raysent.cli tune '{path}' --resume --quiet"],
                          capture_output=True, text=True, env=env, cwd=REPO)
    line = one_error_line(proc)
    assert "artifact store" in line and "Read-only file system" in line and "--resume" in line
    assert "final phase on seeds [1]" in proc.stdout  # the summary came first
    runs = exp / "runs"
    records = {p.name: p.stat().st_mtime_ns for p in runs.glob("*.json")}
    assert sorted(n.split("-")[0] for n in records) == ["final", "search"]
    assert json.loads((exp / "state.json").read_text())["phase"] == "publish"

    done = cli_in_process("tune", path, "--resume")
    assert "registered: models:/ro/1" in done.stdout
    assert {p.name: p.stat().st_mtime_ns for p in runs.glob("*.json")} == records  # nothing trained again
    assert "Trial status" not in done.stdout + done.stderr  # no Tune run at all
    assert {"summary.md", "summary.csv", "best.yaml"} <= {a.path for a in client.list_artifacts(state["parent_run_id"])}
    assert json.loads((exp / "state.json").read_text())["phase"] == "done"
