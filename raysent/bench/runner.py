"""The bench driver: its parts in order, the targets and the written record (see :mod:`raysent.bench`; the
options: :mod:`raysent.bench.options`; the record: :mod:`raysent.bench.result`)."""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal, TypeVar, overload

from pydantic import BaseModel

from raysent.bench.cases import RESULT_PREFIX, PartFailed
from raysent.bench.markdown import format_markdown
from raysent.bench.options import PARTS, BenchOptions, Part
from raysent.bench.result import (
    BenchResult,
    CaseResult,
    GpuResult,
    Machine,
    ProfileCase,
    ProfileResult,
    SpeedupResult,
    Target,
    Targets,
    TrainingResult,
)
from raysent.errors import RaysentError
from raysent.io import write_json_atomic

# Lazy imports: torch, transformers, raysent's heavier modules (heavy, and only the functions that need them import
# them).

Say = Callable[[str], object]  # where the progress lines go
M = TypeVar("M", bound=BaseModel)

# the training data of each kind of method (the shared data's own files; the hub otherwise)
DATA_FOR_KIND = {"sentences": "wiki1m", "triplets": "nli-triplets", "nli_pairs": "snli:dev+test"}
# what the project promises (issue "Performance"), checked in the summary
TARGETS = {
    "simcse_unsup_vs_st_mnrl": 1.3,
    "evaluation_speedup": 2.0,
    "tune_train_overhead": 0.05,
    "sg_opt_cached_views": 1.8,
    "gpu_simcse_unsup_vs_st_mnrl": 3.0,  # issue 46: on a GPU, batch 64, length 32, bf16
    "gpu_mfu": 0.40,  # issue 46: at batch 512 (checked from GPU_MFU_BATCH up)
    "gpu_compile_again_vs_first": 0.1,  # issue 61: a search's later trial's compile ÷ its first's
    "gpu_search_defaults_vs_one_per_gpu": 4.0,  # issue 61: a short search's configurations per hour
    "gpu_search_st_vs_raysent_wall": 5.0,  # issue 61: sentence-transformers' hyperparameter_search wall ÷ raysent's
}
GPU_MFU_BATCH = 512
# dense bf16 peak of common accelerators (TFLOP/s, without sparsity): the first pattern found in the device
# name (torch.cuda.get_device_name) counts, so variants come before their family; anything else: --peak-tflops
PEAK_BF16_TFLOPS = {r"\bH200\b": 989.0, r"\bH100\b.*\bPCIe\b": 756.0, r"\bH100\b.*\bNVL\b": 835.0,
                    r"\bH100\b": 989.0, r"\bA100\b": 312.0, r"\bL40S\b": 362.0, r"\bL40\b": 181.0,
                    r"\bA10G\b": 70.0, r"\bA10\b": 125.0, r"\bL4\b": 121.0, r"\bRTX 4090\b": 165.0,
                    r"\bRTX 3090\b": 71.0}


# the same devices' dense TF32 tensor-core peak and their fp32 peak without tensor cores (vendor data sheets, without
# sparsity): what an fp32 case's MFU is taken against (raysent.bench.runner.peak_for)
PEAK_TF32_TFLOPS = {r"\bH200\b": 494.7, r"\bH100\b.*\bPCIe\b": 378.0, r"\bH100\b.*\bNVL\b": 417.5,
                    r"\bH100\b": 494.7, r"\bA100\b": 156.0, r"\bL40S\b": 183.0, r"\bL40\b": 90.5,
                    r"\bA10G\b": 35.0, r"\bA10\b": 62.5, r"\bL4\b": 60.0, r"\bRTX 4090\b": 82.6,
                    r"\bRTX 3090\b": 35.6}
PEAK_FP32_TFLOPS = {r"\bH200\b": 66.9, r"\bH100\b.*\bPCIe\b": 51.2, r"\bH100\b.*\bNVL\b": 60.0,
                    r"\bH100\b": 66.9, r"\bA100\b": 19.5, r"\bL40S\b": 91.6, r"\bL40\b": 90.5,
                    r"\bA10G\b": 31.2, r"\bA10\b": 31.2, r"\bL4\b": 30.3, r"\bRTX 4090\b": 82.6,
                    r"\bRTX 3090\b": 35.6}


def _lookup(table: dict[str, float], device_name: str) -> float | None:
    return next((v for pattern, v in table.items() if re.search(pattern, device_name)), None)


def peak_bf16_tflops(device_name: str) -> float | None:
    """The dense bf16 peak of a device from its name, None when it is not in PEAK_BF16_TFLOPS."""
    return _lookup(PEAK_BF16_TFLOPS, device_name)


def method_config(opts: BenchOptions, method: str, **train) -> dict:
    """The experiment config of one training case: the method's paper defaults but the bench's model,
    batch, length and data (one data set per kind of method)."""
    from raysent.methods.spec import get_spec

    cls = get_spec(method)
    kind = cls.data_kind(cls.Params())
    # enough examples for every step, plus room for whole groups (supcon)
    need = opts.batch_size * (opts.warmup + opts.steps + 2)
    return {"name": "bench", "method": method, "model": {"name": opts.model},
            "data": {"train": DATA_FOR_KIND[kind], "max_train_samples": need if kind == "sentences" else None},
            "train": {"batch_size": opts.batch_size, "max_length": opts.max_length, **train},
            "tracking": {"enabled": False}}


@overload
def run_case(spec: dict, say: Say) -> CaseResult: ...
@overload
def run_case(spec: dict, say: Say, model: type[M], module: str = ...) -> M: ...
def run_case(spec: dict, say: Say, model: type[BaseModel] = CaseResult,
             module: str = "raysent.bench.cases") -> BaseModel:
    """One case in a fresh process (``python -m module``: :mod:`raysent.bench.cases`, or another module whose
    ``main`` is that one's), its report read as ``model``."""
    proc = subprocess.run([sys.executable, "-m", module, json.dumps(spec)], capture_output=True,
                          text=True, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_PREFIX)]
    if proc.returncode != 0 or not lines:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise RaysentError(f"bench case {spec.get('label')} failed (exit {proc.returncode}):\n{tail}")
    return model.model_validate(json.loads(lines[-1][len(RESULT_PREFIX):]))


class Terminated(KeyboardInterrupt):
    """SIGTERM (``timeout`` sends it) turned into an interruption, so the run stops as at Ctrl-C and says so."""


class Recorder:
    """The record of one run as it grows: each part puts its section in through :meth:`update` and runs its cases
    through :meth:`case`, and the record is handed to ``save`` after each (so a run that is killed keeps what it
    measured). A case that fails loses only itself: its error goes into ``failed_cases`` and the part goes on."""

    def __init__(self, opts: BenchOptions, say: Say, save: Callable[[BenchResult], object] | None = None):
        self.opts, self.say, self._save = opts, say, save
        self.started = _dt.datetime.now()
        self.result = BenchResult(options=opts, started=self.started.replace(microsecond=0),
                                  machine=machine_info(opts))
        self.current: str | None = None  # the case running now

    def save(self) -> None:
        self.result.targets = check_targets(self.result)
        self.result.seconds = (_dt.datetime.now() - self.started).total_seconds()
        if self._save is not None:
            self._save(self.result)

    def update(self, part: Part, section: object) -> None:
        setattr(self.result, part, section)  # validated on assignment
        self.save()

    @overload
    def case(self, part: Part, label: str, spec: dict, *, announce: str | None = None) -> CaseResult | None: ...
    @overload
    def case(self, part: Part, label: str, spec: dict, model: type[M], announce: str | None = None) -> M | None: ...
    def case(self, part: Part, label: str, spec: dict, model: type[BaseModel] = CaseResult,
             announce: str | None = None) -> BaseModel | None:
        """The case of ``spec`` run in its own process (:func:`run_case`), or None when it failed (recorded under
        ``failed_cases[part][label]``). ``announce``: its progress line, said once it is the running case."""
        self.current = label
        if announce is not None:
            self.say(announce)
        try:
            out = run_case(spec, self.say, model)
        except Exception as exc:  # the part's other cases are worth keeping
            self.fail(part, label, exc)
            return None
        self.current = None
        return out

    def fail(self, part: Part, label: str, exc: BaseException) -> None:
        """``label`` of ``part`` failed: its error recorded under ``failed_cases``, said, and the record saved."""
        r = self.result
        r.failed_cases = {**r.failed_cases, part: {**r.failed_cases.get(part, {}), label: _error(exc)}}
        self.say(f"{part}: {label} FAILED ({_last_line(exc)}); going on with the next case")
        self.save()


# an absolute path in an error names the machine that ran the bench (its user, its temporary folders); records
# are committed under results/bench/, so errors keep only a path's last part (tests/train/test_records.py)
_ABSOLUTE_PATH = re.compile(r"(?<![\w:.~$/-])/(?:[^\s\"'`)/]+/)+(?=[^\s\"'`)/])")


def _redact(text: str) -> str:
    return _ABSOLUTE_PATH.sub(".../", text)


def _error(exc: BaseException) -> str:
    return _redact(f"{type(exc).__name__}: {exc}")


def _last_line(exc: BaseException) -> str:
    # a worker's error, and a case's, ends with the last line of its traceback
    return _redact(f"{type(exc).__name__}: " + (str(exc).strip().splitlines() or [""])[-1][:300])


def _method_spec(opts: BenchOptions, label: str, method: str, **train) -> dict:
    return {"kind": "method", "label": label, "config": method_config(opts, method, **train),
            "warmup": opts.warmup, "steps": opts.steps, "threads": opts.threads}


def _grad_cache_spec(opts: BenchOptions, rows: int | None) -> dict:
    """The gradient-caching case: a large batch, a few steps (its point is the memory)."""
    big = replace(opts, batch_size=opts.grad_cache_batch, warmup=1, steps=min(opts.steps, 3))
    return _method_spec(big, "grad cache", "simcse-unsup", **({"grad_cache_rows": rows} if rows else {}))


def _st_spec(opts: BenchOptions, precision: str = "auto") -> dict:
    """sentence-transformers' MNRL on the bench's model, data, batch and length; ``auto`` precision as raysent's
    default resolves it (bf16 on a CUDA device that has it, fp32 on a CPU)."""
    from raysent.methods.simcse_unsup import SimCSEUnsupParams

    return {"kind": "st-mnrl", "label": "sentence-transformers MNRL", "model": opts.model, "data": "wiki1m",
            "batch_size": opts.batch_size, "max_length": opts.max_length, "warmup": opts.warmup,
            "steps": opts.steps, "lr": 3e-5, "temperature": SimCSEUnsupParams().temperature,
            "threads": opts.threads, "precision": precision}


NO_SPEEDUPS = {"length_buckets": 1, "concat_views": False, "cache_views": False, "huge_pages": False}
ALL_SPEEDUPS = {"length_buckets": 4, "concat_views": True, "cache_views": True, "huge_pages": True}


def bench_training(opts: BenchOptions, rec: Recorder) -> TrainingResult:
    out = TrainingResult(methods={}, steps_per_second_vs_st_mnrl={})
    rec.update("training", out)

    def ratios() -> dict[str, float]:
        st = out.st_mnrl
        return {m: c.steps_per_second / st.steps_per_second for m, c in out.methods.items()} if st else {}

    for m in opts.methods:
        case = rec.case("training", m, _method_spec(opts, m, m), announce=f"training: {m}")
        if case is not None:
            out.methods = {**out.methods, m: case}
            rec.update("training", out)
    out.st_mnrl = rec.case("training", "st-mnrl", _st_spec(opts),
                           announce="training: sentence-transformers MultipleNegativesRankingLoss")
    out.steps_per_second_vs_st_mnrl = ratios()
    rec.update("training", out)
    return out


def _resolved(opts: BenchOptions, method: str, device: str, **train) -> tuple:
    """The settings a case of ``method`` with ``train`` trains with on ``device`` (the ``auto`` ones resolved)."""
    from raysent.config import parse_config
    from raysent.train.device import resolve

    t = parse_config(method_config(opts, method, **train), source="<raysent bench>").train
    settings = {k: v for k, v in resolve(t, device).record().items() if k != "auto"}
    return tuple(sorted(settings.items())) + ((t.concat_views, t.cache_views),)


def bench_speedups(opts: BenchOptions, rec: Recorder, training: TrainingResult | None = None
                   ) -> dict[str, SpeedupResult]:
    """Each speedup on and off, everything else equal. Where the device's defaults already have it on, 'on' is
    the defaults (and the training part's case of that method, when it ran, is reused)."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    rows = opts.grad_cache_rows or max(opts.grad_cache_batch // 8, 1)
    pairs: list[tuple[str, str, dict, dict]] = [
        ("length_buckets", "simcse-unsup", {"length_buckets": 4}, {"length_buckets": 1}),
        ("concat_views", "simcse-unsup", {}, {"concat_views": False}),
        ("cache_views", "sg-opt", {}, {"cache_views": False}),
        ("huge_pages", "simcse-unsup", {"huge_pages": True}, {"huge_pages": False}),
        ("all_speedups", "simcse-unsup", ALL_SPEEDUPS, NO_SPEEDUPS),
        ("grad_cache", "simcse-unsup", {"grad_cache_rows": rows}, {}),
    ]
    out: dict[str, SpeedupResult] = {}
    rec.update("speedups", out)
    known = training.methods if training is not None else {}
    for name, method, on, off in pairs:
        if name not in opts.speedups:
            continue
        rec.say(f"speedups: {name} ({method})")
        if name == "grad_cache":
            a = rec.case("speedups", f"{name} on", _grad_cache_spec(opts, rows))
            b = rec.case("speedups", f"{name} off", _grad_cache_spec(opts, None))
        else:
            if on and _resolved(opts, method, device, **on) == _resolved(opts, method, device):
                on = {}  # the device's defaults already have it on
            a = known[method] if not on and method in known else rec.case(
                "speedups", f"{name} on", _method_spec(opts, method, method, **on))
            b = rec.case("speedups", f"{name} off", _method_spec(opts, method, method, **off))
        if a is None or b is None:
            continue
        out = {**out, name: SpeedupResult(method=method, on=a, off=b, on_settings=on or "defaults",
                                          off_settings=off, speedup=a.steps_per_second / b.steps_per_second,
                                          peak_rss_ratio=a.peak_rss_mib / b.peak_rss_mib)}
        rec.update("speedups", out)
    return out


# --------------------------------------------------------------------------- the gpu part
# each raysent case of the gpu part: the train settings it changes against simcse-unsup's defaults (on CUDA: bf16,
# length_buckets 1, huge_pages off, fused_adamw on, compiled with CUDA graphs: the bench times the steps after the
# compile, so compile: auto needs no break-even there; raysent.train.device); the others are MNRL's
GPU_OVERRIDES: dict[str, dict[str, Any]] = {
    "defaults": {}, "eager": {"compile": False}, "fp32": {"precision": "fp32"},
    "length-buckets-4": {"length_buckets": 4}, "fused-adamw-off": {"fused_adamw": False},
    "huge-pages-on": {"huge_pages": True}, "defaults-again": {}, "compile": {"compile": True},
    "compile-default": {"compile": True, "compile_mode": "default"}}
GPU_ST = {"st-mnrl-bf16": "bf16", "st-mnrl-fp32": "fp32"}
MFU_FORMULA = ("PaLM (Chowdhery et al. 2022, App. B): model FLOPs per token 6N + 12·L·H·Q·T, summed over a "
               "step's encoded sentences as 6N·ΣT + 12·L·H·Q·ΣT² (N: the encoder's parameters outside its "
               "embeddings and pooler; L layers, H heads, Q head size; T a sentence's real tokens, padding not "
               "counted), times steps/s, ÷ the device's dense peak for the case's precision")


def model_flops_per_step(n_params: int, layers: int, heads: int, head_dim: int, tokens: float,
                         tokens_sq: float) -> float:
    """Model FLOPs of one training step (forward and backward), PaLM's (Chowdhery et al. 2022, Appendix B):
    6N + 12·L·H·Q·T per token of a sequence of T tokens, so over a step's sequences 6N·ΣT + 12·L·H·Q·ΣT²
    (``tokens`` = ΣT, ``tokens_sq`` = ΣT²). Recomputation (gradient caching's second pass) is not counted."""
    return 6.0 * n_params * tokens + 12.0 * layers * heads * head_dim * tokens_sq


def device_peaks(device_name: str, bf16_override: float | None = None) -> dict[str, float | None]:
    """The device's dense peaks (TFLOP/s): bf16 (``--peak-tflops`` wins), TF32 and fp32."""
    return {"bf16": bf16_override or peak_bf16_tflops(device_name), "tf32": _lookup(PEAK_TF32_TFLOPS, device_name),
            "fp32": _lookup(PEAK_FP32_TFLOPS, device_name)}


def peak_for(case: CaseResult, peaks: dict[str, float | None]) -> tuple[float | None, str]:
    """The peak a case's MFU is taken against, and its name: bf16 (and fp16) against the dense bf16 peak; fp32
    against the dense TF32 peak where torch runs fp32 matrix products in TF32 (float32_matmul_precision 'high' or
    'medium'), else against the fp32 peak."""
    precision = getattr(case, "precision", None)
    if precision in ("bf16", "fp16"):
        return peaks["bf16"], "bf16 dense"
    if getattr(case, "float32_matmul_precision", "highest") in ("high", "medium"):
        return peaks["tf32"], "tf32 dense"
    return peaks["fp32"], "fp32"


def add_mfu(case: CaseResult, peaks: dict[str, float | None]) -> None:
    """Set the case's model FLOPs, model TFLOP/s and MFU from what it measured (nothing where a count is
    missing)."""
    n, layers, heads, head_dim = (case.encoder_params_non_embedding, case.encoder_layers, case.attention_heads,
                                  case.head_dim)
    tokens, tokens_sq = case.encoder_tokens_per_step, case.encoder_tokens_sq_per_step
    if n is None or layers is None or heads is None or head_dim is None or tokens is None or tokens_sq is None:
        return
    case.model_flops_per_step = model_flops_per_step(n, layers, heads, head_dim, tokens, tokens_sq)
    case.model_tflops = case.model_flops_per_step * case.steps_per_second / 1e12
    case.peak_tflops, case.peak_kind = peak_for(case, peaks)
    case.mfu = case.model_tflops / case.peak_tflops if case.peak_tflops else None


def bench_gpu(opts: BenchOptions, rec: Recorder) -> GpuResult:
    import torch

    if not torch.cuda.is_available():
        out = GpuResult(skipped="no CUDA device")
        rec.update("gpu", out)
        return out
    return gpu_cases(opts, rec, torch.cuda.get_device_name(0))


def gpu_cases(opts: BenchOptions, rec: Recorder, device_name: str) -> GpuResult:
    """The gpu part's cases (``opts.gpu_cases``, in that order) on whatever device the cases train on. They share
    one compiler cache, empty at the start (raysent.train.compile_cache): the first compiled case compiles cold, a
    later one with the same settings finds its graphs there, as a search's later trial does."""
    from raysent.train import compile_cache

    with tempfile.TemporaryDirectory(prefix="raysent-bench-compile-") as cache:
        saved = {var: os.environ.get(var) for var in compile_cache.VARS}
        os.environ.update({compile_cache.INDUCTOR_VAR: cache,
                           compile_cache.TRITON_VAR: str(Path(cache) / "triton")})  # the cases inherit them
        try:
            return _gpu_cases(opts, rec, device_name, cache)
        finally:
            for var, value in saved.items():
                if value is None:
                    os.environ.pop(var, None)
                else:
                    os.environ[var] = value


def compile_again(cases: dict[str, CaseResult]) -> tuple[str, str] | None:
    """The first two compiled cases, in the order run, that trained with the same settings (the first compiled
    cold, the second from the cache the first filled), or None."""
    seen: dict[str, str] = {}
    for label, c in cases.items():
        settings = getattr(c, "settings", None)
        if c.compile_seconds is None or not isinstance(settings, dict) or not settings.get("compile"):
            continue
        key = json.dumps({k: v for k, v in settings.items() if k not in ("auto", "compile_note")}, sort_keys=True)
        if key in seen:
            return seen[key], label
        seen[key] = label
    return None


def _gpu_cases(opts: BenchOptions, rec: Recorder, device_name: str, cache: str) -> GpuResult:
    peaks = device_peaks(device_name, opts.peak_tflops)
    out = GpuResult(device=device_name, peak_bf16_tflops=peaks["bf16"], peak_tf32_tflops=peaks["tf32"],
                    peak_fp32_tflops=peaks["fp32"], mfu_formula=MFU_FORMULA, cases={}, overrides={},
                    steps_per_second_vs_st_mnrl_bf16={}, compile_cache=cache)
    rec.update("gpu", out)
    for label in opts.gpu_cases:
        if label in GPU_ST:
            spec = {**_st_spec(opts, GPU_ST[label]), "label": label}
        else:
            spec = _method_spec(opts, label, "simcse-unsup", **GPU_OVERRIDES[label])
        case = rec.case("gpu", label, spec, announce=f"gpu: {label}")
        if case is None:
            continue
        add_mfu(case, peaks)
        out.cases = {**out.cases, label: case}
        if label in GPU_OVERRIDES:
            out.overrides = {**out.overrides, label: GPU_OVERRIDES[label]}
        st = out.cases.get("st-mnrl-bf16")
        out.steps_per_second_vs_st_mnrl_bf16 = (
            {k: c.steps_per_second / st.steps_per_second for k, c in out.cases.items()} if st else {})
        pair = compile_again(out.cases) if out.compile_again is None else None
        if pair is not None:
            first, again = out.cases[pair[0]].compile_seconds, out.cases[pair[1]].compile_seconds
            out.compile_first, out.compile_again = pair
            out.compile_again_vs_first = again / first if first and again is not None else None
        rec.update("gpu", out)
    return out


# --------------------------------------------------------------------------- the profile part
def bench_profile(opts: BenchOptions, rec: Recorder) -> ProfileResult:
    """simcse-unsup through raysent's Stepper and sentence-transformers' MNRL through its Trainer, each for
    ``opts.profile_steps`` steps under torch.profiler after ``opts.warmup`` (:mod:`raysent.bench.profile`)."""
    out = ProfileResult(method="simcse-unsup", warmup=opts.warmup)
    rec.update("profile", out)
    steps = {"warmup": opts.warmup, "steps": opts.profile_steps}
    sides = (("raysent", {**_method_spec(opts, "raysent", "simcse-unsup"), "kind": "profile-method", **steps}),
             ("st_mnrl", {**_st_spec(opts), "kind": "profile-st-mnrl", "label": "st-mnrl", **steps}))
    for side, spec in sides:
        case = rec.case("profile", spec["label"], spec, ProfileCase, announce=f"profile: {spec['label']}")
        if case is not None:
            setattr(out, side, case)
            rec.update("profile", out)
    return out


def run_bench(opts: BenchOptions, say: Say = print, save: Callable[[BenchResult], object] | None = None
              ) -> BenchResult:
    """Every part of ``opts.parts`` in turn; ``save`` gets the record after every case (and the end). A case
    that fails is recorded under ``failed_cases`` and the part goes on; a part that fails as a whole is recorded
    under ``failed`` (its error; what it had measured stays in its own section) and the next part runs; Ctrl-C
    (or SIGTERM, as :class:`Terminated`) stops at the part it interrupts (``interrupted``): either way what was
    measured is returned, to be written."""
    opts.check()
    rec = Recorder(opts, say, save)
    result = rec.result

    def evaluation():
        from raysent.bench.evaluation import bench_evaluation

        say("evaluation: raysent vs sentence-transformers EmbeddingSimilarityEvaluator")
        return bench_evaluation(opts.model, max_length=opts.eval_max_length, repeats=opts.eval_repeats,
                                tasks=opts.eval_sets, say=say)

    def overhead():
        from raysent.bench.overhead import bench_overhead

        say(f"overhead: the same {opts.overhead_steps}-step run bare, on Ray Train, in Tune trials")
        raw = method_config(opts, "simcse-unsup")
        raw["data"]["max_train_samples"] = opts.batch_size * (opts.overhead_steps + 1)
        return bench_overhead(raw, opts.overhead_steps, opts.cpus, trials=opts.overhead_trials, say=say)

    def search():
        import torch

        from raysent.bench.search import bench_search

        say(f"search: the same {opts.search_trials}-trial search as raysent ran it before issue 61, on its defaults, "
            "and with sentence-transformers' hyperparameter_search")
        return bench_search(opts, rec, cuda=torch.cuda.is_available(), run_case=run_case)

    parts: dict[str, Callable[[], object]] = {
        "training": lambda: bench_training(opts, rec),
        "speedups": lambda: bench_speedups(opts, rec, result.training),
        "evaluation": evaluation, "overhead": overhead, "gpu": lambda: bench_gpu(opts, rec),
        "profile": lambda: bench_profile(opts, rec), "search": search}
    for part in PARTS:
        if part not in opts.parts:
            continue
        try:
            rec.update(part, parts[part]())  # the part's section (validated on assignment)
        except KeyboardInterrupt as exc:
            by: Literal["SIGINT", "SIGTERM"] = "SIGTERM" if isinstance(exc, Terminated) else "SIGINT"
            say(f"{part}: interrupted ({by}); writing what was measured before it")
            result.interrupted, result.interrupted_by = part, by
            if rec.current is not None:
                result.interrupted_case = rec.current
            break
        except Exception as exc:  # the other parts' measurements are worth keeping
            cause = exc.__cause__ if isinstance(exc, PartFailed) and exc.__cause__ else exc
            if isinstance(exc, PartFailed):
                setattr(result, part, exc.partial)
            # assigned, not updated in place: to_json writes the fields that were set
            result.failed = {**result.failed, part: _error(cause)}
            say(f"{part}: FAILED ({_last_line(cause)}); going on with the next part")
        finally:
            rec.current = None
    rec.save()
    return result


def check_targets(result: BenchResult) -> Targets:
    def entry(value: float | None, target: float, higher_is_better: bool = True) -> Target:
        if value is None:
            return Target(value=None, target=target, met=None)
        return Target(value=value, target=target, met=value >= target if higher_is_better else value <= target)

    tr, sp, ev, ov = result.training, result.speedups or {}, result.evaluation, result.overhead
    # a search's trials after its first (Tune started): what each of its many trials costs (with one trial per
    # way, there is only the first)
    tune = None if ov is None else (ov.tune_trial_next_overhead if ov.tune_trial_next_overhead is not None
                                    else ov.tune_trial_overhead)
    gpu: dict[str, Target] = {}  # only where the gpu part measured a case (a record without them stays as it was)
    g = result.gpu
    if g is not None and g.cases:
        gpu["gpu_simcse_unsup_vs_st_mnrl"] = entry(g.steps_per_second_vs_st_mnrl_bf16.get("defaults"),
                                                   TARGETS["gpu_simcse_unsup_vs_st_mnrl"])
        if result.options.batch_size >= GPU_MFU_BATCH:
            d = g.cases.get("defaults")
            gpu["gpu_mfu"] = entry(d.mfu if d is not None else None, TARGETS["gpu_mfu"])
        if g.compile_again_vs_first is not None:
            gpu["gpu_compile_again_vs_first"] = entry(g.compile_again_vs_first, TARGETS["gpu_compile_again_vs_first"],
                                                      False)
    found = result.search
    if found is not None and any(w.device == "cuda" for w in found.ways.values()):
        for key in ("defaults_vs_one_per_gpu", "st_vs_raysent_wall"):
            gpu[f"gpu_search_{key}"] = entry(found.ratios.get(key), TARGETS[f"gpu_search_{key}"])
    return Targets(
        simcse_unsup_vs_st_mnrl=entry(tr.steps_per_second_vs_st_mnrl.get("simcse-unsup") if tr else None,
                                      TARGETS["simcse_unsup_vs_st_mnrl"]),
        evaluation_speedup=entry(ev.speedup if ev and ev.equal_scores else None, TARGETS["evaluation_speedup"]),
        tune_train_overhead=entry(tune, TARGETS["tune_train_overhead"], False),
        sg_opt_cached_views=entry(sp["cache_views"].speedup if "cache_views" in sp else None,
                                  TARGETS["sg_opt_cached_views"]),
        **gpu,
    )


def machine_info(opts: BenchOptions) -> Machine:
    import torch
    import transformers

    versions: dict[str, str | None] = {}
    for pkg, dist in (("ray", "ray"), ("sentence_transformers", "sentence-transformers")):
        try:  # the installed version, without importing the package (Ray's import alone takes seconds)
            versions[pkg] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[pkg] = None
    return Machine(platform=platform.platform(), python=platform.python_version(), cpus=os.cpu_count(),
                   torch=torch.__version__, transformers=transformers.__version__,
                   torch_threads=opts.threads or torch.get_num_threads(),
                   cuda=torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
                   ray=versions["ray"], sentence_transformers=versions["sentence_transformers"])


def write_results(result: BenchResult, output_dir: str | Path) -> tuple[Path, Path]:
    """``<output_dir>/<date>-<time>.json`` and ``.md``, named by the run's start."""
    out = Path(output_dir)
    stem = result.started.strftime("%Y%m%d-%H%M%S")
    json_path, md_path = out / f"{stem}.json", out / f"{stem}.md"
    write_json_atomic(json_path, result.to_json())
    fd, tmp = tempfile.mkstemp(dir=out, prefix=f".{md_path.name}.")
    with os.fdopen(fd, "w") as fh:
        fh.write(format_markdown(result))
    os.replace(tmp, md_path)
    return json_path, md_path
