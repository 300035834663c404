"""The bench driver: its parts in order, the targets and the written record (see :mod:`raysent.bench`; the
options: :mod:`raysent.bench.options`)."""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import subprocess
import sys
from dataclasses import asdict, replace
from pathlib import Path

from raysent.bench.cases import PartFailed
from raysent.bench.options import PARTS, BenchOptions
from raysent.errors import RaysentError

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
    import re

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


def run_case(spec: dict, say) -> dict:
    """One case in a fresh process (:mod:`raysent.bench.cases`)."""
    from raysent.bench.cases import RESULT_PREFIX

    proc = subprocess.run([sys.executable, "-m", "raysent.bench.cases", json.dumps(spec)], capture_output=True,
                          text=True, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_PREFIX)]
    if proc.returncode != 0 or not lines:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise RaysentError(f"bench case {spec.get('label')} failed (exit {proc.returncode}):\n{tail}")
    return json.loads(lines[-1][len(RESULT_PREFIX):])


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


def bench_training(opts: BenchOptions, say) -> dict:
    cases = {}
    for m in opts.methods:
        say(f"training: {m}")
        cases[m] = run_case(_method_spec(opts, m, m), say)
    say("training: sentence-transformers MultipleNegativesRankingLoss")
    st = run_case(_st_spec(opts), say)
    ratios = {m: c["steps_per_second"] / st["steps_per_second"] for m, c in cases.items()}
    return {"methods": cases, "st_mnrl": st, "steps_per_second_vs_st_mnrl": ratios}


def bench_speedups(opts: BenchOptions, say, training: dict | None = None) -> dict:
    """Each speedup on (raysent's default) and off, everything else equal."""
    rows = opts.grad_cache_rows or max(opts.grad_cache_batch // 8, 1)
    pairs = [
        ("length_buckets", "simcse-unsup", {}, {"length_buckets": 1}),
        ("concat_views", "simcse-unsup", {}, {"concat_views": False}),
        ("cache_views", "sg-opt", {}, {"cache_views": False}),
        ("huge_pages", "simcse-unsup", {}, {"huge_pages": False}),
        ("all_speedups", "simcse-unsup", {}, NO_SPEEDUPS),
        ("grad_cache", "simcse-unsup", {"grad_cache_rows": rows}, {}),
    ]
    out = {}
    known = (training or {}).get("methods", {})
    for name, method, on, off in pairs:
        if name not in opts.speedups:
            continue
        say(f"speedups: {name} ({method})")
        if name == "grad_cache":
            a, b = run_case(_grad_cache_spec(opts, rows), say), run_case(_grad_cache_spec(opts, None), say)
        else:
            a = known[method] if not on and method in known else run_case(_method_spec(opts, method, method, **on), say)
            b = run_case(_method_spec(opts, method, method, **off), say)
        out[name] = {"method": method, "on": a, "off": b, "on_settings": on or "defaults", "off_settings": off,
                     "speedup": a["steps_per_second"] / b["steps_per_second"],
                     "peak_rss_ratio": a["peak_rss_mib"] / b["peak_rss_mib"]}
    return out


def bench_gpu(opts: BenchOptions, say) -> dict:
    import torch

    if not torch.cuda.is_available():
        return {"skipped": "no CUDA device"}
    name = torch.cuda.get_device_name(0)
    peak = opts.peak_tflops or peak_bf16_tflops(name)
    out = {"device": name, "peak_bf16_tflops": peak, "cases": {}}
    for label, spec in (("simcse-unsup bf16", _method_spec(opts, "simcse-unsup", "simcse-unsup", precision="bf16")),
                        ("simcse-unsup fp32", _method_spec(opts, "simcse-unsup", "simcse-unsup")),
                        ("st-mnrl bf16", _st_spec(opts, precision="bf16"))):
        say(f"gpu: {label}")
        case = run_case(spec, say)
        if "real_tokens_per_step" in case:
            # 6·N·tokens: forward and backward of the encoder's non-embedding weights (Kaplan et al. 2020)
            flops = 6.0 * case["encoder_params_non_embedding"] * case["real_tokens_per_step"] * case["steps_per_second"]
            case["model_tflops"] = flops / 1e12
            case["mfu"] = flops / (peak * 1e12) if peak else None
        out["cases"][label] = case
    return out


def run_bench(opts: BenchOptions, say=print) -> dict:
    """Every part of ``opts.parts`` in turn. A part that fails is recorded under ``failed`` (its error; what
    it had measured stays in its own key) and the next part runs; Ctrl-C stops at the part it interrupts
    (``interrupted``): either way what was measured is returned, to be written."""
    opts.check()
    started = _dt.datetime.now()
    result: dict = {"options": asdict(opts), "started": started.isoformat(timespec="seconds"),
                    "machine": machine_info(opts)}

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

    parts = {"training": lambda: bench_training(opts, say),
             "speedups": lambda: bench_speedups(opts, say, result.get("training")),
             "evaluation": evaluation, "overhead": overhead, "gpu": lambda: bench_gpu(opts, say)}
    for part in PARTS:
        if part not in opts.parts:
            continue
        try:
            result[part] = parts[part]()
        except KeyboardInterrupt:
            say(f"{part}: interrupted; writing what was measured before it")
            result["interrupted"] = part
            break
        except Exception as exc:  # the other parts' measurements are worth keeping
            cause = exc.__cause__ if isinstance(exc, PartFailed) and exc.__cause__ else exc
            if isinstance(exc, PartFailed):
                result[part] = exc.partial
            result.setdefault("failed", {})[part] = f"{type(cause).__name__}: {cause}"
            last = (str(cause).strip().splitlines() or [""])[-1][:300]  # a worker's error ends its traceback
            say(f"{part}: FAILED ({type(cause).__name__}: {last}); going on with the next part")
    result["targets"] = check_targets(result)
    result["seconds"] = (_dt.datetime.now() - started).total_seconds()
    return result


def check_targets(result: dict) -> dict:
    def entry(value, target, higher_is_better=True):
        if value is None:
            return {"value": None, "target": target, "met": None}
        return {"value": value, "target": target, "met": value >= target if higher_is_better else value <= target}

    tr, sp = result.get("training", {}), result.get("speedups", {})
    ev, ov = result.get("evaluation", {}), result.get("overhead", {})
    return {
        "simcse_unsup_vs_st_mnrl": entry(tr.get("steps_per_second_vs_st_mnrl", {}).get("simcse-unsup"),
                                         TARGETS["simcse_unsup_vs_st_mnrl"]),
        "evaluation_speedup": entry(ev.get("speedup") if ev.get("equal_scores") else None,
                                    TARGETS["evaluation_speedup"]),
        # a search's trials after its first (Tune started): what each of its many trials costs
        "tune_train_overhead": entry(ov.get("tune_trial_next_overhead", ov.get("tune_trial_overhead")),
                                     TARGETS["tune_train_overhead"], False),
        "sg_opt_cached_views": entry(sp.get("cache_views", {}).get("speedup"), TARGETS["sg_opt_cached_views"]),
    }


def machine_info(opts: BenchOptions) -> dict:
    import torch
    import transformers

    info = {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
            "torch": torch.__version__, "transformers": transformers.__version__,
            "torch_threads": opts.threads or torch.get_num_threads(),
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
    for pkg in ("ray", "sentence_transformers"):
        try:
            info[pkg] = __import__(pkg).__version__
        except ImportError:
            info[pkg] = None
    return info


def write_results(result: dict, output_dir: str | Path) -> tuple[Path, Path]:
    from raysent.io import write_json_atomic

    out = Path(output_dir)
    stem = result["started"].replace(":", "").replace("-", "")
    stem = f"{stem[:8]}-{stem[9:15]}"
    json_path, md_path = out / f"{stem}.json", out / f"{stem}.md"
    write_json_atomic(json_path, result)
    md_path.write_text(format_markdown(result))
    return json_path, md_path


def _f(x, spec=".2f", suffix=""):
    return "—" if x is None else f"{x:{spec}}{suffix}"


def format_markdown(r: dict) -> str:
    o, m = r["options"], r["machine"]
    lines = [f"# raysent bench, {r['started']}", "",
             f"Model `{o['model']}`, batch {o['batch_size']}, max length {o['max_length']}, {o['steps']} timed steps "
             f"after {o['warmup']} warm-up steps per case (each case in a fresh process). Machine: {m['cpus']} CPUs, "
             f"torch {m['torch']} ({m['torch_threads']} threads), {m['cuda'] or 'no GPU'}; transformers "
             f"{m['transformers']}, sentence-transformers {m['sentence_transformers']}, ray {m['ray']}.", ""]
    t = r.get("targets", {})
    if t:
        lines += ["## Targets", "", "| target | measured | goal | met |", "| --- | ---: | ---: | :---: |"]
        names = {"simcse_unsup_vs_st_mnrl": ("simcse-unsup steps/s ÷ sentence-transformers MNRL", "×"),
                 "evaluation_speedup": ("7-set STS evaluation speed ÷ EmbeddingSimilarityEvaluator (equal scores)",
                                        "×"),
                 "tune_train_overhead": ("Tune + Train overhead per trial of a search (a trial after the first), "
                                         "on a run of the overhead steps", ""),
                 "sg_opt_cached_views": ("SG-OPT steps/s, cached BERT_F views ÷ not cached", "×")}
        for key, e in t.items():
            label, unit = names[key]
            if key == "tune_train_overhead":
                val = _f(e["value"] * 100 if e["value"] is not None else None, ".1f", " %")
                goal = f"≤ {e['target'] * 100:.0f} %"
            else:
                val, goal = _f(e["value"], ".2f", unit), f"≥ {e['target']:.1f}{unit}"
            met = "—" if e["met"] is None else ("yes" if e["met"] else "**no**")
            lines.append(f"| {label} | {val} | {goal} | {met} |")
        lines.append("")
    if r.get("failed") or r.get("interrupted"):
        lines += ["## Not measured", ""]
        if r.get("interrupted"):
            lines.append(f"* interrupted (Ctrl-C) during `{r['interrupted']}`; the parts after it did not run")
        for part, error in r.get("failed", {}).items():
            last = (error.strip().splitlines() or [""])[-1][:300]
            lines.append(f"* `{part}` failed ({'what it measured before is below; ' if part in r else ''}"
                         f"the whole error is in the .json): {last}")
        lines.append("")
    tr = r.get("training")
    if tr:
        st = tr["st_mnrl"]
        lines += ["## Training throughput", "",
                  "| case | steps/s | sentences/s | peak RSS (MiB) | × ST MNRL |",
                  "| --- | ---: | ---: | ---: | ---: |"]
        for name, c in tr["methods"].items():
            lines.append(f"| {name} | {c['steps_per_second']:.2f} | {c['sentences_per_second']:.0f} | "
                         f"{c['peak_rss_mib']:.0f} | {tr['steps_per_second_vs_st_mnrl'][name]:.2f} |")
        lines.append(f"| sentence-transformers MNRL | {st['steps_per_second']:.2f} | "
                     f"{st['sentences_per_second']:.0f} | {st['peak_rss_mib']:.0f} | 1.00 |")
        lines += ["", "sentences/s counts each example's text fields once (a triplet is 3 sentences, an NLI pair 2; "
                  "the two dropout views of one sentence count once), as sentence-transformers' anchor=positive "
                  "pairs do.", ""]
    sp = r.get("speedups")
    if sp:
        lines += ["## Speedups (on ÷ off)", "",
                  "| speedup | method | steps/s on | steps/s off | speedup | peak RSS on/off |",
                  "| --- | --- | ---: | ---: | ---: | ---: |"]
        for name, s in sp.items():
            lines.append(f"| {name} | {s['method']} | {s['on']['steps_per_second']:.2f} | "
                         f"{s['off']['steps_per_second']:.2f} | {s['speedup']:.2f}× | {s['peak_rss_ratio']:.2f} |")
        if "grad_cache" in sp:
            g = sp["grad_cache"]
            lines += ["", f"grad_cache runs batch {o['grad_cache_batch']} "
                      f"(chunks of {g['on_settings']['grad_cache_rows']} rows) for {g['on']['steps']} steps: "
                      f"peak RSS {g['on']['peak_rss_mib']:.0f} MiB with the cache, "
                      f"{g['off']['peak_rss_mib']:.0f} MiB without; on a GPU the same holds for its memory "
                      "(a batch that does not fit at all fits in chunks)."]
        cv = sp.get("cache_views", {}).get("on", {})
        if cv.get("prepare"):
            p = cv["prepare"]
            lines += ["", f"SG-OPT's view cache for the {o['batch_size'] * (o['warmup'] + o['steps'] + 2):,} bench "
                      f"sentences: {p.get('view_cache_mib', 0):.1f} MiB, "
                      f"built in {p.get('view_cache_seconds', 0):.1f} s "
                      "(not in the timed steps)."]
        lines.append("")
    ev = r.get("evaluation")
    if ev:
        lines += [f"## STS evaluation ({len(ev['scores'])} test sets)", "",
                  f"raysent {ev['raysent_seconds']:.1f} s, sentence-transformers' EmbeddingSimilarityEvaluator "
                  f"{ev['sentence_transformers_seconds']:.1f} s: **{ev['speedup']:.2f}×**; scores equal within "
                  f"{ev['tolerance']}: {'yes' if ev['equal_scores'] else '**no**'} (largest difference "
                  f"{ev['max_abs_difference']:.4f}). Sentences embedded: raysent "
                  f"{ev['sentences_embedded']['raysent']:,} (each distinct one once), sentence-transformers "
                  f"{ev['sentences_embedded']['sentence_transformers']:,}.", "",
                  "| set | raysent | sentence-transformers |", "| --- | ---: | ---: |"]
        for task, s in ev["scores"].items():
            lines.append(f"| {task} | {s['raysent']:.2f} | {s['sentence_transformers']:.2f} |")
        lines.append("")
    ov = r.get("overhead")
    if ov and "bare_seconds" in ov:
        def way(label, key, loop=""):
            if ov.get(f"{key}_seconds") is None:
                return []
            return [f"| {label} | {ov[f'{key}_seconds']:.1f} | {loop} | {ov[f'{key}_ratio']:.3f} |"]

        ph = ov.get("ray_train_phases", {})
        lines += ["## Orchestration overhead", "",
                  f"The same {ov['steps']}-step simcse-unsup run (batch {ov['batch_size']}, dev every "
                  f"{ov['eval_every']} steps, checkpoints); the Tune ways as {ov.get('trials', 1)} trials one after "
                  "another in one Tuner, as a search runs them:", "",
                  "| way | wall (s) | of which the training loop (s) | ÷ bare |", "| --- | ---: | ---: | ---: |",
                  f"| bare loop (this process) | {ov['bare_seconds']:.1f} | {ov['bare_train_seconds']:.1f} | 1.00 |",
                  *way("Ray Train, 1 worker", "ray_train", _f(ov.get("ray_train_train_seconds"), ".1f")),
                  *way("Tune trial running Ray Train: first", "tune_trial"),
                  *way("Tune trial running Ray Train: each later one", "tune_trial_next"),
                  *way("Tune trial training in its own process: first", "tune_in_trial"),
                  *way("Tune trial training in its own process: each later one", "tune_in_trial_next"),
                  ""]
        if ph:
            lines += ["Where the Ray Train run's time went: " + ", ".join(
                f"{k.replace('_seconds', '').replace('_', ' ')} {v:.1f} s" for k, v in ph.items()) +
                " (the bare loop's: " + ", ".join(f"{k.replace('_seconds', '').replace('_', ' ')} {v:.1f} s"
                                                  for k, v in ov.get("bare_phases", {}).items()) + ").", ""]
        for key, label in (("ray_train_cpu", "the Ray Train run"),
                           ("tune_in_trial_cpu", "the Tune trials training in their own process")):
            c = ov.get(key)
            if c:
                top = ", ".join(f"{k} {v:.1f}" for k, v in list(c["others"].items())[:6])
                lines += [f"CPU while {label} ran (% of one core): the training process ({c['trainer']}) "
                          f"{c['trainer_percent']:.1f}, Ray's {c['processes']} other processes and this one "
                          f"{c['others_percent']:.1f} (most: {top}); with every core training, the loop loses about "
                          "twice the latter.", ""]
        threads = ov.get("torch_threads", {})
        lines += [f"`ray.init` (once per search, not per trial): {_f(ov.get('ray_init_seconds'), '.1f', ' s')}; torch "
                  f"threads bare / on the Ray worker: {threads.get('bare', '—')} / {threads.get('ray_train', '—')}.",
                  ""]
    g = r.get("gpu")
    if g:
        lines += ["## GPU", ""]
        if g.get("skipped"):
            lines.append(f"Skipped: {g['skipped']}.")
        else:
            lines += [f"{g['device']}, bf16 peak {_f(g['peak_bf16_tflops'], '.0f', ' TFLOP/s')}.", "",
                      "| case | steps/s | sentences/s | GPU peak (MiB) | model TFLOP/s | MFU |",
                      "| --- | ---: | ---: | ---: | ---: | ---: |"]
            for label, c in g["cases"].items():
                lines.append(f"| {label} | {c['steps_per_second']:.2f} | {c['sentences_per_second']:.0f} | "
                             f"{_f(c.get('cuda_peak_mib'), '.0f')} | {_f(c.get('model_tflops'), '.1f')} | "
                             f"{_f(c['mfu'] * 100 if c.get('mfu') is not None else None, '.1f', ' %')} |")
        lines.append("")
    return "\n".join(lines)
