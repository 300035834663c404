"""``raysent bench`` part 3: what Ray Train and Ray Tune cost around the same training run.

The same run (config, seed, steps, dev evaluations, checkpoints, result.json) four ways:

* ``bare``: :func:`raysent.train.run.train_in_process` in this (already warm) process;
* ``ray_train``: :func:`raysent.train.ray_train.train_with_ray` with one Ray Train worker (the
  controller and worker processes are started, import torch and load the model: all counted);
* ``tune_trial``: Ray Tune trials whose function trainable launches that TorchTrainer, exactly as a
  `raysent tune` trial with ``resources.workers: 1`` does (:func:`raysent.tune.trial.train_trial`);
* ``tune_in_trial``: Ray Tune trials that train in the trial's own process, as a `raysent tune` trial
  with ``resources.workers: null`` does.

The two Tune ways run ``trials`` trials one after another in one Tuner, as a search does, with the
search's Tune settings: trials that train in their own process run in the process of the trial before
(Tune's ``reuse_actors``, :func:`raysent.tune.driver.reuse_trial_processes`), trials that run Ray Train
each start a new one; the later trials are what each of a search's hundreds of trials costs. Starting Ray
itself (``ray.init``) happens once per search and is reported apart. The overhead of a way is its wall
time over the bare run's, minus one. Where the time goes on the Ray Train worker (start, model, data,
steps, evaluations, checkpoints) comes from the run's own summary; what the other Ray processes took
while the Ray Train run and the in-process trials ran, from /proc (:class:`RayCpu`).
"""

from __future__ import annotations

import math
import os
import re
import shutil
import tempfile
import threading
import time
from pathlib import Path

from raysent.bench.result import OverheadResult
from raysent.config import parse_config, with_overrides

# Lazy imports: ray, torch, raysent's heavier modules (heavy, and only the functions that need them import them).

# a Ray process's command line: an actor or task (ray::…), a program of Ray's package (…/ray/…), Ray's own scripts;
# not another program whose name merely contains "ray" (a `raysent` command of its own)
RAY_COMMAND = re.compile(r"ray::|/ray/|\bray\b")


def _session_processes(seen: dict[int, tuple[str, int, float]], session: str, me: int) -> set[int]:
    """The pids of one Ray session among ``seen`` (pid: (command line, parent, CPU)): the processes whose
    command line names the session, everything below them, and ``me``."""
    children: dict[int, list[int]] = {}
    for pid, (_, parent, _) in seen.items():
        children.setdefault(parent, []).append(pid)
    todo = [pid for pid, (cmd, _, _) in seen.items() if session in cmd]
    keep = {me} & set(seen)
    while todo:
        pid = todo.pop()
        if pid not in keep:
            keep.add(pid)
            todo.extend(children.get(pid, []))
    return keep


class RayCpu:
    """CPU time of this machine's Ray processes (and of this one) while a way runs, from /proc (Linux).

    Read every ``interval`` seconds, so actors that start and end within the way (Train's controller and
    workers) are counted, from their start; one that ends is counted up to its last reading, so at most
    one interval (and one /proc scan) short. The busiest process is the one that trained; the rest is what
    the orchestration itself took. On a machine whose cores all train, the loop loses about twice that:
    each wake-up of another process stalls one torch thread, and the other waits for it at the next
    barrier. ``summary()``: percent of one core over the way's wall time, the trainer apart, the other
    processes grouped by name (None where /proc cannot be read).

    ``session`` (a Ray session's name, e.g. ``session_2026-11-27_…``): only that Ray's processes, those whose
    command line names it (GCS, raylet, dashboard, log monitor) and everything they started (the workers),
    and this process: another Ray on the machine (another search, another user) is not counted, nor taken
    for the trainer. None: every Ray process on the machine."""

    def __init__(self, interval: float = 0.5, session: str | None = None):
        self.interval = interval
        self.session = session
        self.start: dict[int, float] = {}
        self.last: dict[int, tuple[str, float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.wall = 0.0

    def _read(self) -> dict[int, tuple[str, float]]:
        me, tick = os.getpid(), os.sysconf("SC_CLK_TCK")
        seen: dict[int, tuple[str, int, float]] = {}  # pid: (command line, parent, CPU seconds)
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
                pid = int(entry.name)
                # an empty command line: a kernel thread, or a process that has ended (a zombie), which keeps
                # its last reading under its name
                if pid != me and (not cmd or self.session is None and not RAY_COMMAND.search(cmd)):
                    continue
                with open(f"/proc/{entry.name}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:  # ended meanwhile
                continue
            seen[pid] = (cmd, int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
        keep = set(seen) if self.session is None else _session_processes(seen, self.session, me)
        out = {}
        for pid in keep:
            cmd, _, cpu = seen[pid]
            name = cmd.split()[0] if cmd.startswith("ray::") else Path(cmd.split()[0]).name if cmd else "?"
            if name.startswith("python") and len(cmd.split()) > 1:  # python …/ray/…/x.py: the script's name
                name = Path(next((a for a in cmd.split()[1:] if not a.startswith("-")), name)).name
            out[pid] = (name, cpu)
        return out

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.last.update(self._read())

    def __enter__(self) -> RayCpu:
        self.t0 = time.perf_counter()
        if os.path.isdir("/proc"):
            self.start = {pid: cpu for pid, (_, cpu) in self._read().items()}
            self.last = {}
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.wall = time.perf_counter() - self.t0
        if self._thread.is_alive():
            self._stop.set()
            self._thread.join()
            self.last.update(self._read())

    def summary(self) -> dict | None:
        if not self.last or self.wall <= 0:
            return None
        used = {pid: (name, cpu - self.start.get(pid, 0.0)) for pid, (name, cpu) in self.last.items()}
        trainer = max(used, key=lambda pid: used[pid][1])
        others: dict[str, float] = {}
        for pid, (name, cpu) in used.items():
            if pid != trainer:
                others[name] = others.get(name, 0.0) + cpu
        pct = lambda cpu: round(100.0 * cpu / self.wall, 2)  # noqa: E731
        return {"trainer": used[trainer][0], "trainer_percent": pct(used[trainer][1]),
                "others_percent": pct(sum(others.values())), "processes": len(used) - 1,
                "others": {k: pct(v) for k, v in sorted(others.items(), key=lambda kv: -kv[1]) if pct(v) >= 0.1}}


def _session_name() -> str | None:
    """The name of the Ray session this process is connected to (``session_<date>_<pid>``, in the command
    lines of its GCS, raylet and dashboard); None where Ray does not say (then RayCpu counts every Ray)."""
    import ray

    # Ray has no public accessor for it (2.60); its node object has had it since 1.x
    node = getattr(ray._private.worker.global_worker, "node", None)
    name = getattr(node, "session_name", None)
    return str(name) if name else None


def _tune_trials(cfg, trials: int, trial_cpus: float, root: Path) -> list[float]:
    """Wall seconds of each of ``trials`` sequential Tune trials training ``cfg`` (the first one from the
    Tuner's start, each later one from the end of the one before)."""
    from ray import tune

    from raysent.train.ray_train import worker_env
    from raysent.train.resources import claim_devices, resolve, tune_trial_resources
    from raysent.train.run import reuse_across_runs
    from raysent.tune.driver import reuse_trial_processes
    from raysent.tune.records_transport import results_of
    from raysent.tune.trial import train_trial

    env = worker_env()  # absolute paths: a trial runs in its own folder, as do its Ray Train workers
    cfg = resolve(cfg)[0]  # gpus_per_worker auto, as a search resolves it: a trial given no GPU sees none

    def trial(config: dict) -> None:
        os.environ.update(env)
        claim_devices()  # what a search's trial does first (raysent.tune.trial.prepare_process)
        reuse_across_runs()
        train_trial(with_overrides(cfg, {"train.output_dir": str(root / "runs" / f"trial{config['i']}")}))
        tune.report({"ended": time.time()})

    tuner = tune.Tuner(tune.with_resources(trial, {**tune_trial_resources(cfg), "CPU": trial_cpus}),
                       param_space={"i": tune.grid_search(list(range(trials)))},
                       tune_config=tune.TuneConfig(max_concurrent_trials=1, reuse_actors=reuse_trial_processes(cfg)),
                       run_config=tune.RunConfig(name="bench", storage_path=str(root / "state"), verbose=0))
    t0 = time.time()
    results = tuner.fit()
    if results.errors:
        raise RuntimeError(f"a Tune trial failed: {results.errors[0]}")
    ends = sorted(float((r.metrics or {})["ended"]) for r in results_of(results))
    return [b - a for a, b in zip([t0, *ends[:-1]], ends)]


def bench_overhead(raw_config: dict, steps: int, cpus: float, trials: int = 2, say=lambda m: None) -> OverheadResult:
    import ray
    import torch

    from raysent.train.ray_train import init_ray, train_with_ray
    from raysent.train.run import train_in_process

    root = Path(tempfile.mkdtemp(prefix="raysent-bench-overhead-"))
    base = parse_config(raw_config, source="<raysent bench>")
    # every way evaluates the untuned model itself: a score the first way stored would make the later ways cheaper
    base = with_overrides(base, {"train.max_steps": steps, "tracking.enabled": False,
                                 "train.eval_at_start_cache": False})
    out: dict = {"steps": steps, "batch_size": base.train.batch_size, "eval_every": base.train.eval_every,
                 "trials": trials}
    try:
        say(f"  bare loop: {steps} steps in this process")
        cfg = with_overrides(base, {"train.output_dir": str(root / "bare")})
        # the torch threads a Ray worker with `cpus` CPUs gets (Ray sets OMP_NUM_THREADS to their floor)
        threads = torch.get_num_threads()
        torch.set_num_threads(max(1, math.floor(cpus)))
        t0 = time.perf_counter()
        try:
            bare = train_in_process(cfg, quiet=True)
        finally:
            torch.set_num_threads(threads)
        out["bare_seconds"] = time.perf_counter() - t0
        out["bare_train_seconds"] = bare.train_seconds
        out["bare_phases"] = bare.phases

        t0 = time.perf_counter()
        started_here = not ray.is_initialized()
        # a local Ray started here: the worker gets the CPUs the bare loop had (Ray gives an actor floor(CPUs)
        # torch threads), and the trial's own driver, idle while Train runs, 0.1 more: one logical CPU beyond
        init_ray(base, log_to_driver=False, num_cpus=math.ceil(cpus) + 1)
        out["ray_init_seconds"] = time.perf_counter() - t0 if started_here else None

        ray_cfg = with_overrides(base, {"resources.workers": 1, "resources.cpus_per_worker": cpus,
                                        "resources.trial_cpus": 0.1})
        say(f"  Ray Train, 1 worker: {steps} steps")
        t0, t0_unix = time.perf_counter(), time.time()
        with RayCpu(session=_session_name()) as cpu:
            ray_run = train_with_ray(with_overrides(ray_cfg, {"train.output_dir": str(root / "train")}), quiet=True)
        out["ray_train_seconds"] = time.perf_counter() - t0
        out["ray_train_cpu"] = cpu.summary()
        out["ray_train_train_seconds"] = ray_run.train_seconds
        start = ray_run.startup
        out["ray_train_phases"] = {"until_worker_runs": start["entered_unix"] - t0_unix,
                                   "build_method": start["build_method_seconds"],
                                   "prepare_data": start["prepare_data_seconds"], **ray_run.phases}
        out["torch_threads"] = {"bare": bare.torch_threads, "ray_train": ray_run.torch_threads}

        say(f"  {trials} Ray Tune trials, each running Ray Train: {steps} steps each")
        out["tune_trial_each"] = _tune_trials(ray_cfg, trials, 0.1, root / "tune")
        say(f"  {trials} Ray Tune trials, each training in its own process: {steps} steps each")
        in_trial = with_overrides(base, {"resources.workers": None})
        with RayCpu(session=_session_name()) as cpu:
            out["tune_in_trial_each"] = _tune_trials(in_trial, trials, cpus, root / "tune-in-trial")
        out["tune_in_trial_cpu"] = cpu.summary()
    except Exception as exc:
        from raysent.bench.cases import PartFailed

        raise PartFailed(_ratios(out)) from exc  # the ways measured before the one that failed
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return _ratios(out)


def _ratios(out: dict) -> OverheadResult:
    """The ways measured, each one's time ÷ the bare loop's added."""
    for way in ("tune_trial", "tune_in_trial"):
        each = out.get(f"{way}_each")
        if each:
            out[f"{way}_seconds"] = each[0]  # the first trial of a search (Tune's trial process started)
            out[f"{way}_next_seconds"] = sum(each[1:]) / len(each[1:]) if len(each) > 1 else None
    for way in ("ray_train", "tune_trial", "tune_trial_next", "tune_in_trial", "tune_in_trial_next"):
        if out.get(f"{way}_seconds") is not None and "bare_seconds" in out:
            out[f"{way}_ratio"] = out[f"{way}_seconds"] / out["bare_seconds"]
            out[f"{way}_overhead"] = out[f"{way}_ratio"] - 1.0
    return OverheadResult.model_validate(out)
