"""``raysent bench`` part 7, ``search``: the same short search three ways, in one run (issue 61, "The bench measures
a search, not only a step").

The search: unsupervised SimCSE (Gao et al. 2021) on the bench's model, batch and length, mean pooling, a grid of
``--search-trials`` learning rates (:data:`SEARCH_LRS`, the first ones), one seed, ``--search-steps`` steps each, the
STS-B dev Spearman at the end as the objective. The ways:

* ``one-per-gpu``: ``raysent tune`` as it ran before issue 61: ``train.compile: false`` and
  ``resources.gpus_per_worker: 1`` (0 on a machine without a GPU), so one trial per GPU, one after another on one GPU;
* ``defaults``: ``raysent tune`` on its defaults: ``train.compile: auto`` (CUDA graphs on CUDA past the break-even)
  and ``gpus_per_worker: auto`` (trials packed onto the GPU where the probe measures that it pays). Without CUDA
  both settings resolve as ``one-per-gpu``'s, so it is not run again: its record says so (``same_as``);
* ``st-hpsearch``: sentence-transformers' ``SentenceTransformerTrainer.hyperparameter_search`` with the Optuna
  backend (its documented route, sbert.net "Hyperparameter Optimization": ``model_init``, a loss built per model,
  ``hp_space``, ``compute_objective``), on the same learning rates (Optuna's ``GridSampler``: each tried once), steps,
  model, batch, length and sentences, scored by its ``EmbeddingSimilarityEvaluator`` on STS-B dev.

Each way runs in a fresh process (:mod:`raysent.bench.search_cases`); the raysent ways run the search phase alone
(``tune_experiment(search_only=True)``: no final phase, as ``hyperparameter_search`` has none), Ray's start
included. Reported per way: wall seconds, configurations per hour, the best learning rate and its dev score, what the
trials were given (trials per GPU, at once) and trained with (compile, CUDA graphs, attention implementation), and,
where ``nvidia-smi`` answers, the GPU's utilisation sampled every half second (:class:`GpuSampler`). A way that fails
loses only itself.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from collections.abc import Callable

from raysent.bench.result import SearchPartResult, SearchWayResult

CASES_MODULE = "raysent.bench.search_cases"  # the ways' processes run it (the searches themselves)

SEARCH_LRS = (1e-5, 2e-5, 3e-5, 5e-5, 1e-4, 2e-4, 3e-4, 5e-4)  # the grid's first --search-trials values
WAYS = ("one-per-gpu", "defaults", "st-hpsearch")
SAMPLE_S = 0.5  # nvidia-smi's sampling period


class GpuSampler:
    """GPU 0's utilisation (percent of the time a kernel ran) and memory in use, from ``nvidia-smi -lms``, while a
    way runs; ``summary()`` is None where there is no ``nvidia-smi`` (no NVIDIA GPU)."""

    def __init__(self, period_s: float = SAMPLE_S):
        self.period_ms = int(period_s * 1000)
        self.util: list[float] = []
        self.memory: list[float] = []
        self.proc: subprocess.Popen | None = None
        self.thread: threading.Thread | None = None

    def __enter__(self) -> GpuSampler:
        exe = shutil.which("nvidia-smi")
        if exe is not None:
            self.proc = subprocess.Popen([exe, "--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader,"
                                          "nounits", "-i", "0", f"-lms={self.period_ms}"], stdout=subprocess.PIPE,
                                         stderr=subprocess.DEVNULL, text=True)
            self.thread = threading.Thread(target=self._read, daemon=True)
            self.thread.start()
        return self

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                util, mem = (float(x) for x in line.split(","))
            except ValueError:  # "[N/A]", a header
                continue
            self.util.append(util)
            self.memory.append(mem)

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
        if self.thread is not None:
            self.thread.join(timeout=10)

    def summary(self) -> dict | None:
        if not self.util:
            return None
        return {"gpu_util_mean_percent": sum(self.util) / len(self.util), "gpu_util_samples": len(self.util),
                "gpu_memory_peak_mib": max(self.memory)}


def search_lrs(trials: int) -> list[float]:
    return list(SEARCH_LRS[:trials])


def _spec(opts, way: str, cuda: bool) -> dict:
    lrs = search_lrs(opts.search_trials)
    base = {"label": way, "model": opts.model, "batch_size": opts.batch_size, "max_length": opts.max_length,
            "steps": opts.search_steps, "lrs": lrs, "threads": opts.threads}
    if way == "st-hpsearch":
        return {**base, "kind": "st-hpsearch"}
    overrides = {"train.compile": False, "resources.gpus_per_worker": 1 if cuda else 0} if way == "one-per-gpu" else {}
    return {**base, "kind": "raysent-search", "overrides": overrides, "cpus": 1.0}


def bench_search(opts, rec, cuda: bool, run_case: Callable[..., SearchWayResult]) -> SearchPartResult:
    """The three ways in turn (:data:`WAYS`), each in its own process (``run_case``: the runner's, given so that
    this module and the runner do not import each other) under a :class:`GpuSampler`; the record is updated after
    each."""
    out = SearchPartResult(trials=opts.search_trials, steps=opts.search_steps, lrs=search_lrs(opts.search_trials),
                           batch_size=opts.batch_size, max_length=opts.max_length, model=opts.model, ways={})
    rec.update("search", out)
    for way in WAYS:
        if way == "defaults" and not cuda:
            out.ways = {**out.ways, way: SearchWayResult(same_as="one-per-gpu", note=(
                "not run: without CUDA train.compile auto stays off and gpus_per_worker auto gives 0 GPUs, "
                "one-per-gpu's settings"))}
            rec.update("search", out)
            continue
        rec.say(f"search: {way}, {opts.search_trials} trial(s) of {opts.search_steps} steps")
        rec.current = way
        try:
            with GpuSampler() as gpu:
                t0 = time.perf_counter()
                case = run_case(_spec(opts, way, cuda), rec.say, SearchWayResult, module=CASES_MODULE)
                wall = time.perf_counter() - t0
        except Exception as exc:
            rec.fail("search", way, exc)
            continue
        finally:
            rec.current = None
        case.process_seconds = wall
        case.configurations_per_hour = (case.trials_finished or 0) * 3600.0 / case.wall_seconds \
            if case.wall_seconds else None
        gpu_summary = gpu.summary()
        if gpu_summary:
            case = case.model_copy(update=gpu_summary)
        out.ways = {**out.ways, way: case}
        out.ratios = ratios(out.ways)
        rec.update("search", out)
    return out


def ratios(ways: dict[str, SearchWayResult]) -> dict[str, float]:
    """``defaults_vs_one_per_gpu``: configurations per hour, the defaults ÷ one trial per GPU without graphs (1.0
    where the defaults are the same settings); ``st_vs_raysent_wall``: sentence-transformers' wall ÷ raysent's on
    its defaults."""
    out: dict[str, float] = {}
    one, st = ways.get("one-per-gpu"), ways.get("st-hpsearch")
    d = ways.get("defaults")
    if d is not None and d.same_as == "one-per-gpu":
        d = one
    if d is not None and one is not None and d.configurations_per_hour and one.configurations_per_hour:
        out["defaults_vs_one_per_gpu"] = d.configurations_per_hour / one.configurations_per_hour
    if d is not None and st is not None and d.wall_seconds and st.wall_seconds:
        out["st_vs_raysent_wall"] = st.wall_seconds / d.wall_seconds
    return out
