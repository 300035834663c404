"""The GPU probe behind ``resources.gpus_per_worker: auto``'s trials per GPU: the trial's own training step, measured
on one GPU at 1, 2, 4, ... copies at once, before a search's trials start.

What it measures
    The step of the search's first stage with the largest batch and length its space can pick (:func:`probe_config`:
    its model, method, precision and speed settings, on a few batches of its own training data), as the loop runs it
    (:class:`raysent.bench.cases.MethodRun`: the loop's :class:`~raysent.train.loop.Stepper` and loader). Each copy is
    a process of its own (``python -m raysent.tune.gpu_probe``), as each trial is: processes that share a GPU
    overlap one's host work (Python dispatching the step's operators) with another's kernels, threads of one process
    would not. A count's new copies each start (load, :data:`WARMUP_STEPS` untimed steps, a compile included), then
    all copies train together for :data:`WINDOW_SECONDS`; each reports its steps, the most memory its allocator held
    (``torch.cuda.max_memory_reserved``) and the device's memory in use (``torch.cuda.mem_get_info``) while all run.
    The copies of a count stay for the next (1, then one more for 2, then two more for 4). What to try next and what
    to choose are :mod:`raysent.train.packing`'s, a pure function of these numbers.
Where it runs
    On a GPU node, as a Ray task that asks for one GPU and the CPUs of the copies it may start (the driver may be a
    cluster's head without a GPU): once per search, after Ray started and before the first trial (:func:`packing_for`,
    called by :func:`raysent.tune.driver._start_ray`). A task that finds no CUDA device (a Ray told it has a GPU, as
    the tests' is) measures nothing, and auto stays 1 per GPU.
The cache
    ``results/<experiment>/gpu-probe.json`` holds the measurements and what was probed (:func:`probe_key`);
    ``--resume``, and a later search of the same experiment with the same trial settings, read it instead of
    probing again. Delete it to measure again (another GPU type, another cluster).

Imports Ray and torch only inside the functions that need them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from raysent.config import ExperimentConfig, with_overrides
from raysent.io import write_json_atomic
from raysent.train.packing import Packing, Probe, ProbePoint, choose, most_per_gpu, next_count

PROBE_FILE = "gpu-probe.json"
WARMUP_STEPS = 5  # untimed steps of each copy when it starts (a compile among them)
WINDOW_SECONDS = 5.0  # the timed window of each count, all its copies at once
PROBE_BATCHES = 8  # distinct batches of the trial's data each copy cycles through
START_TIMEOUT_S = 600.0  # for a count's new copies to load and warm up (a compile included)
TASK_TIMEOUT_S = 1200.0  # the whole probe, an autoscaler starting its GPU node included
MESSAGE = "GPUPROBE "  # the prefix of a copy's lines on its stdout

# the training settings a step's time and memory do not depend on (the rest of ``train`` is in the cache's key)
_NOT_MEASURED = {"lr", "epochs", "max_steps", "warmup_ratio", "weight_decay", "adam_betas", "adam_eps", "grad_clip",
                 "eval_every", "eval_at_start", "eval_at_start_cache", "patience", "seed", "log_every", "output_dir",
                 "gather_negatives"}

Say = Callable[[str], None]


# --------------------------------------------------------------------------- what is probed
def probe_config(cfg: ExperimentConfig) -> ExperimentConfig:
    """The trial the probe measures: ``cfg``'s first stage, at the largest batch and training length its search
    space can pick, on :data:`PROBE_BATCHES` batches of its training data, tracking off."""
    from raysent.methods.spec import get_spec
    from raysent.preflight import batch_sizes, stage_configs

    stage = stage_configs(cfg)[0]
    space = cfg.search.space.items() if cfg.search is not None else ()
    length = max([cfg.train.max_length] + [int(v) for key, entry in space
                                           if key.split(".")[-1] == "max_length" and not key.startswith("eval.")
                                           for v in (entry.values or [entry.high]) if v is not None])
    batch = max(batch_sizes(cfg))
    overrides: dict[str, Any] = {"train.batch_size": batch, "train.max_length": length, "tracking.enabled": False}
    if get_spec(stage.method).data_kind(stage.method_params) in ("sentences", "triplets"):  # no groups: a subset
        rows = batch * PROBE_BATCHES
        overrides["data.max_train_samples"] = min(rows, stage.data.max_train_samples or rows)
    return with_overrides(stage, overrides)


def probe_key(cfg: ExperimentConfig) -> dict[str, Any]:
    """What a probe's measurements depend on: the probed trial's method, parameters, model, training data and
    settings, and the CPUs of each trial."""
    c = probe_config(cfg).to_dict()
    return {"method": c["method"], "params": c["params"], "model": c["model"], "data": c["data"],
            "train": {k: v for k, v in c["train"].items() if k not in _NOT_MEASURED},
            "cpus_per_worker": cfg.resources.cpus_per_worker}


def probe_path(exp: Path) -> Path:
    return exp / PROBE_FILE


def load_cached(exp: Path, key: dict[str, Any], most: int) -> Probe | None:
    """The measurements in the experiment's folder when they are of ``key`` and tried up to ``most`` copies (or
    stopped before their own largest count for a reason that holds at more), else None."""
    try:
        probe = Probe.from_json(json.loads(probe_path(exp).read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError):
        return None
    if probe.key != json.loads(json.dumps(key)) or not any(p.ok for p in probe.points):
        return None
    if probe.most >= most:
        return probe
    # tried fewer than ``most`` allows now: still the answer when it stopped before its own largest count (memory,
    # or a count slower than the best): more copies would not fit or gain either
    stopped_early = (next_count(probe.points, probe.most, probe.total_bytes) is None
                     and max(p.k for p in probe.points) < probe.most)
    return probe if stopped_early else None


def save(exp: Path, probe: Probe) -> Path:
    path = probe_path(exp)
    write_json_atomic(path, probe.to_json())
    return path


# --------------------------------------------------------------------------- on the GPU node
def measure(config: dict[str, Any], most: int, threads: int, env: dict[str, str] | None = None) -> Probe:
    """The probe on this node's GPU (``CUDA_VISIBLE_DEVICES``, as Ray set it for the task): ``config`` (the probed
    trial, :func:`probe_config`) at 1, 2, 4, ... copies up to ``most``, each with ``threads`` torch threads. ``env``:
    the driver's data and model folders (a folder this node has of its own wins). Without a CUDA device it measures
    nothing and says so (:attr:`Probe.note`)."""
    for key, value in (env or {}).items():
        if key not in os.environ or os.path.exists(value):
            os.environ[key] = value
    import torch

    if not torch.cuda.is_available():
        seen = os.environ.get("CUDA_VISIBLE_DEVICES")
        return Probe(device="none", total_bytes=0, points=(), most=most,
                     note=f"no CUDA device on the probe's node (CUDA_VISIBLE_DEVICES={seen!r})")
    return measure_on("cuda", config, most, threads)


class _Copy:
    """One copy of the probed trial: ``python -m raysent.tune.gpu_probe`` reading commands on its stdin and answering
    on its stdout (:func:`copy_main`), its stderr kept in a file for the error of a copy that dies."""

    def __init__(self, config: dict[str, Any], threads: int, device: str, scratch: Path, index: int):
        self.log = scratch / f"copy-{index}.log"
        path = os.pathsep.join(p for p in sys.path if p)  # the parent's imports (a Ray worker's runtime env)
        env = {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}
        spec = json.dumps({"config": config, "threads": threads, "device": device})
        with open(self.log, "w") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "raysent.tune.gpu_probe", spec], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=err, text=True, env=env)
        self.messages: queue.Queue[dict[str, Any]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(MESSAGE):
                self.messages.put(json.loads(line[len(MESSAGE):]))
        self.messages.put({"kind": "error", "error": f"the copy ended (exit code {self.proc.wait()}): {self._tail()}"})

    def _tail(self) -> str:
        try:
            lines = [ln for ln in self.log.read_text(errors="replace").splitlines() if ln.strip()]
        except OSError:
            return ""
        return " | ".join(lines[-3:])[-600:]

    def send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message) + "\n")
        self.proc.stdin.flush()

    def receive(self, timeout: float) -> dict[str, Any]:
        try:
            return self.messages.get(timeout=timeout)
        except queue.Empty:
            return {"kind": "error", "error": f"no answer in {timeout:.0f} s"}

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.send({"kind": "exit"})
                self.proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


def _round(copies: list[_Copy], k: int) -> tuple[ProbePoint, dict[str, Any]]:
    """One count: all ``k`` copies (ready) trained together for :data:`WINDOW_SECONDS`; its point, and what the first
    copy said of the device."""
    start_at = time.monotonic() + 0.5  # every copy has its command by then (CLOCK_MONOTONIC: one clock per machine)
    for c in copies:
        c.send({"kind": "window", "start": start_at, "seconds": WINDOW_SECONDS})
    done = [c.receive(timeout=WINDOW_SECONDS + START_TIMEOUT_S) for c in copies]
    errors = [d["error"] for d in done if d["kind"] == "error"]
    if errors:
        return ProbePoint(k, None, error=errors[0][:500]), {}
    rate = sum(d["steps"] / d["seconds"] for d in done)
    peak = max((d["peak_reserved"] for d in done if d.get("peak_reserved") is not None), default=None)
    used = max((d["total"] - d["free"] for d in done if d.get("free") is not None), default=None)
    allocated = max((d["peak_allocated"] for d in done if d.get("peak_allocated") is not None), default=None)
    return ProbePoint(k, rate, peak, used, peak_allocated_bytes=allocated), done[0]


def measure_on(device: str, config: dict[str, Any], most: int, threads: int) -> Probe:
    """:func:`measure` on ``device`` ("cuda" in a search; a test runs the same machinery on "cpu", where no memory
    is measured and every count up to ``most`` is tried)."""
    started = time.monotonic()
    points: list[ProbePoint] = []
    copies: list[_Copy] = []
    total, name = 0, device
    with tempfile.TemporaryDirectory(prefix="raysent-gpu-probe-") as scratch:
        try:
            k = next_count(points, most, total)
            while k is not None:
                new = [_Copy(config, threads, device, Path(scratch), len(copies) + i) for i in range(k - len(copies))]
                copies += new
                ready = [c.receive(timeout=START_TIMEOUT_S) for c in new]
                failed = [r["error"] for r in ready if r["kind"] == "error"]
                if failed:
                    points.append(ProbePoint(k, None, error=f"a copy did not start: {failed[0]}"[:500]))
                    break
                point, seen = _round(copies, k)
                points.append(point)
                if seen:
                    total, name = int(seen.get("total") or 0), str(seen.get("name") or device)
                k = next_count(points, most, total)
        finally:
            for c in copies:
                c.stop()
    last = points[-1] if points else None
    note = f"stopped at {last.k} at once: {last.error}" if last is not None and not last.ok else None
    return Probe(device=name, total_bytes=total, points=tuple(points), most=most, seconds=time.monotonic() - started,
                 note=note)


def copy_main(spec: dict[str, Any]) -> None:
    """A copy of the probed trial (:class:`_Copy`): build it as the loop does and take :data:`WARMUP_STEPS` steps,
    say it is ready, then for each window command train until the window ends and report."""
    import torch

    from raysent.bench.cases import MethodRun
    from raysent.train.loop import device_batches

    def say(**message: Any) -> None:
        print(MESSAGE + json.dumps(message), flush=True)

    try:
        with tempfile.TemporaryDirectory(prefix="raysent-gpu-probe-copy-") as scratch:
            run = MethodRun({"config": spec["config"], "threads": spec["threads"]}, PROBE_BATCHES, scratch)
            device = run.hooks.device
            if device.type != spec["device"]:
                raise RuntimeError(f"the copy trains on {device}, not on {spec['device']}")
            cuda = device.type == "cuda"

            def batches() -> Iterator[dict]:
                while True:  # the loop's loader, over the same batches again (the schedule's steps do not matter)
                    yield from device_batches(run.data, run.batches, device)

            feed, i = batches(), 0
            for _ in range(WARMUP_STEPS):
                run.stepper.step(next(feed), i)
                i += 1
            if cuda:
                torch.cuda.synchronize()
            say(kind="ready", settings=run.settings.record(), precision=run.stepper.precision)
            for line in sys.stdin:
                command = json.loads(line)
                if command["kind"] == "exit":
                    return
                end = command["start"] + command["seconds"]
                time.sleep(max(0.0, command["start"] - time.monotonic()))
                start, steps = time.monotonic(), 0
                while time.monotonic() < end:
                    run.stepper.step(next(feed), i)  # queued on the device: waited for once, after the window
                    i += 1
                    steps += 1
                if cuda:
                    torch.cuda.synchronize()
                seconds = time.monotonic() - start
                memory: dict[str, Any] = {}
                if cuda:
                    free, total = torch.cuda.mem_get_info(device)
                    memory = {"free": free, "total": total, "peak_reserved": torch.cuda.max_memory_reserved(device),
                              "peak_allocated": torch.cuda.max_memory_allocated(device),
                              "name": torch.cuda.get_device_name(device)}
                say(kind="done", steps=steps, seconds=seconds, **memory)
    except Exception as exc:  # out of memory among them: the count failed
        say(kind="error", error=f"{type(exc).__name__}: {exc}"[:500])


# --------------------------------------------------------------------------- on the driver
def gpu_node_cpus_per_gpu() -> float | None:
    """The fewest CPUs per GPU of the Ray cluster's live nodes that have GPUs (None: none is alive yet)."""
    import ray

    ratios = [float(n["Resources"].get("CPU", 0)) / float(n["Resources"]["GPU"]) for n in ray.nodes()
              if n.get("Alive") and float((n.get("Resources") or {}).get("GPU", 0)) > 0]
    return min(ratios) if ratios else None


def run_on_ray(cfg: ExperimentConfig, most: int, env: dict[str, str]) -> Probe:
    """:func:`measure` as a Ray task that asks for one GPU and the CPUs of ``most`` trials (the copies it may start),
    within :data:`TASK_TIMEOUT_S` (then cancelled)."""
    import ray

    cpus = cfg.resources.cpus_per_worker
    task = ray.remote(measure).options(num_gpus=1, num_cpus=most * cpus, max_retries=0, name="raysent-gpu-probe")
    ref = task.remote(probe_config(cfg).to_dict(), most, max(1, int(cpus)), env)
    try:
        return ray.get(ref, timeout=TASK_TIMEOUT_S)
    except ray.exceptions.GetTimeoutError:
        ray.cancel(ref, force=True)
        raise


def packing_for(cfg: ExperimentConfig, exp: Path, cluster: dict[str, float], trials: int | None,
                say: Say, env: dict[str, str] | None = None) -> Packing | None:
    """What ``gpus_per_worker: auto`` packs on each GPU of ``cluster`` for a phase of ``trials`` trials: None when it
    does not pack (a number in the config, Ray Train trials, no GPU); else the probe's choice, from the
    experiment's cache or measured now (logged either way; a failed probe leaves 1 per GPU, said so)."""
    from raysent.train.resources import packable

    gpus = cluster.get("GPU", 0.0)
    if not packable(cfg) or gpus <= 0:
        return None
    asked = cfg.search.max_concurrent_trials if cfg.search is not None else 1
    per_gpu = gpu_node_cpus_per_gpu()
    most = most_per_gpu(gpus, cluster.get("CPU", 0.0), cfg.resources.cpus_per_worker, trials,
                        None if asked == "auto" else int(asked), per_gpu)
    if most <= 1:
        cpus = per_gpu if per_gpu is not None else cluster.get("CPU", 0.0) / gpus
        return Packing(1, f"1 trial per GPU: no more is worth measuring ({trials} trial(s) on {gpus:g} GPU(s), "
                          f"{cpus:g} CPUs per GPU at resources.cpus_per_worker {cfg.resources.cpus_per_worker:g})")
    key = probe_key(cfg)
    probe = load_cached(exp, key, most)
    if probe is not None:
        say(f"GPU probe: the measurements of {probe.device} in {probe_path(exp)} (delete the file to measure again)")
    else:
        say(f"GPU probe: measuring this search's training step on one GPU at 1 to {most} trials at once "
            f"(about {WINDOW_SECONDS:g} s a count, after each copy starts)")
        try:
            probe = run_on_ray(cfg, most, env or {})
        except Exception as exc:
            last = str(exc).strip().splitlines()[-1][:300] if str(exc).strip() else ""
            packing = Packing(1, f"1 trial per GPU: the GPU probe failed ({type(exc).__name__}: {last})")
            say(packing.reason)
            return packing
        probe = dataclasses.replace(probe, key=key)
        if any(p.ok for p in probe.points):
            say(f"GPU probe: {probe.seconds:.0f} s; measurements in {save(exp, probe)}")
    packing = choose(probe, most)
    say(f"GPU probe: {packing.reason}")
    return packing


if __name__ == "__main__":
    copy_main(json.loads(sys.argv[1]))
