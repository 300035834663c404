"""A real multi-node Ray cluster on this machine: `ray start --head` plus a second node with its own
resources, both on loopback, and a tiny `raysent tune --address` against it (two trials at once, one
CPU per node, so each node runs one), with Tune's storage in a folder the driver never created (as on a
cluster, where it is shared storage). Ray Train inside Tune trials is covered by tests/tune/test_tune.py and
the 2-worker runs by tests/train/test_ray_train.py; here the trials train in their own process to keep it short."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import RAW_BERT, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.shared]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ray(*args: str, env: dict) -> subprocess.CompletedProcess:
    ray = shutil.which("ray", path=os.path.dirname(sys.executable)) or "ray"
    proc = subprocess.run([ray, *args], capture_output=True, text=True, env=env, timeout=180)
    if proc.returncode != 0:
        raise AssertionError(f"ray {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture
def two_node_cluster():
    """Head (1 CPU) + worker node (1 CPU, custom resource 'second_node'), both on 127.0.0.1.

    A cluster of its own beside the test session's Ray: its own ports and temp folder, and stopped by
    that folder (`ray stop` would stop every Ray on the machine, the session's too).
    """
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    temp = tempfile.mkdtemp(prefix="rsc", dir="/tmp")  # short: Ray's socket paths must stay < 108 bytes
    port = _free_port()
    address = f"127.0.0.1:{port}"
    common = ["--node-ip-address", "127.0.0.1", "--disable-usage-stats", "--temp-dir", temp,
              "--node-manager-port", str(_free_port()), "--object-manager-port", str(_free_port())]
    try:
        _ray("start", "--head", "--port", str(port), "--num-cpus", "1", "--include-dashboard", "false",
             "--ray-client-server-port", str(_free_port()), *common, env=env)
        common[-3:] = [str(_free_port()), "--object-manager-port", str(_free_port())]
        _ray("start", "--address", address, "--num-cpus", "1", "--resources", '{"second_node": 1}', *common,
             env=env)
        yield address, env
    finally:
        _stop_cluster(temp)
        shutil.rmtree(temp, ignore_errors=True)


def _cluster_pids(temp: str) -> list[int]:
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if temp.encode() in cmdline.read_bytes() and int(cmdline.parent.name) != os.getpid():
                pids.append(int(cmdline.parent.name))
        except OSError:
            pass
    return pids


def _stop_cluster(temp: str) -> None:
    """Terminate every process of the cluster whose temp folder is ``temp`` (it is on their command lines)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in _cluster_pids(temp):
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        deadline = time.time() + 15
        while time.time() < deadline and _cluster_pids(temp):
            time.sleep(0.5)


def test_tune_by_address_on_a_two_node_cluster(two_node_cluster, tmp_path):
    address, env = two_node_cluster
    nodes = subprocess.run(
        [sys.executable, "-c", f"import ray, json; ray.init(address='{address}', log_to_driver=False); "
         "print(json.dumps([n['Resources'] for n in ray.nodes() if n['Alive']]))"],
        capture_output=True, text=True, env=env, timeout=120)
    resources = json.loads(nodes.stdout.strip().splitlines()[-1])
    assert len(resources) == 2 and sum(r.get("second_node", 0) for r in resources) == 1

    storage = tmp_path / "shared-storage" / "not" / "created"  # the driver never creates it
    results = tmp_path / "results"
    (tmp_path / "c.yaml").write_text(f"""\
name: on-cluster
method: simcse-unsup
model: {{name: {RAW_BERT}}}
data: {{train: stsb-unlabeled, dev: sickr:dev, max_train_samples: 64}}
train: {{batch_size: 16, max_steps: 2, eval_every: 2, max_length: 24, eval_at_start: false}}
params: {{pooling: mean}}
eval: {{tasks: [sts], sts_sets: [stsb, sickr], batch_size: 256, max_length: 48}}
seeds: [3]
resources: {{cpus_per_worker: 0.9, storage_path: {storage}}}
tracking: {{results_dir: {results}}}
search:
  algorithm: random
  warm_start: none
  num_samples: 2
  max_concurrent_trials: 2
  space:
    temperature: {{type: choice, values: [0.05, 0.1]}}
""")
    assert "RAY_ADDRESS" not in os.environ  # the address comes from --address alone
    proc = run_cli("tune", str(tmp_path / "c.yaml"), "--address", address, "--format", "json", "--quiet")
    summary = json.loads(proc.stdout)
    exp = results / "on-cluster"
    runs = sorted(p.name for p in (exp / "runs").glob("*.json"))
    assert len([r for r in runs if r.startswith("search-")]) == 2 and len([r for r in runs if r.startswith("final-")]) == 1
    assert summary["final"]["seeds"] == [3] and "sts/stsb" in summary["final"]["scores"]
    # Tune's experiment state and trial folders went to the storage path, which Ray created
    tune_dir = storage / "on-cluster"
    assert (tune_dir / f"search-{summary['search']}").is_dir() and (tune_dir / f"final-{summary['search']}").is_dir()
    assert len(list((tune_dir / f"search-{summary['search']}").glob("*/result.json"))) == 2
    assert not (exp / "tune").exists()
