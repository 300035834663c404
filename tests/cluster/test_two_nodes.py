"""A search by `--address` on a 2-node Ray cluster whose second node cannot see the driver's files (it runs in its own mount
namespace, with a private tmpfs over the results folder), as a cluster's worker nodes cannot: raysent serves
its local MLflow store to the trials on the driver's cluster address for the time of the search, and afterwards
every seed run is in the driver's store with its live curve and its files, every run record is in results/, and
the best model, trained on the other node, is in results/ and registered."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys

import psutil
import pytest

from conftest import run_cli
from conftest import tiny_experiment as experiment

pytestmark = [pytest.mark.slow, pytest.mark.shared]

SEARCH = """\
  algorithm: grid
  warm_start: none
  seeds: 1
  space:
    lr: {type: choice, values: [1.0e-4, 3.0e-4]}
"""


def unshare_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "--mount", "sh", "-c", "mount -t tmpfs tmpfs /mnt"],
                          capture_output=True).returncode == 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_cluster(temp_dir: str) -> None:
    """Every process of this test's cluster (never another Ray on the machine, as `ray stop` would)."""
    roots = [p for p in psutil.process_iter(["cmdline"]) if any(temp_dir in part for part in p.info["cmdline"] or [])]
    procs = {p.pid: p for r in roots for p in [r, *r.children(recursive=True)]}
    for p in procs.values():
        try:
            p.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(list(procs.values()), timeout=15)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass


@pytest.mark.skipif(not unshare_works(), reason="needs `unshare --mount` to give the second node its own files")
def test_a_search_on_two_nodes_keeps_every_run_in_the_drivers_store(tiny_bert, tmp_path):
    from mlflow.tracking import MlflowClient

    ray_bin = shutil.which("ray") or os.path.join(os.path.dirname(os.sys.executable), "ray")
    results = tmp_path / "results"
    results.mkdir()
    temp_dir = f"/tmp/rs-{os.getpid()}-{free_port()}"  # Ray's sockets need a short path
    port = free_port()
    env = {**{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}, "RAY_AUTH_MODE": "disabled"}
    common = ["--node-ip-address=127.0.0.1", f"--temp-dir={temp_dir}", "--disable-usage-stats"]
    try:
        # the head has no CPU for trials: they all run on the second node
        subprocess.run([ray_bin, "start", "--head", f"--port={port}", "--num-cpus=0", "--include-dashboard=false",
                        *common], check=True, capture_output=True, env=env, timeout=120)
        node = (f"mount -t tmpfs tmpfs '{results}' && exec '{ray_bin}' start --address=127.0.0.1:{port} "
                f"--num-cpus=2 {' '.join(common)}")
        subprocess.run(["unshare", "--mount", "sh", "-c", node], check=True, capture_output=True, env=env,
                       timeout=120)
        nodes = subprocess.run(
            [sys.executable, "-c", f"import ray, json; ray.init(address='127.0.0.1:{port}', log_to_driver=False); "
             "print(json.dumps([n['Resources'].get('CPU', 0) for n in ray.nodes() if n['Alive']]))"],
            capture_output=True, text=True, env=env, timeout=120)
        assert sorted(json.loads(nodes.stdout.strip().splitlines()[-1])) == [0, 2]
        # Tune's state goes to storage the driver never created (on a cluster: storage every node shares)
        storage = tmp_path / "shared-storage" / "not" / "created"
        path = experiment(tmp_path, "two", SEARCH, "[1, 2]", sts_sets="[stsb]", resources=f", storage_path: {storage}",
                          model=tiny_bert)
        address = ["--address", f"127.0.0.1:{port}"]  # the address from --address alone
        # a store no trial node can reach is refused before the first trial
        refused = run_cli("tune", path, *address, "--set", "tracking.server=never", env=env, check=False, timeout=300)
        assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr[-3000:]
        assert "is a file on this machine, and the search runs on 2 nodes" in refused.stderr
        assert not list((results / "two").glob("runs/*.json"))
        done = run_cli("tune", path, *address, env=env, timeout=600)
    finally:
        stop_cluster(temp_dir)

    said = done.stderr
    assert "the search runs on 2 node(s) and its store is a file here" in said, said[-3000:]
    url = said.split("to the trials at ")[1].split()[0]
    host = url.removeprefix("http://").rsplit(":", 1)[0]  # the driver's address in the cluster, not 0.0.0.0
    assert host not in ("0.0.0.0", "") and f"(listening on {host} only" in said
    assert f"stopped the tracking server at {url}" in said
    assert not [p for p in psutil.process_iter(["cmdline"]) if "mlflow" in " ".join(p.info["cmdline"] or [])
                and url.rsplit(":", 1)[1] in " ".join(p.info["cmdline"] or [])]
    exp = results / "two"
    # the server ran without MLflow's job runner (its Huey consumers: 8 more processes, ~30 CPU-s)
    assert "mlflow.server.jobs" not in (exp / "mlflow-server.log").read_text()
    assert not (exp / "search").exists()  # the trials' folders were on the other node's own disk
    from raysent.train.records import read_record

    records = [read_record(p).model_dump(mode="json") for p in sorted((exp / "runs").glob("*.json"))]
    assert sorted(r["phase"] for r in records) == ["final", "final", "search", "search"]
    client = MlflowClient(tracking_uri=f"sqlite:///{results / 'mlflow.db'}")
    assert len({r["node"] for r in records}) == 1  # the second node's (the head has no CPU for a trial)
    for r in records:
        run = client.get_run(r["mlflow_run_id"])
        assert run.info.status == "FINISHED"
        curve = client.get_metric_history(r["mlflow_run_id"], "dev_spearman")
        assert [m.step for m in curve] == [p["step"] for p in r["dev_curve"]] == [2, 4]  # live, at each evaluation
        assert {a.path for a in client.list_artifacts(r["mlflow_run_id"])} >= {"config.yaml", "result.json"}
    # Tune's experiment state and trial folders went to the storage path, which Ray created
    search = json.loads((exp / "summary.json").read_text())["search"]
    assert (storage / "two" / f"search-{search}").is_dir() and (storage / "two" / f"final-{search}").is_dir()
    assert len(list((storage / "two" / f"search-{search}").glob("*/result.json"))) == 2
    assert not (exp / "tune").exists()
    # the best final model came here from the other node's disk, with its card, and is registered
    published = json.loads((exp / "summary.json").read_text())["published"]
    best = exp / published["best_model_dir"]  # relative to the experiment's folder in the file
    assert json.loads((best / "raysent.json").read_text())["method"] == "simcse-unsup"
    assert "— searched best" in (best / "README.md").read_text()
    assert published["registered"]["version"] == "1"
    assert client.get_model_version("two", "1").run_id == published["model"]["run_id"]
