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
from raysent.config import load_config, parse_config, with_overrides
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


SHARED_QUARTER = ("cuda in its own process: 0.25 of a GPU, shared with 3 other trial(s), its memory capped at 22.5% of "
                  "the GPU's")


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
    assert place.device == SHARED_QUARTER
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
    assert checked["trains on"] == SHARED_QUARTER
    assert checked["trials at once"] == "4 (1 GPUs / 0.25 per trial)" and checked["per trial"]["GPU"] == 0.25
    plan = dry_run(c, tmp_path / "r").to_dict()["resources"]
    assert plan["trains on"] == checked["trains on"] and plan["GPU"] == "0.25"
    # the search has 2 configurations × 1 seed, the final phase 1 seed
    assert plan["trials at once"] == {"search": "2 (trials in the phase)", "final": "1 (trials in the phase)"}
    auto = check_resources(cfg())
    assert auto["gpus_per_worker"] == ("1 (auto: this machine has 1 GPU(s); how many trials share one is measured on a "
                                       "GPU when the search starts)") and auto["trials at once"].startswith("1 ")
    assert checked["trials per GPU"] == 4 and auto["trials per GPU"] == 1
    # `raysent train` without workers starts no Ray: one run, on the device this process sees
    alone = check_resources(cfg(), one_run=True)
    assert alone["trains on"].startswith("cuda in this process") and "trials at once" not in alone
    monkeypatch.setattr(resources, "this_machine", lambda: {"CPU": 2.0, "GPU": 0.0})
    assert check_resources(cfg())["trains on"] == "the CPU in its own process (it asks for no GPU and sees none)"
    # a cluster joined by address: auto is known only once the run joins it
    remote = check_resources(cfg(address="127.0.0.1:6379"))
    assert remote["gpus_per_worker"].startswith("auto: 1 if the Ray cluster has GPUs")


@pytest.mark.slow  # a Ray of its own with a fake GPU, a GPU probe task, 17 probe trials, a Ray Train worker (~2 min)
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
    # auto where the probe ran: here it found no CUDA behind the fake GPU Ray gave it, and auto stays 1 per GPU
    unprobed = out["unprobed"]
    if not torch.cuda.is_available():
        assert unprobed["reason"] == ("1 trial per GPU: the GPU probe measured no step (no CUDA device on the probe's "
                                      "node (CUDA_VISIBLE_DEVICES='0'))"), unprobed
        assert not unprobed["cached"]  # nothing measured: the next search probes again
    # auto with the measurements cached: half a GPU each, and two trials hold it at once, never more
    packed = out["packed"]
    assert packed["gpus_per_worker"] == 0.5 and packed["plan"]["trials_per_gpu"] == 2
    assert packed["plan"]["at_once"] == 2 and "; 2 trial(s) per GPU; 2 trial(s) at once" in packed["describe"]
    assert len(packed["trials"]) == 8 and max(t["peak"] for t in packed["trials"]) == 2
    assert all(json.loads(t["given"]) == {"CPU": 0.5, "GPU": 0.5} for t in packed["trials"])
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


# --------------------------------------------------------------------------- many trials per GPU (auto packs them)
def test_auto_takes_the_probes_trials_per_gpu_and_an_explicit_number_wins():
    from fake_gpu_cluster import measured_probe

    from raysent.train.packing import choose

    packing = choose(measured_probe(), 8)  # 2 trials at once train 1.83× one's steps; 4 only 1.04× two's
    one_gpu = {"CPU": 8.0, "GPU": 1.0}
    packed, place = resolve(auto_cfg(), one_gpu, "the Ray cluster", trials=8, packing=packing)
    assert packed.resources.gpus_per_worker == 0.5 and tune_trial_resources(packed) == {"CPU": 1.0, "GPU": 0.5}
    assert (place.trials_per_gpu, place.at_once, packed.search.max_concurrent_trials) == (2, 2, 2)
    assert place.gpus().startswith("0.5 (auto: 2 trials per GPU: 55.0 steps/s together on NVIDIA H200, 1.83× one "
                                   "trial's 30.0 (by count: 1: 30.0, 2: 55.0, 4: 57.0)")
    assert "; 2 trial(s) per GPU; 2 trial(s) at once (auto: 1 GPUs / 0.5 per trial)" in place.describe()
    assert "its memory capped at 45.0% of the GPU's" in place.device
    assert place.record()["packing"]["probe"]["points"][1] == {"k": 2, "steps_per_second": 55.0, "peak_gib": 2.0,
                                                               "device_used_gib": 5.0, "error": None}
    # what every run record of the phase keeps
    assert resources.run_record(packed, place.record(), 8) == {
        "gpus_per_worker": 0.5, "trials_per_gpu": 2, "trials_at_once": 2, "memory_fraction": 0.45, "auto": True,
        "chosen": packing.reason}
    assert resources.run_record(packed, place.record(), 1)["trials_at_once"] == 1  # a phase of one trial
    # a number in the config wins, whatever the probe measured
    for given in (0.25, 1.0, 2.0, 0.0):
        kept, p = resolve(cfg(gpus_per_worker=given), one_gpu, trials=8, packing=packing)
        assert kept.resources.gpus_per_worker == given and p.packing is None
    # Ray Train trials are never packed (one NCCL group per trial); a CPU cluster trains on none
    assert resolve(cfg(workers=1), one_gpu, trials=8, packing=packing)[0].resources.gpus_per_worker == 1.0
    assert resolve(cfg(), {"CPU": 8.0, "GPU": 0.0}, trials=8, packing=packing)[0].resources.gpus_per_worker == 0.0
    # without a probe's choice, auto is what it was: 1 per GPU, and says it measures when the search starts
    alone = resolve(cfg(), one_gpu, trials=8)[1]
    assert alone.gpus_per_worker == 1.0 and alone.trials_per_gpu == 1
    assert alone.gpus() == ("1 (auto: the Ray cluster has 1 GPU(s); how many trials share one is measured on a GPU "
                            "when the search starts)")


def test_a_trial_on_a_share_of_a_gpu_caps_its_memory_at_that_share(monkeypatch, tmp_path):
    from raysent.tune import trial
    from raysent.tune.protocol import TrialContext
    from raysent.tune.trial import prepare_process

    calls = []
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, d=None: calls.append((f, str(d))))
    cuda = torch.device("cuda")
    assert resources.cap_memory(cuda, 0.25) == pytest.approx(0.225) and calls[-1] == (pytest.approx(0.225), "cuda")
    assert resources.cap_memory(cuda, 1.0) is None and calls[-1] == (1.0, "cuda")  # a reused process: uncapped again
    assert resources.cap_memory(torch.device("cpu"), 0.25) is None and len(calls) == 2  # the CPU: nothing to cap
    # a trial's process caps itself with its config's share, on the device it claimed
    monkeypatch.setattr(trial, "claim_devices", lambda: cuda)
    monkeypatch.setattr(trial, "reuse_across_runs", lambda: None)
    monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)
    ctx = TrialContext(config=cfg(gpus_per_worker=0.125).to_dict(), source="<test>", phase="search", run="r",
                       exp_dir=str(tmp_path), metric="best_dev_spearman")
    prepare_process(ctx)
    assert calls[-1] == (pytest.approx(0.1125), "cuda")


def test_the_probes_measurements_are_cached_in_the_experiment_and_read_instead_of_probing(monkeypatch, tmp_path):
    from fake_gpu_cluster import measured_probe

    from raysent.tune import gpu_probe

    said: list[str] = []
    c = auto_cfg()
    monkeypatch.setattr(gpu_probe, "gpu_node_cpus_per_gpu", lambda: None)  # no Ray here

    def no_probe(*args):
        raise AssertionError("probed although the experiment has the measurements")

    monkeypatch.setattr(gpu_probe, "run_on_ray", no_probe)
    gpu_probe.save(tmp_path, measured_probe(c))
    chosen = gpu_probe.packing_for(c, tmp_path, {"CPU": 8.0, "GPU": 1.0}, 8, said.append)
    assert chosen is not None and chosen.trials_per_gpu == 2
    assert said[0].startswith("GPU probe: the measurements of NVIDIA H200 in ") and "gpu-probe.json" in said[0]
    # other trial settings (a larger batch) are measured again; a probe that found no CUDA is not cached
    bigger = with_overrides(c, {"train.batch_size": 128})
    monkeypatch.setattr(gpu_probe, "run_on_ray", lambda cfg, most, env: gpu_probe.Probe(
        device="none", total_bytes=0, points=(), most=most, note="no CUDA device on the probe's node"))
    again = gpu_probe.packing_for(bigger, tmp_path, {"CPU": 8.0, "GPU": 1.0}, 8, said.append)
    assert again is not None and again.trials_per_gpu == 1 and "no CUDA device" in again.reason
    assert gpu_probe.load_cached(tmp_path, gpu_probe.probe_key(bigger), 8) is None
    assert gpu_probe.load_cached(tmp_path, gpu_probe.probe_key(c), 8) is not None  # the first one's stays
    assert gpu_probe.load_cached(tmp_path, gpu_probe.probe_key(c), 16) is None  # it would have tried 8 next
    # a probe that fails leaves 1 per GPU, and says why
    monkeypatch.setattr(gpu_probe, "run_on_ray", lambda *a: (_ for _ in ()).throw(TimeoutError("no GPU node came")))
    failed = gpu_probe.packing_for(bigger, tmp_path, {"CPU": 8.0, "GPU": 1.0}, 8, said.append)
    assert failed is not None and failed.reason == ("1 trial per GPU: the GPU probe failed (TimeoutError: no GPU "
                                                    "node came)")
    # nothing to pack: a number, Ray Train trials, no GPU; nothing to measure: a phase that fits the GPUs
    assert gpu_probe.packing_for(cfg(gpus_per_worker=1), tmp_path, {"CPU": 8.0, "GPU": 1.0}, 8, said.append) is None
    assert gpu_probe.packing_for(cfg(workers=1), tmp_path, {"CPU": 8.0, "GPU": 1.0}, 8, said.append) is None
    assert gpu_probe.packing_for(c, tmp_path, {"CPU": 8.0, "GPU": 0.0}, 8, said.append) is None
    fits = gpu_probe.packing_for(c, tmp_path, {"CPU": 64.0, "GPU": 8.0}, 8, said.append)
    assert fits is not None and fits.trials_per_gpu == 1
    assert fits.reason == ("1 trial per GPU: no more is worth measuring (8 trial(s) on 8 GPU(s), 8 CPUs per GPU at "
                           "resources.cpus_per_worker 1)")


def test_the_probe_measures_the_largest_batch_and_length_the_space_can_pick():
    from raysent.tune.gpu_probe import probe_config, probe_key

    raw = {**BASE, "train": {"batch_size": 64, "max_length": 32},
           "search": {**BASE["search"], "space": {**BASE["search"]["space"],
                                                   "batch_size": {"type": "choice", "values": [16, 512, 64]},
                                                   "max_length": {"type": "choice", "values": [32, 48]}}}}
    c = parse_config(raw, source="<test>")
    probed = probe_config(c)
    assert (probed.train.batch_size, probed.train.max_length) == (512, 48)
    assert probed.data.max_train_samples == 512 * 8 and not probed.tracking.enabled
    key = probe_key(c)
    assert key["train"]["batch_size"] == 512 and "lr" not in key["train"] and key["cpus_per_worker"] == 1.0
    assert probe_key(with_overrides(c, {"train.lr": 1.0e-3})) == key  # the learning rate changes neither time nor memory


def test_the_dry_run_shows_the_trials_per_gpu_the_cached_probe_chose(monkeypatch, tmp_path):
    from fake_gpu_cluster import measured_probe

    from raysent.tune import gpu_probe
    from raysent.tune.plan import dry_run

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(resources, "cluster_capacity", lambda: None)
    monkeypatch.setattr(preflight, "connected_ray", lambda: None)
    monkeypatch.setattr(resources, "this_machine", lambda: {"CPU": 8.0, "GPU": 1.0})
    c = auto_cfg()
    before = dry_run(c, tmp_path).to_dict()["resources"]  # nothing measured yet: 1 per GPU until the search probes
    assert before["trials per GPU"] == 1 and "measured on a GPU when the search starts" in before["GPU"]
    gpu_probe.save(tmp_path, measured_probe(c))
    plan = dry_run(c, tmp_path).to_dict()["resources"]
    assert plan["trials per GPU"] == 2 and plan["GPU"].startswith("0.5 (auto: 2 trials per GPU: 55.0 steps/s")
    assert plan["trains on"].startswith("cuda in its own process: 0.5 of a GPU, shared with 1 other trial(s)")
    assert plan["trials at once"] == {"search": "2 (trials in the phase)", "final": "1 (trials in the phase)"}


@pytest.mark.slow  # trains: two copies of a tiny BERT's step, each a process (~1 min on 2 cores)
def test_the_probes_copies_train_together_and_report_each_count(monkeypatch):
    """The probe's machinery (its copies, their windows, what they report) on the CPU: on a GPU the same code adds
    the memory; here no memory is measured, so every count up to the largest is tried."""
    from raysent.tune import gpu_probe

    monkeypatch.setattr(gpu_probe, "WINDOW_SECONDS", 2.0)
    c = parse_config({**BASE, "train": {"batch_size": 8, "max_length": 16}, "data": {"max_train_samples": 64}},
                     source="<test>")
    measured = gpu_probe.measure_on("cpu", gpu_probe.probe_config(c).to_dict(), most=2, threads=1)
    assert measured.note is None and [p.k for p in measured.points] == [1, 2], measured
    for p in measured.points:
        assert p.ok and p.steps_per_second > 0 and p.peak_bytes is None and p.device_used_bytes is None
    assert measured.device == "cpu" and measured.seconds > 2 * 2.0
    # a copy that cannot start (a model that does not exist) fails its count, and says why
    broken = with_overrides(c, {"model.name": "no-such-model"})
    failed = gpu_probe.measure_on("cpu", broken.to_dict(), most=2, threads=1)
    assert [p.k for p in failed.points] == [1] and not failed.points[0].ok
    assert failed.note.startswith("stopped at 1 at once: a copy did not start: ") and "no-such-model" in failed.note
