"""GPUs are claimed, never borrowed (raysent.train.resources): ``resources.gpus_per_worker: auto`` is 1 on a Ray
cluster with GPUs and 0 without; a fraction shares a GPU between trials; a trial or Ray Train worker that asked for
no GPU sees none, whatever Ray's default; preflight and ``--dry-run`` say where each trial trains and how many run at
once. This machine has no GPU: a Ray told it has one (``ray.init(num_gpus=1)``) stands for a GPU node, and nothing
trains on it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from raysent import preflight
from raysent.config import load_config, parse_config
from raysent.errors import ConfigError
from raysent.preflight import check_resources
from raysent.train import resources
from raysent.train.resources import (
    VISIBLE,
    claim_devices,
    placement,
    resolve,
    train_worker_resources,
    tune_trial_resources,
)

from conftest import RAW_BERT

BASE = {"name": "r", "method": "simcse-unsup", "model": {"name": RAW_BERT},
        "search": {"algorithm": "grid", "warm_start": "none", "max_concurrent_trials": 8, "space": {"lr": {"type": "choice", "values": [1.0e-4, 3.0e-4]}}}}


def cfg(**res):
    return parse_config({**BASE, "resources": res}, source="<test>")


def test_gpus_per_worker_is_auto_by_default_and_a_bad_value_names_file_field_and_what_is_allowed(tmp_path):
    assert cfg().resources.gpus_per_worker == "auto"
    assert cfg(gpus_per_worker=0.25).resources.gpus_per_worker == 0.25
    assert cfg(gpus_per_worker=2).resources.gpus_per_worker == 2.0
    for value, why in (("1.5", "a share of a GPU is at most 1, and more than one GPU is a whole number"),
                       ("-1", "a negative number"), ("many", "allowed: \"auto\""),
                       ("0.5\n  workers: 2", "cannot hold two workers on one GPU")):
        path = tmp_path / "exp.yaml"
        path.write_text(f"name: r\nmethod: simcse-unsup\nmodel: {{name: m}}\nresources:\n  gpus_per_worker: {value}\n")
        with pytest.raises(ConfigError) as exc:
            load_config(path)
        msg = str(exc.value)
        assert f"{path}:5: resources.gpus_per_worker: got" in msg and why in msg, msg
        assert "or a number >= 0" in msg or "workers" in value, msg


def test_auto_is_one_gpu_on_a_cluster_with_gpus_and_none_without_and_a_number_stays():
    for have, want in ((8.0, 1.0), (1.0, 1.0), (0.0, 0.0)):
        resolved, place = resolve(cfg(), {"CPU": 16.0, "GPU": have})
        assert resolved.resources.gpus_per_worker == want and place.gpus_per_worker == want and place.auto
        assert resolved.to_dict()["resources"]["gpus_per_worker"] == want  # what the trials and records get
        assert tune_trial_resources(resolved) == {"CPU": 1.0, "GPU": want}
    resolved, place = resolve(cfg(gpus_per_worker=0.25), {"CPU": 16.0, "GPU": 0.0})
    assert resolved.resources.gpus_per_worker == 0.25 and not place.auto
    assert "auto: the Ray cluster has 8 GPU(s)" in resolve(cfg(), {"CPU": 16.0, "GPU": 8.0})[1].describe()
    # a cluster that has no GPU yet says what an autoscaling cluster needs
    assert "give the number: resources.gpus_per_worker: 1 (or RAYSENT_AUTOSCALING_CONFIG=its YAML)" in \
        resolve(cfg(), {"CPU": 4.0, "GPU": 0.0})[1].gpus()
    with pytest.raises(RuntimeError, match="still 'auto'"):
        tune_trial_resources(cfg())


def test_what_a_trial_and_a_ray_train_worker_ask_for():
    # in its own process: its CPUs and GPUs; on Ray Train workers: the trial's driver a little CPU, each worker its own
    assert tune_trial_resources(cfg(gpus_per_worker=0.25, cpus_per_worker=2)) == {"CPU": 2.0, "GPU": 0.25}
    trained = cfg(workers=2, gpus_per_worker=1, cpus_per_worker=3, trial_cpus=0.2)
    assert tune_trial_resources(trained) == {"CPU": 0.2}
    assert train_worker_resources(trained) == (True, {"CPU": 3.0, "GPU": 1.0})
    assert train_worker_resources(cfg(workers=1, gpus_per_worker=0)) == (False, {"CPU": 1.0})


def test_trials_at_once_are_what_the_gpus_cpus_and_max_concurrent_trials_allow():
    one_gpu = {"CPU": 16.0, "GPU": 1.0}
    place = placement(cfg(gpus_per_worker=0.25), one_gpu, "the Ray cluster", trials=8)
    assert (place.at_once, place.limit) == (4, "1 GPUs / 0.25 per trial")
    assert place.device == "cuda in its own process: 0.25 of a GPU, shared with 3 other trial(s)"
    assert placement(cfg(gpus_per_worker=0.25), one_gpu, "x", trials=2).at_once == 2  # a phase of 2 trials
    assert placement(cfg(gpus_per_worker=0.25, cpus_per_worker=8), one_gpu, "x").at_once == 2  # the CPUs
    four = placement(cfg(workers=2, gpus_per_worker=1), {"CPU": 64.0, "GPU": 4.0}, "x")
    assert four.at_once == 2 and four.per_trial == {"CPU": 2.1, "GPU": 2.0} and "NCCL" in four.device
    cpu = placement(cfg(), {"CPU": 2.0, "GPU": 0.0}, "this machine")
    assert cpu.device == "the CPU in its own process (it asks for no GPU and sees none)" and cpu.at_once == 2
    unknown = placement(cfg(), None, "the Ray cluster")
    assert unknown.gpus_per_worker is None and unknown.at_once is None and "not known" in unknown.device


def auto_cfg(**res):
    raw = {**BASE, "search": {**BASE["search"], "max_concurrent_trials": "auto"}, "resources": res}
    return parse_config(raw, source="<test>")


def test_max_concurrent_trials_is_auto_by_default_and_resolves_to_what_the_cluster_holds():
    assert parse_config({k: v for k, v in BASE.items() if k != "search"} | {"search": {
        "space": BASE["search"]["space"]}}).search.max_concurrent_trials == "auto"
    on_gpus, place = resolve(auto_cfg(), {"CPU": 232.0, "GPU": 24.0}, "the Ray cluster", trials=6)
    assert on_gpus.search.max_concurrent_trials == 24 and place.at_once == 6  # Tune's cap; this phase has 6
    assert place.limit == "trials in the phase"
    assert resolve(auto_cfg(), {"CPU": 2.0, "GPU": 0.0}, "this machine")[0].search.max_concurrent_trials == 2
    ray_train = resolve(auto_cfg(workers=2, cpus_per_worker=3, trial_cpus=0.5), {"CPU": 232.0, "GPU": 24.0})[0]
    assert ray_train.search.max_concurrent_trials == 12  # 2 GPUs a trial
    capped = resolve(cfg(), {"CPU": 232.0, "GPU": 24.0})[0]
    assert capped.search.max_concurrent_trials == 8  # a number caps it
    with pytest.raises(ConfigError, match="at least 1 trial, or auto"):
        parse_config({**BASE, "search": {**BASE["search"], "max_concurrent_trials": 0}})


def test_what_an_autoscaler_config_can_start_is_counted_within_its_max_workers(tmp_path, monkeypatch):
    """clusters/gpu.yaml: a CPU head of 8, 0-8 nodes of 1 A10G (4 CPUs), 0-2 nodes of 8 A100s (96 CPUs), at most
    10 worker nodes: 24 GPUs, 232 CPUs."""
    import yaml

    config = yaml.safe_load((Path(__file__).parents[2] / "clusters" / "gpu.yaml").read_text())
    assert resources.capacity_of_config(config) == {"CPU": 232.0, "GPU": 24.0}
    config["max_workers"] = 3  # 3 nodes: the two 8-GPU ones first, then one A10G for GPUs; for CPUs, the 96s
    assert resources.capacity_of_config(config) == {"CPU": 8 + 96 + 96 + 4.0, "GPU": 17.0}
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(config))
    monkeypatch.setenv(resources.AUTOSCALING_CONFIG_VAR, str(path))
    assert resources.autoscaler_config_path("127.0.0.1:1") == str(path)


def test_a_process_given_no_gpu_hides_every_gpu_and_one_given_a_gpu_keeps_it(monkeypatch):
    monkeypatch.setenv(VISIBLE, "0,1")  # what a process that asked for no GPU inherits since Ray 2.5x
    assert claim_devices(gpu_ids=[]) == torch.device("cpu") and os.environ[VISIBLE] == ""
    assert claim_devices(gpu_ids=[]) == torch.device("cpu")  # again: the same
    monkeypatch.setenv(VISIBLE, "1")  # what Ray sets for a process it gave GPU 1
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert claim_devices(gpu_ids=["1"]) == torch.device("cuda") and os.environ[VISIBLE] == "1"
    # outside Ray, a process is given no GPU (an earlier test of this process may have left a Ray up: the check is
    # of what claim_devices reads, not of this process's past)
    monkeypatch.setenv(VISIBLE, "0")
    monkeypatch.setattr(resources, "assigned_gpu_ids", list)
    assert claim_devices() == torch.device("cpu") and os.environ[VISIBLE] == ""


def test_the_trials_hooks_train_on_the_claimed_device_whatever_torch_saw(monkeypatch, tmp_path):
    from raysent.tune.trial import TuneHooks

    monkeypatch.setenv(VISIBLE, "0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # torch touched CUDA before the trial hid it
    assert TuneHooks(tmp_path).device == torch.device("cpu")  # no GPU was given (outside Ray: none)


def test_preflight_and_the_dry_run_say_where_each_trial_trains_and_how_many_run_at_once(monkeypatch, tmp_path):
    from raysent.tune.plan import dry_run

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    # not in a Ray that another test of this process left running
    monkeypatch.setattr(resources, "cluster_capacity", lambda: None)
    monkeypatch.setattr(preflight, "connected_ray", lambda: None)
    monkeypatch.setattr(resources, "this_machine", lambda: {"CPU": 16.0, "GPU": 1.0})  # a one-GPU machine
    c = cfg(gpus_per_worker=0.25)
    checked = check_resources(c)
    assert checked["trains on"] == "cuda in its own process: 0.25 of a GPU, shared with 3 other trial(s)"
    assert checked["trials at once"] == "4 (1 GPUs / 0.25 per trial)" and checked["per trial"]["GPU"] == 0.25
    plan = dry_run(c, tmp_path / "r").to_dict()["resources"]
    assert plan["trains on"] == checked["trains on"] and plan["GPU"] == "0.25"
    # the search has 2 configurations × 1 seed, the final phase 1 seed
    assert plan["trials at once"] == {"search": "2 (trials in the phase)", "final": "1 (trials in the phase)"}
    auto = check_resources(cfg())
    assert auto["gpus_per_worker"] == "1 (auto: this machine has 1 GPU(s))" and auto["trials at once"].startswith("1 ")
    # `raysent train` without workers starts no Ray: one run, on the device this process sees
    alone = check_resources(cfg(), one_run=True)
    assert alone["trains on"].startswith("cuda in this process") and "trials at once" not in alone
    monkeypatch.setattr(resources, "this_machine", lambda: {"CPU": 2.0, "GPU": 0.0})
    assert check_resources(cfg())["trains on"] == "the CPU in its own process (it asks for no GPU and sees none)"
    # a cluster joined by address: auto is known only once the run joins it
    remote = check_resources(cfg(address="127.0.0.1:6379"))
    assert remote["gpus_per_worker"].startswith("auto: 1 if the Ray cluster has GPUs")


@pytest.mark.slow  # a Ray of its own with a fake GPU, 9 probe trials and a Ray Train worker (~1 min on 2 cores)
def test_on_a_gpu_cluster_each_trial_holds_what_it_asked_for_and_sees_only_that(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.pop("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", None)  # Ray's default, unless raysent's own Ray sets it
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("fake_gpu_cluster.py")), str(tmp_path)],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-5000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["cluster"] == {"CPU": 8.0, "GPU": 1.0}
    # auto on this cluster: one GPU per trial, so one trial at once
    assert out["auto"]["gpus_per_worker"] == 1.0 and out["auto"]["at_once"] == 1
    assert "auto: the Ray cluster has 1 GPU(s)" in out["auto"]["describe"]
    # a quarter of the GPU each: four trials hold it at once, never more; each is given GPU 0 and sees only it
    trials = out["quarter"]["trials"]
    assert len(trials) == 8 and out["quarter"]["plan"]["at_once"] == 4
    assert max(t["peak"] for t in trials) == 4
    for t in trials:
        assert json.loads(t["given"]) == {"CPU": 0.5, "GPU": 0.25}
        assert json.loads(t["gpu_ids"]) == ["0"] and json.loads(t["after"]) == "0"
        # on a machine with a real GPU (the script runs there as here) the trial trains on it
        assert t["device"] == ("cuda" if torch.cuda.is_available() else "cpu")
    assert len({t["pid"] for t in trials}) < 8  # Tune reused trial processes (function trainables, reuse_actors)
    # no GPU asked for: Ray gave none, and the trial sees none (hidden by the Ray raysent started, and again by
    # the trial itself), so it trains on the CPU
    (zero,) = out["zero"]["trials"]
    assert json.loads(zero["gpu_ids"]) == [] and json.loads(zero["given"]).get("GPU", 0) == 0
    assert json.loads(zero["before"]) == "" and json.loads(zero["after"]) == "" and zero["device"] == "cpu"
    # a Ray Train worker that asked for no GPU: the same, and Ray Train hands the loop the CPU
    worker = out["workers"]["zero"]
    assert worker["asked"] == {"CPU": 0.5} and not worker["use_gpu"]
    assert worker["seen"] == {"gpu_ids": [], "before": "", "after": "", "device": "cpu", "train_device": "cpu"}
    # raysent's own trainer: auto is a whole GPU per worker over NCCL, 0 is gloo on the CPU
    assert out["trainers"]["auto"] == {"use_gpu": True, "per_worker": {"CPU": 0.5, "GPU": 1.0}, "backend": "nccl",
                                       "config_gpus": 1.0}
    assert out["trainers"]["zero"] == {"use_gpu": False, "per_worker": {"CPU": 0.5}, "backend": "gloo",
                                       "config_gpus": 0.0}
