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
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from raysent.bench.cases import RESULT_PREFIX, PartFailed
from raysent.bench.markdown import format_markdown
from raysent.bench.options import PARTS, BenchOptions
from raysent.bench.result import (
    BenchResult,
    CaseResult,
    GpuResult,
    Machine,
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

# the training data of each kind of method (the shared data's own files; the hub otherwise)
DATA_FOR_KIND = {"sentences": "wiki1m", "triplets": "nli-triplets", "nli_pairs": "snli:dev+test"}
# what the project promises (issue "Performance"), checked in the summary
TARGETS = {
    "simcse_unsup_vs_st_mnrl": 1.3,
    "evaluation_speedup": 2.0,
    "tune_train_overhead": 0.05,
    "sg_opt_cached_views": 1.8,
}
# dense bf16 peak of common accelerators (TFLOP/s, without sparsity): the first pattern found in the device
# name (torch.cuda.get_device_name) counts, so variants come before their family; anything else: --peak-tflops
PEAK_BF16_TFLOPS = {r"\bH200\b": 989.0, r"\bH100\b.*\bPCIe\b": 756.0, r"\bH100\b.*\bNVL\b": 835.0,
                    r"\bH100\b": 989.0, r"\bA100\b": 312.0, r"\bL40S\b": 362.0, r"\bL40\b": 181.0,
                    r"\bA10G\b": 70.0, r"\bA10\b": 125.0, r"\bL4\b": 121.0, r"\bRTX 4090\b": 165.0,
                    r"\bRTX 3090\b": 71.0}


def peak_bf16_tflops(device_name: str) -> float | None:
    """The dense bf16 peak of a device from its name, None when it is not in PEAK_BF16_TFLOPS."""
    return next((v for pattern, v in PEAK_BF16_TFLOPS.items() if re.search(pattern, device_name)), None)


def method_config(opts: BenchOptions, method: str, **train) -> dict:
    """The experiment config of one training case: the method's paper defaults but the bench's model,
    batch, length and data (one data set per kind of method)."""
    from raysent.methods import get_method

    cls = get_method(method)
    kind = cls.data_kind(cls.Params())
    # enough examples for every step, plus room for whole groups (supcon)
    need = opts.batch_size * (opts.warmup + opts.steps + 2)
    return {"name": "bench", "method": method, "model": {"name": opts.model},
            "data": {"train": DATA_FOR_KIND[kind], "max_train_samples": need if kind == "sentences" else None},
            "train": {"batch_size": opts.batch_size, "max_length": opts.max_length, **train},
            "tracking": {"enabled": False}}


def run_case(spec: dict, say: Say) -> CaseResult:
    """One case in a fresh process (:mod:`raysent.bench.cases`)."""
    proc = subprocess.run([sys.executable, "-m", "raysent.bench.cases", json.dumps(spec)], capture_output=True,
                          text=True, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_PREFIX)]
    if proc.returncode != 0 or not lines:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise RaysentError(f"bench case {spec.get('label')} failed (exit {proc.returncode}):\n{tail}")
    return CaseResult.model_validate(json.loads(lines[-1][len(RESULT_PREFIX):]))


def _method_spec(opts: BenchOptions, label: str, method: str, **train) -> dict:
    return {"kind": "method", "label": label, "config": method_config(opts, method, **train),
            "warmup": opts.warmup, "steps": opts.steps, "threads": opts.threads}


def _grad_cache_spec(opts: BenchOptions, rows: int | None) -> dict:
    """The gradient-caching case: a large batch, a few steps (its point is the memory)."""
    big = replace(opts, batch_size=opts.grad_cache_batch, warmup=1, steps=min(opts.steps, 3))
    return _method_spec(big, "grad cache", "simcse-unsup", **({"grad_cache_rows": rows} if rows else {}))


def _st_spec(opts: BenchOptions, precision: str = "fp32") -> dict:
    from raysent.methods.simcse_unsup import SimCSEUnsupParams

    return {"kind": "st-mnrl", "label": "sentence-transformers MNRL", "model": opts.model, "data": "wiki1m",
            "batch_size": opts.batch_size, "max_length": opts.max_length, "warmup": opts.warmup,
            "steps": opts.steps, "lr": 3e-5, "temperature": SimCSEUnsupParams().temperature,
            "threads": opts.threads, "precision": precision}


NO_SPEEDUPS = {"length_buckets": 1, "concat_views": False, "cache_views": False, "huge_pages": False}


def bench_training(opts: BenchOptions, say: Say) -> TrainingResult:
    cases = {}
    for m in opts.methods:
        say(f"training: {m}")
        cases[m] = run_case(_method_spec(opts, m, m), say)
    say("training: sentence-transformers MultipleNegativesRankingLoss")
    st = run_case(_st_spec(opts), say)
    ratios = {m: c.steps_per_second / st.steps_per_second for m, c in cases.items()}
    return TrainingResult(methods=cases, st_mnrl=st, steps_per_second_vs_st_mnrl=ratios)


def bench_speedups(opts: BenchOptions, say: Say, training: TrainingResult | None = None) -> dict[str, SpeedupResult]:
    """Each speedup on (raysent's default) and off, everything else equal."""
    rows = opts.grad_cache_rows or max(opts.grad_cache_batch // 8, 1)
    pairs: list[tuple[str, str, dict, dict]] = [
        ("length_buckets", "simcse-unsup", {}, {"length_buckets": 1}),
        ("concat_views", "simcse-unsup", {}, {"concat_views": False}),
        ("cache_views", "sg-opt", {}, {"cache_views": False}),
        ("huge_pages", "simcse-unsup", {}, {"huge_pages": False}),
        ("all_speedups", "simcse-unsup", {}, NO_SPEEDUPS),
        ("grad_cache", "simcse-unsup", {"grad_cache_rows": rows}, {}),
    ]
    out = {}
    known = training.methods if training is not None else {}
    for name, method, on, off in pairs:
        if name not in opts.speedups:
            continue
        say(f"speedups: {name} ({method})")
        if name == "grad_cache":
            a, b = run_case(_grad_cache_spec(opts, rows), say), run_case(_grad_cache_spec(opts, None), say)
        else:
            a = known[method] if not on and method in known else run_case(_method_spec(opts, method, method, **on), say)
            b = run_case(_method_spec(opts, method, method, **off), say)
        out[name] = SpeedupResult(method=method, on=a, off=b, on_settings=on or "defaults", off_settings=off,
                                  speedup=a.steps_per_second / b.steps_per_second,
                                  peak_rss_ratio=a.peak_rss_mib / b.peak_rss_mib)
    return out


def bench_gpu(opts: BenchOptions, say: Say) -> GpuResult:
    import torch

    if not torch.cuda.is_available():
        return GpuResult(skipped="no CUDA device")
    name = torch.cuda.get_device_name(0)
    peak = opts.peak_tflops or peak_bf16_tflops(name)
    out = GpuResult(device=name, peak_bf16_tflops=peak, cases={})
    for label, spec in (("simcse-unsup bf16", _method_spec(opts, "simcse-unsup", "simcse-unsup", precision="bf16")),
                        ("simcse-unsup fp32", _method_spec(opts, "simcse-unsup", "simcse-unsup")),
                        ("st-mnrl bf16", _st_spec(opts, precision="bf16"))):
        say(f"gpu: {label}")
        case = run_case(spec, say)
        if case.real_tokens_per_step is not None and case.encoder_params_non_embedding is not None:  # a method's
            # 6·N·tokens: forward and backward of the encoder's non-embedding weights (Kaplan et al. 2020)
            flops = 6.0 * case.encoder_params_non_embedding * case.real_tokens_per_step * case.steps_per_second
            case.model_tflops = flops / 1e12
            case.mfu = flops / (peak * 1e12) if peak else None
        out.cases[label] = case
    return out


def run_bench(opts: BenchOptions, say: Say = print) -> BenchResult:
    """Every part of ``opts.parts`` in turn. A part that fails is recorded under ``failed`` (its error; what
    it had measured stays in its own section) and the next part runs; Ctrl-C stops at the part it interrupts
    (``interrupted``): either way what was measured is returned, to be written."""
    opts.check()
    started = _dt.datetime.now()
    result = BenchResult(options=opts, started=started.replace(microsecond=0), machine=machine_info(opts))

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

    parts: dict[str, Callable[[], object]] = {
        "training": lambda: bench_training(opts, say),
        "speedups": lambda: bench_speedups(opts, say, result.training),
        "evaluation": evaluation, "overhead": overhead, "gpu": lambda: bench_gpu(opts, say)}
    for part in PARTS:
        if part not in opts.parts:
            continue
        try:
            setattr(result, part, parts[part]())  # the part's section (validated on assignment)
        except KeyboardInterrupt:
            say(f"{part}: interrupted; writing what was measured before it")
            result.interrupted = part
            break
        except Exception as exc:  # the other parts' measurements are worth keeping
            cause = exc.__cause__ if isinstance(exc, PartFailed) and exc.__cause__ else exc
            if isinstance(exc, PartFailed):
                setattr(result, part, exc.partial)
            # assigned, not updated in place: to_json writes the fields that were set
            result.failed = {**result.failed, part: f"{type(cause).__name__}: {cause}"}
            last = (str(cause).strip().splitlines() or [""])[-1][:300]  # a worker's error ends its traceback
            say(f"{part}: FAILED ({type(cause).__name__}: {last}); going on with the next part")
    result.targets = check_targets(result)
    result.seconds = (_dt.datetime.now() - started).total_seconds()
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
    return Targets(
        simcse_unsup_vs_st_mnrl=entry(tr.steps_per_second_vs_st_mnrl.get("simcse-unsup") if tr else None,
                                      TARGETS["simcse_unsup_vs_st_mnrl"]),
        evaluation_speedup=entry(ev.speedup if ev and ev.equal_scores else None, TARGETS["evaluation_speedup"]),
        tune_train_overhead=entry(tune, TARGETS["tune_train_overhead"], False),
        sg_opt_cached_views=entry(sp["cache_views"].speedup if "cache_views" in sp else None,
                                  TARGETS["sg_opt_cached_views"]),
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
    md_path.write_text(format_markdown(result))
    return json_path, md_path
