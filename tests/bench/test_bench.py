"""`raysent bench` runs every part and writes what it measured (tiny budgets; timings are never asserted,
only that the measurements exist, are consistent and compare equal things)."""

from __future__ import annotations

import json

import pytest

from raysent.bench import BenchOptions, BenchResult, format_markdown
from raysent.errors import RaysentError

from conftest import RAW_BERT, cli_in_process, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.shared]


def test_bench_training_speedups_and_evaluation_write_json_and_markdown(tmp_path):
    # a real encoder: the evaluation part compares raysent's STS-B score with sentence-transformers', which
    # truncate the tiny BERT's character tokens differently
    out = tmp_path / "bench"
    proc = cli_in_process("bench", "--model", RAW_BERT, "--parts", "training,speedups,evaluation,gpu",
                          "--methods", "simcse-unsup,sg-opt", "--speedups", "cache_views,grad_cache",
                          "--batch-size", "16", "--max-length", "24", "--grad-cache-batch", "32",
                          "--steps", "2", "--warmup", "1", "--eval-sets", "stsb", "--eval-repeats", "1",
                          "--output-dir", str(out))
    files = sorted(out.iterdir())
    assert [f.suffix for f in files] == [".json", ".md"]
    r = json.loads(files[0].read_text())
    tr = r["training"]
    assert set(tr["methods"]) == {"simcse-unsup", "sg-opt"}
    for name, case in tr["methods"].items():
        assert case["steps"] == 2 and case["steps_per_second"] > 0 and case["peak_rss_mib"] > 100, name
        assert case["steps_per_second"] == pytest.approx(2 / case["seconds"])
        assert tr["steps_per_second_vs_st_mnrl"][name] == pytest.approx(
            case["steps_per_second"] / tr["st_mnrl"]["steps_per_second"])
    assert tr["methods"]["simcse-unsup"]["fields_per_example"] == 1  # two views of one sentence
    assert tr["methods"]["sg-opt"]["prepare"]["view_cache_mib"] > 0  # the views were cached
    assert tr["st_mnrl"]["steps"] == 2
    sp = r["speedups"]
    assert set(sp) == {"cache_views", "grad_cache"}
    assert sp["cache_views"]["off"]["prepare"] == {}  # off really computed the views at every step
    assert sp["grad_cache"]["on_settings"] == {"grad_cache_rows": 4}  # an eighth of the batch of 32
    # the evaluation compared equal scores on the same set
    ev = r["evaluation"]
    assert list(ev["scores"]) == ["stsb"] and ev["equal_scores"], ev["scores"]
    assert ev["sentences_embedded"]["sentence_transformers"] == 2 * 1379
    assert r["gpu"] == {"skipped": "no CUDA device"} or "cases" in r["gpu"]
    assert set(r["targets"]) == {"simcse_unsup_vs_st_mnrl", "evaluation_speedup", "tune_train_overhead",
                                 "sg_opt_cached_views"}
    assert r["targets"]["tune_train_overhead"]["met"] is None  # that part did not run
    md = files[1].read_text()
    assert md == format_markdown(BenchResult.model_validate(r)) and md in proc.stdout
    for heading in ("## Targets", "## Training throughput", "## Speedups", "## STS evaluation (1 test sets)"):
        assert heading in md


def test_the_search_part_runs_one_search_in_raysent_and_in_sentence_transformers(tiny_bert, tmp_path):
    """Issue 61: the same 2-learning-rate search, raysent's search phase (Ray started in its own process) and
    sentence-transformers' hyperparameter_search (Optuna's grid), each trial trained and scored on STS-B dev; without
    CUDA the defaults are one-per-gpu's settings, so that way is recorded as the same and not run again."""
    out = tmp_path / "bench"
    proc = run_cli("bench", "--model", tiny_bert, "--parts", "search", "--batch-size", "8", "--max-length", "16",
                   "--search-trials", "2", "--search-steps", "2", "--output-dir", str(out), timeout=600)
    [js] = out.glob("*.json")
    s = json.loads(js.read_text())["search"]
    assert (s["trials"], s["steps"], s["lrs"]) == (2, 2, [1e-5, 2e-5])
    one, st = s["ways"]["one-per-gpu"], s["ways"]["st-hpsearch"]
    for way in (one, st):
        assert way["trials_finished"] == 2 and way["best_lr"] in s["lrs"] and -100 <= way["best_dev_spearman"] <= 100
        assert way["configurations_per_hour"] == pytest.approx(2 * 3600 / way["wall_seconds"])
        assert way["device"] == "cpu" and way["attention"] in ("sdpa", "eager") and way["compile"] is False
    assert one["attention"] == st["attention"]  # both sides ran the same attention kernels
    assert one["trials_at_once"] >= 1 and one["process_seconds"] > one["wall_seconds"]
    assert s["ways"]["defaults"]["same_as"] == "one-per-gpu" and "wall_seconds" not in s["ways"]["defaults"]
    assert s["ratios"] == {"defaults_vs_one_per_gpu": 1.0,
                           "st_vs_raysent_wall": pytest.approx(st["wall_seconds"] / one["wall_seconds"])}
    md = js.with_suffix(".md").read_text()
    assert "## A short search, three ways" in md and "| raysent on its defaults (compile auto, trials packed by " \
        "auto) | as one-per-gpu |" in md and md in proc.stdout


def test_bench_overhead_runs_the_same_training_four_ways(ray_cluster, tiny_bert, monkeypatch):
    import datetime
    import os
    from pathlib import Path

    from raysent.bench import method_config
    from raysent.bench.overhead import bench_overhead
    from raysent.bench.result import Machine

    # as the README runs it (RAYSENT_MODEL_DIR=../shared/models, a model by its folder's name): Tune trials and
    # Train workers run in other folders, so the path must reach them made absolute. What is timed, not what
    # is learned: the tiny random BERT
    monkeypatch.setenv("RAYSENT_MODEL_DIR", os.path.relpath(Path(tiny_bert).parent))

    opts = BenchOptions(model=Path(tiny_bert).name, batch_size=16, max_length=24)
    raw = method_config(opts, "simcse-unsup")
    raw["data"].update({"max_train_samples": 16 * 4, "dev": "sickr:dev"})
    raw["train"].update({"eval_at_start": False, "eval_every": 2})
    r = bench_overhead(raw, steps=3, cpus=1.0, trials=2)
    for way in ("bare", "ray_train", "tune_trial", "tune_trial_next", "tune_in_trial", "tune_in_trial_next"):
        assert getattr(r, f"{way}_seconds") > 0
    # each trial timed, the first apart from the later ones
    assert len(r.tune_trial_each) == 2 and r.tune_trial_seconds == r.tune_trial_each[0]
    assert r.tune_trial_next_seconds == r.tune_trial_each[1]
    assert len(r.tune_in_trial_each) == 2 and r.tune_in_trial_seconds == r.tune_in_trial_each[0]
    assert r.tune_in_trial_next_seconds == r.tune_in_trial_each[1]
    assert r.ray_train_ratio == pytest.approx(r.ray_train_seconds / r.bare_seconds)
    assert r.tune_trial_next_overhead == pytest.approx(r.tune_trial_next_ratio - 1)
    assert r.torch_threads.ray_train == 1  # one CPU for the worker: one torch thread
    # where the Ray Train run's time went, from its own summary: the parts fit inside its wall time
    ph = r.ray_train_phases
    assert ph["until_worker_runs"] > 0 and ph["eval_seconds"] > 0 and ph["checkpoint_seconds"] > 0
    assert ph["until_worker_runs"] + ph["build_method"] + ph["prepare_data"] + ph["eval_seconds"] < r.ray_train_seconds
    assert r.bare_phases["eval_seconds"] < r.bare_seconds
    md = format_markdown(BenchResult(
        options=BenchOptions(), started=datetime.datetime(2026, 11, 26, 9, 30), overhead=r,
        machine=Machine(platform="p", python="3", cpus=2, torch="t", transformers="t", torch_threads=1, cuda=None,
                        ray="r", sentence_transformers="s")))
    assert "Tune trial training in its own process: each later one" in md and "until worker runs" in md
    # the CPU Ray's processes took while each way ran: the busiest one trained
    assert r.ray_train_cpu.trainer == "ray::RayTrainWorker" and r.ray_train_cpu.others_percent > 0
    assert r.tune_in_trial_cpu.trainer.startswith("ray::ImplicitFunc")
    assert "CPU while the Ray Train run ran" in md


def test_a_part_that_fails_keeps_what_it_and_the_other_parts_measured(ray_cluster, tiny_bert, monkeypatch, tmp_path):
    """The overhead part fails at its Ray Train way: its bare measurement, and the part after it, are still
    written, the failure is named, and the command exits 1. (The first way that fails: each way after it costs a
    Ray Train run or a Tune trial, ~10-25 CPU-s, that test_bench_overhead_runs_the_same_training_four_ways runs.)"""
    from raysent.cli import main
    from raysent.train import ray_train

    def no_ray_train(*args, **kwargs):
        raise RuntimeError("Ray Train is broken here")

    monkeypatch.setattr(ray_train, "train_with_ray", no_ray_train)
    out = tmp_path / "bench"
    assert main(["bench", "--model", tiny_bert, "--parts", "overhead,gpu", "--batch-size", "16", "--max-length",
                 "24", "--overhead-steps", "2", "--output-dir", str(out)]) == 1
    [js] = out.glob("*.json")
    r = json.loads(js.read_text())
    assert r["failed"] == {"overhead": "RuntimeError: Ray Train is broken here"}
    ov = r["overhead"]
    assert ov["bare_seconds"] > 0 and ov["bare_train_seconds"] > 0 and ov["steps"] == 2
    assert "ray_train_seconds" not in ov and "tune_trial_seconds" not in ov
    assert r["targets"]["tune_train_overhead"]["value"] is None
    assert r["gpu"] == {"skipped": "no CUDA device"} or "cases" in r["gpu"]  # the next part ran
    md = js.with_suffix(".md").read_text()
    assert "`overhead` failed (what it measured before is below" in md and "Ray Train is broken here" in md
    assert "| bare loop" in md and "| Ray Train, 1 worker |" not in md


def test_a_case_that_fails_for_real_loses_only_itself(tiny_bert, tmp_path):
    """As on the first GPU run: sentence-transformers' case lacks a package (`datasets` cannot be imported in it).
    The part keeps the method it measured, names the failed case and its error, and the command exits 1."""
    import os

    shim = tmp_path / "shim" / "datasets"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'datasets'\", name='datasets')\n")
    out = tmp_path / "bench"
    proc = run_cli("bench", "--model", tiny_bert, "--parts", "training", "--methods", "simcse-unsup",
                   "--batch-size", "16", "--max-length", "24", "--steps", "2", "--warmup", "1", "--output-dir", str(out),
                   check=False, env={"PYTHONPATH": os.pathsep.join(filter(None, [str(shim.parent),
                                                                                 os.environ.get("PYTHONPATH")]))})
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "failed: training (st-mnrl) (the others were measured and written)" in proc.stderr
    [js] = out.glob("*.json")
    r = json.loads(js.read_text())
    assert list(r["training"]["methods"]) == ["simcse-unsup"] and r["training"]["methods"]["simcse-unsup"]["steps"] == 2
    assert r["training"]["st_mnrl"] is None and r["training"]["steps_per_second_vs_st_mnrl"] == {}
    assert "failed" not in r and list(r["failed_cases"]) == ["training"]
    error = r["failed_cases"]["training"]["st-mnrl"]
    assert error.startswith("RaysentError: bench case sentence-transformers MNRL failed (exit 1)")
    assert error.rstrip().endswith("ModuleNotFoundError: No module named 'datasets'")
    md = js.with_suffix(".md").read_text()
    assert "* `training`, case `st-mnrl` failed (the part's other cases are below" in md
    assert "| simcse-unsup |" in md


def test_a_run_stopped_by_sigterm_keeps_every_case_measured_before(tiny_bert, tmp_path):
    """`timeout` sends SIGTERM to the bench's process group in the middle of a part: the record on disk already
    holds each case measured before (written after every case), and the bench adds that it was stopped, where."""
    import os
    import signal
    import subprocess
    import sys

    from conftest import REPO

    out = tmp_path / "bench"
    proc = subprocess.Popen([sys.executable, "-m", "raysent.cli", "bench", "--model", tiny_bert, "--parts",
                             "training", "--methods", "simcse-unsup,simcse-sup,sg-opt", "--batch-size", "16",
                             "--max-length", "24", "--steps", "2", "--warmup", "1", "--output-dir", str(out)],
                            cwd=REPO, env=os.environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # its own process group, as under `timeout`
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            if line.startswith("training: simcse-sup"):
                break
        [js] = out.glob("*.json")
        before = json.loads(js.read_text())  # written after the first case, before the second ended
        assert list(before["training"]["methods"]) == ["simcse-unsup"] and "interrupted" not in before
        os.killpg(proc.pid, signal.SIGTERM)  # the bench and its running case, as timeout does
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 143, err[-3000:]
    r = json.loads(js.read_text())
    assert list(r["training"]["methods"]) == ["simcse-unsup"]
    assert r["training"]["methods"]["simcse-unsup"] == before["training"]["methods"]["simcse-unsup"]
    assert (r["interrupted"], r["interrupted_by"], r["interrupted_case"]) == ("training", "SIGTERM", "simcse-sup")
    assert "failed_cases" not in r  # stopped, not failed
    md = js.with_suffix(".md").read_text()
    assert "* interrupted (SIGTERM, as a timeout sends) during `training`, case `simcse-sup`" in md


def test_ctrl_c_writes_what_was_measured_before(tmp_path):
    import os
    import signal
    import subprocess
    import sys

    from conftest import REPO

    out = tmp_path / "bench"
    proc = subprocess.Popen([sys.executable, "-m", "raysent.cli", "bench", "--model", RAW_BERT, "--parts",
                             "evaluation,overhead", "--eval-sets", "stsb", "--eval-repeats", "1", "--output-dir",
                             str(out)], cwd=REPO, env=os.environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    for line in proc.stderr:  # the part after evaluation has started
        if line.startswith("overhead:"):
            break
    proc.send_signal(signal.SIGINT)
    stdout, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    [js] = out.glob("*.json")
    r = json.loads(js.read_text())
    assert r["interrupted"] == "overhead" and "overhead" not in r and r["evaluation"]["equal_scores"]
    assert "interrupted (Ctrl-C) during `overhead`" in js.with_suffix(".md").read_text() and "written:" in stdout


def test_ray_cpu_counts_a_process_started_within_the_window_as_it_counts_itself():
    """A process started inside the window (as Train's actors are) is counted from its start: its CPU time
    agrees with what the process measured of itself."""
    import subprocess
    import sys

    from raysent.bench.overhead import RayCpu

    # the busy process idles after its work, so the sampler reads it once more before it ends: a process
    # that ends is counted up to its last reading, which this test is not about
    code = ("import time\nt = time.time()\nwhile time.time() - t < 1.2: pass\n"
            "print(time.process_time(), flush=True)\ntime.sleep(0.6)")
    with RayCpu(interval=0.1) as cpu:
        idle = subprocess.Popen(["ray::Idle", "-c", "import time; time.sleep(2)"], executable=sys.executable)
        busy = subprocess.Popen(["ray::Busy", "-c", code], executable=sys.executable, stdout=subprocess.PIPE,
                                text=True)
        own, _ = busy.communicate()
        idle.wait()
    # read by pid: other processes of this machine with "ray" in their command line may be busier
    assert busy.pid not in cpu.start and idle.pid not in cpu.start  # both started within the window
    name, counted = cpu.last[busy.pid]
    assert name == "ray::Busy" and counted == pytest.approx(float(own), abs=0.06)
    assert cpu.last[idle.pid][1] < 0.05 * cpu.wall  # a sleeping process costs next to nothing
    s = cpu.summary()
    assert "ray::Busy" in (s["trainer"], *s["others"])


def test_ray_cpu_of_one_session_counts_its_processes_and_not_another_rays():
    """With a session, only that Ray's processes are counted (those naming the session and what they start),
    so a busier Ray beside it (another search on the machine) is neither counted nor taken for the trainer."""
    import subprocess
    import sys

    from raysent.bench.overhead import RayCpu

    busy = "import time\nt = time.time()\nwhile time.time() - t < 1.0: pass\ntime.sleep(0.5)"
    child = f"import subprocess, sys; subprocess.run(['ray::Mine', '-c', {busy!r}], executable=sys.executable)"
    with RayCpu(interval=0.1, session="session_raysent_test_1") as cpu:
        # the session's root (a raylet names its session on its command line) and a worker it starts
        root = subprocess.Popen([sys.executable, "-c", child, "--session-name=session_raysent_test_1"])
        other = subprocess.Popen(["ray::Other", "-c", busy + "\ntime.sleep(0.5)"], executable=sys.executable)
        root.wait()
        other.wait()
    names = {name for name, _ in cpu.last.values()}
    assert "ray::Mine" in names and "ray::Other" not in names
    assert root.pid in cpu.last and other.pid not in cpu.last
    assert cpu.summary()["trainer"] == "ray::Mine"


def test_bench_options_are_checked():
    with pytest.raises(RaysentError, match="--parts: unknown part"):
        BenchOptions(parts=["training", "speed"]).check()
    with pytest.raises(RaysentError, match="non-training method"):
        BenchOptions(methods=["baseline"]).check()
    with pytest.raises(RaysentError, match="--speedups: unknown"):
        BenchOptions(speedups=["bucketing"]).check()
    with pytest.raises(RaysentError, match="--eval-sets"):
        BenchOptions(eval_sets=["sts17"]).check()
    proc = run_cli("bench", "--parts", "nope", check=False)
    assert proc.returncode == 2 and "allowed: training, speedups, evaluation, overhead, gpu, profile, search" in proc.stderr
    proc = run_cli("bench", "--gpu-cases", "defaults,bf16", check=False)
    assert proc.returncode == 2 and "--gpu-cases: unknown case(s) bf16; allowed" in proc.stderr


def test_bench_without_sentence_transformers_says_what_to_install(monkeypatch, capsys, tmp_path):
    import importlib.util

    from raysent.cli import main

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "sentence_transformers" else find_spec(name, *a))
    assert main(["bench", "--parts", "evaluation", "--output-dir", str(tmp_path / "bench")]) == 2
    assert "sentence-transformers, which is not installed: pip install -e '.[bench]'" in capsys.readouterr().err
    assert not (tmp_path / "bench").exists()  # stopped before measuring anything


@pytest.mark.parametrize("name,peak", [("NVIDIA H100 80GB HBM3", 989.0), ("NVIDIA H100 PCIe", 756.0),
                                       ("NVIDIA H100 NVL", 835.0), ("NVIDIA H200", 989.0),
                                       ("NVIDIA A100-SXM4-80GB", 312.0), ("NVIDIA L40S", 362.0), ("NVIDIA L40", 181.0),
                                       ("NVIDIA L4", 121.0), ("NVIDIA A10G", 70.0), ("NVIDIA A10", 125.0),
                                       ("NVIDIA GeForce RTX 4090", 165.0), ("Tesla T4", None)])
def test_the_device_peak_is_looked_up_by_the_whole_model_name(name, peak):
    """torch.cuda.get_device_name spellings: a family's name inside a variant's (L4 in L40) does not count."""
    from raysent.bench import peak_bf16_tflops

    assert peak_bf16_tflops(name) == peak



def test_a_recorded_error_names_no_machine_path():
    """A case's error goes into a committed record (results/bench/): an absolute path keeps only its last part."""
    from raysent.bench.runner import _error

    exc = PermissionError(13, "Permission denied", "/tmp/site/ray/core/src/ray/gcs/gcs_server")
    assert _error(exc) == "PermissionError: [Errno 13] Permission denied: '.../gcs_server'"
    err = _error(OSError("no /work/x.json; see https://x.org/a/b or ../rel/c/d"))
    assert err == "OSError: no .../x.json; see https://x.org/a/b or ../rel/c/d"
