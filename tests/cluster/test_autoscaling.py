"""A GPU cluster used without being told: on Ray's autoscaling test cluster (tests/cluster/autoscaling.py) with the
node types of clusters/gpu.yaml, a CPU head alone at the start, `gpus_per_worker: auto` counts the GPUs the autoscaler
can start, `max_concurrent_trials: auto` runs as many trials as they hold, the dry run says so, and a search makes the
autoscaler start GPU nodes and trains there (on the CPU: the nodes' GPUs are fake)."""

from __future__ import annotations

import json
import subprocess

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


@pytest.fixture(scope="module")
def cluster():
    from autoscaling import IsolatedAutoscalingCluster, gpu_yaml_node_types  # imports ray: not at collection

    head, types, max_workers = gpu_yaml_node_types()
    assert head == {"CPU": 8, "GPU": 0} and {t["min_workers"] for t in types.values()} == {0}
    c = IsolatedAutoscalingCluster(head, types, max_workers=max_workers)
    c.start()
    try:
        yield c
    finally:
        c.shutdown()


def test_the_dry_run_counts_the_gpus_the_autoscaler_can_start(cluster):
    """clusters/gpu.yaml: 10 worker nodes at most, up to 2 of 8 A100s and 8 of 1 A10G: 24 GPUs, none alive."""
    proc = run_cli("tune", "search_spaces/sgopt.yaml", "--dry-run", "--address", cluster.address, "--format", "json",
                   "--set", "model.name=raw-bert-mini-mlm", env={"RAY_AUTH_MODE": "disabled"})
    plan = json.loads(proc.stdout)
    res = plan["resources"]
    assert res["GPU"].startswith("1 (auto: the Ray cluster with the nodes its autoscaler can add (node types of ")
    assert "alive now: 8 CPUs, 0 GPUs) has 24 GPU(s); how many trials share one is measured on a GPU when the " \
        "search starts)" in res["GPU"]
    assert res["trials at once"]["search"] == "24 (auto: 24 GPUs / 1 per trial)"
    assert res["trains on"] == "cuda in its own process: 1 GPU(s)"
    assert plan["checked"]["resources"]["trials at once"] == "24 (auto: 24 GPUs / 1 per trial)"
    assert {"sts12", "sickr"} <= set(plan["checked"]["data"])  # the final phase's test sets, read first


def test_a_search_makes_the_autoscaler_start_gpu_nodes_and_trains_there(cluster, tiny_bert, tmp_path):
    path = experiment(tmp_path, "grow", SEARCH, "[1]", sts_sets="[stsb]", model=tiny_bert, max_steps=2,
                      tracking=", enabled: false")
    try:
        done = run_cli("tune", path, "--address", cluster.address, env={"RAY_AUTH_MODE": "disabled"}, timeout=300)
    except subprocess.TimeoutExpired as exc:  # where the search and the cluster stood (alone: 28-45 s)
        said = exc.output.decode(errors="replace") if isinstance(exc.output, bytes) else str(exc.output or "")
        raise AssertionError(f"the search hung; it printed:\n{said[-4000:]}\n"
                             f"the cluster's logs:\n{cluster.log_tail()}") from None
    said = done.stderr
    assert "resources.gpus_per_worker 1 (auto:" in said and "2 trial(s) at once (trials in the phase)" in said, \
        said[-3000:]
    exp = tmp_path / "results" / "grow"
    records = [json.loads(p.read_text()) for p in sorted((exp / "runs").glob("*.json"))]
    assert sorted(r["phase"] for r in records) == ["final", "search", "search"]
    head = json.loads((exp / "state.json").read_text())["resources"]
    assert head["gpus_per_worker"] == 1.0
    assert all(r["config"]["resources"]["gpus_per_worker"] == 1.0 for r in records)
    assert all(r["config"]["search"]["max_concurrent_trials"] == 24 for r in records)
    nodes = {r["node"] for r in records}
    assert nodes and all(n.startswith("fffff") for n in nodes), nodes  # the fake GPU nodes the autoscaler started
