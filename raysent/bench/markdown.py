"""The markdown summary of a bench run (``results/bench/<date>-<time>.md``, and what `raysent bench` prints):
one function per section, each empty where its part did not run."""

from __future__ import annotations

from collections.abc import Callable

from raysent.bench.result import BenchResult, CpuShare, ProfileCase, Target


def format_markdown(result: BenchResult) -> str:
    sections: list[Callable[[BenchResult], list[str]]] = [
        _header, _targets, _not_measured, _training, _speedups, _evaluation, _overhead, _gpu, _profile, _search]
    return "\n".join(line for section in sections for line in section(result))


def _f(x: float | None, spec: str = ".2f", suffix: str = "") -> str:
    return "—" if x is None else f"{x:{spec}}{suffix}"


def _header(r: BenchResult) -> list[str]:
    o, m = r.options, r.machine
    return [f"# raysent bench, {r.started.isoformat(timespec='seconds')}", "",
            f"Model `{o.model}`, batch {o.batch_size}, max length {o.max_length}, {o.steps} timed steps "
            f"after {o.warmup} warm-up steps per case (each case in a fresh process). Machine: {m.cpus} CPUs, "
            f"torch {m.torch} ({m.torch_threads} threads), {m.cuda or 'no GPU'}; transformers "
            f"{m.transformers}, sentence-transformers {m.sentence_transformers}, ray {m.ray}.", ""]


def _targets(r: BenchResult) -> list[str]:
    t = r.targets
    if t is None:
        return []

    def row(label: str, e: Target, measured: str, goal: str) -> str:
        met = "—" if e.met is None else ("yes" if e.met else "**no**")
        return f"| {label} | {measured} | {goal} | {met} |"

    def ratio(label: str, e: Target) -> str:
        return row(label, e, _f(e.value, ".2f", "×"), f"≥ {e.target:.1f}×")

    ov = t.tune_train_overhead  # a fraction; lower is better
    return ["## Targets", "", "| target | measured | goal | met |", "| --- | ---: | ---: | :---: |",
            ratio("simcse-unsup steps/s ÷ sentence-transformers MNRL", t.simcse_unsup_vs_st_mnrl),
            ratio("7-set STS evaluation speed ÷ EmbeddingSimilarityEvaluator (equal scores)", t.evaluation_speedup),
            row("Tune + Train overhead per trial of a search (a trial after the first), on a run of the overhead "
                "steps", ov, _f(ov.value * 100 if ov.value is not None else None, ".1f", " %"),
                f"≤ {ov.target * 100:.0f} %"),
            ratio("SG-OPT steps/s, cached BERT_F views ÷ not cached", t.sg_opt_cached_views),
            *([ratio("GPU: simcse-unsup steps/s on its defaults ÷ sentence-transformers MNRL bf16",
                     t.gpu_simcse_unsup_vs_st_mnrl)] if t.gpu_simcse_unsup_vs_st_mnrl is not None else []),
            *([row(f"GPU, batch {r.options.batch_size}: simcse-unsup MFU on its defaults", t.gpu_mfu,
                   _f(t.gpu_mfu.value * 100 if t.gpu_mfu.value is not None else None, ".1f", " %"),
                   f"≥ {t.gpu_mfu.target * 100:.0f} %")] if t.gpu_mfu is not None else []),
            *([row("GPU: compile of a search's later trial (graphs in the shared cache) ÷ its first's",
                   t.gpu_compile_again_vs_first, _f(t.gpu_compile_again_vs_first.value, ".2f"),
                   f"≤ {t.gpu_compile_again_vs_first.target:.1f}")] if t.gpu_compile_again_vs_first is not None
              else []),
            *([ratio("GPU: a short search's configurations per hour, the defaults ÷ one trial per GPU without graphs",
                     t.gpu_search_defaults_vs_one_per_gpu)] if t.gpu_search_defaults_vs_one_per_gpu is not None
              else []),
            *([ratio("GPU: the same search's wall time, sentence-transformers' hyperparameter_search ÷ raysent",
                     t.gpu_search_st_vs_raysent_wall)] if t.gpu_search_st_vs_raysent_wall is not None else []),
            ""]


def _last(error: str) -> str:
    return (error.strip().splitlines() or [""])[-1][:300]  # a worker's error ends its traceback


def _not_measured(r: BenchResult) -> list[str]:
    if not r.failed and not r.interrupted and not r.failed_cases:
        return []
    lines = ["## Not measured", ""]
    if r.interrupted:
        by = "Ctrl-C" if r.interrupted_by in (None, "SIGINT") else f"{r.interrupted_by}, as a timeout sends"
        case = f", case `{r.interrupted_case}`" if r.interrupted_case else ""
        lines.append(f"* interrupted ({by}) during `{r.interrupted}`{case}; the parts after it did not run")
    for part, error in r.failed.items():
        lines.append(f"* `{part}` failed ({'what it measured before is below; ' if r.measured(part) else ''}"
                     f"the whole error is in the .json): {_last(error)}")
    for part, cases in r.failed_cases.items():
        for label, error in cases.items():
            lines.append(f"* `{part}`, case `{label}` failed (the part's other cases are below; the whole error is "
                         f"in the .json): {_last(error)}")
    return [*lines, ""]


def _training(r: BenchResult) -> list[str]:
    tr = r.training
    if tr is None:
        return []
    st = tr.st_mnrl
    lines = ["## Training throughput", "",
             "| case | steps/s | sentences/s | peak RSS (MiB) | × ST MNRL |",
             "| --- | ---: | ---: | ---: | ---: |"]
    for name, c in tr.methods.items():
        lines.append(f"| {name} | {c.steps_per_second:.2f} | {c.sentences_per_second:.0f} | "
                     f"{c.peak_rss_mib:.0f} | {_f(tr.steps_per_second_vs_st_mnrl.get(name))} |")
    if st is not None:
        lines.append(f"| sentence-transformers MNRL | {st.steps_per_second:.2f} | "
                     f"{st.sentences_per_second:.0f} | {st.peak_rss_mib:.0f} | 1.00 |")
    return [*lines, "", "sentences/s counts each example's text fields once (a triplet is 3 sentences, an NLI pair "
            "2; the two dropout views of one sentence count once), as sentence-transformers' anchor=positive "
            "pairs do.", ""]


def _speedups(r: BenchResult) -> list[str]:
    sp, o = r.speedups, r.options
    if not sp:
        return []
    lines = ["## Speedups (on ÷ off)", "",
             "| speedup | method | steps/s on | steps/s off | speedup | peak RSS on/off |",
             "| --- | --- | ---: | ---: | ---: | ---: |"]
    for name, s in sp.items():
        lines.append(f"| {name} | {s.method} | {s.on.steps_per_second:.2f} | "
                     f"{s.off.steps_per_second:.2f} | {s.speedup:.2f}× | {s.peak_rss_ratio:.2f} |")
    g = sp.get("grad_cache")
    if g is not None:
        rows = g.on_settings.get("grad_cache_rows") if isinstance(g.on_settings, dict) else None
        lines += ["", f"grad_cache runs batch {o.grad_cache_batch} (chunks of {rows} rows) for {g.on.steps} steps: "
                  f"peak RSS {g.on.peak_rss_mib:.0f} MiB with the cache, {g.off.peak_rss_mib:.0f} MiB without; on a "
                  "GPU the same holds for its memory (a batch that does not fit at all fits in chunks)."]
    cv = sp.get("cache_views")
    p = cv.on.prepare if cv is not None else None
    if p:
        lines += ["", f"SG-OPT's view cache for the {o.batch_size * (o.warmup + o.steps + 2):,} bench "
                  f"sentences: {p.get('view_cache_mib', 0):.1f} MiB, built in {p.get('view_cache_seconds', 0):.1f} s "
                  "(not in the timed steps)."]
    return [*lines, ""]


def _evaluation(r: BenchResult) -> list[str]:
    ev = r.evaluation
    if ev is None:
        return []
    lines = [f"## STS evaluation ({len(ev.scores)} test sets)", "",
             f"raysent {ev.raysent_seconds:.1f} s, sentence-transformers' EmbeddingSimilarityEvaluator "
             f"{ev.sentence_transformers_seconds:.1f} s: **{ev.speedup:.2f}×**; scores equal within "
             f"{ev.tolerance}: {'yes' if ev.equal_scores else '**no**'} (largest difference "
             f"{ev.max_abs_difference:.4f}). Sentences embedded: raysent "
             f"{ev.sentences_embedded.raysent:,} (each distinct one once), sentence-transformers "
             f"{ev.sentences_embedded.sentence_transformers:,}.", "",
             "| set | raysent | sentence-transformers |", "| --- | ---: | ---: |"]
    for task, s in ev.scores.items():
        lines.append(f"| {task} | {s.raysent:.2f} | {s.sentence_transformers:.2f} |")
    return [*lines, ""]


def _phases(phases: dict[str, float]) -> str:
    return ", ".join(f"{k.replace('_seconds', '').replace('_', ' ')} {v:.1f} s" for k, v in phases.items())


def _cpu(label: str, c: CpuShare) -> list[str]:
    top = ", ".join(f"{k} {v:.1f}" for k, v in list(c.others.items())[:6])
    return [f"CPU while {label} ran (% of one core): the training process ({c.trainer}) "
            f"{c.trainer_percent:.1f}, Ray's {c.processes} other processes and this one "
            f"{c.others_percent:.1f} (most: {top}); with every core training, the loop loses about "
            "twice the latter.", ""]


def _overhead(r: BenchResult) -> list[str]:
    ov = r.overhead
    if ov is None or ov.bare_seconds is None:
        return []
    # (way, its wall seconds, ÷ bare, its training loop's seconds where known); a way not measured has no row
    ways = [("Ray Train, 1 worker", ov.ray_train_seconds, ov.ray_train_ratio, _f(ov.ray_train_train_seconds, ".1f")),
            ("Tune trial running Ray Train: first", ov.tune_trial_seconds, ov.tune_trial_ratio, ""),
            ("Tune trial running Ray Train: each later one", ov.tune_trial_next_seconds, ov.tune_trial_next_ratio,
             ""),
            ("Tune trial training in its own process: first", ov.tune_in_trial_seconds, ov.tune_in_trial_ratio, ""),
            ("Tune trial training in its own process: each later one", ov.tune_in_trial_next_seconds,
             ov.tune_in_trial_next_ratio, "")]
    lines = ["## Orchestration overhead", "",
             f"The same {ov.steps}-step simcse-unsup run (batch {ov.batch_size}, dev every {ov.eval_every} steps, "
             f"checkpoints); the Tune ways as {ov.trials} trials one after another in one Tuner, as a search runs "
             "them:", "",
             "| way | wall (s) | of which the training loop (s) | ÷ bare |", "| --- | ---: | ---: | ---: |",
             f"| bare loop (this process) | {ov.bare_seconds:.1f} | {_f(ov.bare_train_seconds, '.1f')} | 1.00 |",
             *(f"| {label} | {seconds:.1f} | {loop} | {_f(ratio, '.3f')} |"
               for label, seconds, ratio, loop in ways if seconds is not None),
             ""]
    if ov.ray_train_phases:
        lines += [f"Where the Ray Train run's time went: {_phases(ov.ray_train_phases)} (the bare loop's: "
                  f"{_phases(ov.bare_phases)}).", ""]
    if ov.ray_train_cpu is not None:
        lines += _cpu("the Ray Train run", ov.ray_train_cpu)
    if ov.tune_in_trial_cpu is not None:
        lines += _cpu("the Tune trials training in their own process", ov.tune_in_trial_cpu)
    threads = ov.torch_threads
    return [*lines,
            f"`ray.init` (once per search, not per trial): {_f(ov.ray_init_seconds, '.1f', ' s')}; torch threads "
            f"bare / on the Ray worker: {threads.bare if threads else '—'} / {threads.ray_train if threads else '—'}.",
            ""]


def _settings(label: str, overrides: dict) -> str:
    if label.startswith("st-mnrl"):
        return "sentence-transformers MNRL"
    return ", ".join(f"{k} {v}" for k, v in overrides.items()) or "defaults"


def _gpu(r: BenchResult) -> list[str]:
    g = r.gpu
    if g is None:
        return []
    if g.skipped:
        return ["## GPU", "", f"Skipped: {g.skipped}.", ""]
    st = g.cases.get("st-mnrl-bf16")
    lines = ["## GPU", "",
             f"{g.device}; dense peaks: bf16 {_f(g.peak_bf16_tflops, '.0f', ' TFLOP/s')}, TF32 "
             f"{_f(g.peak_tf32_tflops, '.0f', ' TFLOP/s')}, fp32 {_f(g.peak_fp32_tflops, '.1f', ' TFLOP/s')}. "
             "simcse-unsup through raysent's Stepper (each case's settings against its defaults) and "
             f"sentence-transformers' MNRL, batch {r.options.batch_size}, max length {r.options.max_length}; "
             f"× ST MNRL bf16: steps/s ÷ its steps/s in this run{'' if st else ' (not measured here)'}.", "",
             "| case | settings | precision | steps/s | sentences/s | × ST MNRL bf16 | GPU peak (MiB) | model TFLOP/s "
             "| MFU | peak used |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for label, c in g.cases.items():
        lines.append(f"| {label} | {_settings(label, g.overrides.get(label, {}))} | "
                     f"{getattr(c, 'precision', None) or '—'} | {c.steps_per_second:.2f} | "
                     f"{c.sentences_per_second:.0f} | {_f(g.steps_per_second_vs_st_mnrl_bf16.get(label))} | "
                     f"{_f(c.cuda_peak_mib, '.0f')} | {_f(c.model_tflops, '.1f')} | "
                     f"{_f(c.mfu * 100 if c.mfu is not None else None, '.1f', ' %')} | {c.peak_kind or '—'} |")
    lines.append("")
    d = g.cases.get("defaults")
    resolved = getattr(d, "settings", None) if d is not None else None
    if isinstance(resolved, dict):
        lines += ["simcse-unsup's defaults on this device: " + ", ".join(
            f"{k} {v}" + (" (auto)" if k in resolved.get("auto", []) else "")
            for k, v in resolved.items() if k not in ("auto", "device", "compile_note", "compile_cache")) + ".", ""]
    if g.compile_first and g.compile_again:
        a, b = g.cases[g.compile_first], g.cases[g.compile_again]
        lines += [f"Compile (the warm-up beyond its steps): `{g.compile_first}` {_f(a.compile_seconds, '.1f', ' s')} "
                  f"with an empty cache, `{g.compile_again}` {_f(b.compile_seconds, '.1f', ' s')} from the cache the "
                  f"first filled, as a search's later trial: {_f(g.compile_again_vs_first, '.2f')} of the first.", ""]
    if g.mfu_formula:
        lines += [f"MFU: {g.mfu_formula}.", ""]
    return lines


def _per_step(c: ProfileCase | None, value) -> str:
    return "—" if c is None else value(c)


def _profile(r: BenchResult) -> list[str]:
    p = r.profile
    if p is None:
        return []
    a, b = p.raysent, p.st_mnrl
    ref = a or b
    where = f"on {ref.device} in {ref.precision}, " if ref is not None else ""
    lines = ["## Profile (torch.profiler)", "",
             f"{p.method} through raysent's Stepper and sentence-transformers' MNRL through its Trainer, "
             f"{where}batch {r.options.batch_size}, max length {r.options.max_length}: "
             f"{ref.steps if ref else r.options.profile_steps} recorded steps after {p.warmup} untimed ones and the "
             "profiler's own warm-up step; per step (data loading included). The profiler slows the host: compare "
             "the two sides, not these times with the other parts'.", "",
             "| per step | raysent | sentence-transformers MNRL |", "| --- | ---: | ---: |"]

    def total(d: dict[str, float] | None) -> str:
        return "—" if d is None else f"{sum(d.values()):.1f}"

    rows: list[tuple[str, Callable[[ProfileCase], str]]] = [
        ("aten operators dispatched (nested ones included)", lambda c: f"{c.ops_per_step:.0f}"),
        ("aten operators called from outside another", lambda c: f"{c.top_level_ops_per_step:.0f}"),
        ("host milliseconds", lambda c: f"{c.host_ms_per_step:.1f}"),
        ("aten operators that wait for a CUDA device (.item(), nonzero, ...)", lambda c: total(c.sync_ops_per_step)),
    ]
    if ref is not None and ref.kernels_per_step is not None:
        rows += [("CUDA kernels launched", lambda c: _f(c.kernels_per_step, ".0f")),
                 ("GPU kernel milliseconds", lambda c: _f(c.device_ms_per_step, ".1f")),
                 ("runtime calls that wait for the device, and device-to-host copies",
                  lambda c: total(c.sync_calls_per_step))]
    lines += [f"| {label} | {_per_step(a, value)} | {_per_step(b, value)} |" for label, value in rows]
    lines.append("")
    waits = []
    for name, c in (("raysent", a), ("sentence-transformers", b)):
        found = {} if c is None else {**(c.sync_op_sources or c.sync_ops_per_step), **(c.sync_calls_per_step or {})}
        if found:
            waits.append(f"* {name}: " + ", ".join(f"{k} {v:.1f}" for k, v in found.items()))
    if waits:
        lines += ["What waits (or would wait) for the device, per step, by where it was called from (operator < its "
                  "callers; on a CPU the fused AdamW's own reads, `< aten::_fused_adamw_`, are not made by its CUDA "
                  "kernel):", "", *waits, ""]
    return lines


SEARCH_WAYS = {"one-per-gpu": "raysent, one trial per GPU, no graphs (before issue 61)",
               "defaults": "raysent on its defaults (compile auto, trials packed by auto)",
               "st-hpsearch": "sentence-transformers hyperparameter_search (Optuna)"}


def _search(r: BenchResult) -> list[str]:
    p = r.search
    if p is None:
        return []
    lines = ["## A short search, three ways", "",
             f"simcse-unsup on `{p.model}`, batch {p.batch_size}, max length {p.max_length}: {p.trials} learning "
             f"rate(s) ({', '.join(f'{x:g}' for x in p.lrs)}), one seed, {p.steps} steps each, the STS-B dev "
             "Spearman at the end; the search phase alone, each way in a fresh process (raysent's: Ray's start "
             "included).", "",
             "| way | wall s | configurations / h | best lr | best dev | trials at once | per GPU | compile | CUDA graphs "
             "| attention | GPU util % |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | :---: | :---: | --- | ---: |"]
    for way, label in SEARCH_WAYS.items():
        w = p.ways.get(way)
        if w is None:
            continue
        if w.same_as:
            lines.append(f"| {label} | as {w.same_as} | | | | | | | | | |")
            continue
        lines.append(f"| {label} | {_f(w.wall_seconds, '.1f')} | {_f(w.configurations_per_hour, '.0f')} | "
                     f"{_f(w.best_lr, 'g')} | {_f(w.best_dev_spearman, '.2f')} | {w.trials_at_once or '—'} | "
                     f"{'—' if w.trials_per_gpu is None else w.trials_per_gpu} | {w.compile} | {w.cuda_graphs} | "
                     f"{w.attention or '—'} | {_f(w.gpu_util_mean_percent, '.0f')} |")
    lines.append("")
    notes = [f"* {way}: {w.note}" for way, w in p.ways.items() if w.note]
    ratios = {"defaults_vs_one_per_gpu": "configurations per hour, raysent's defaults ÷ one trial per GPU",
              "st_vs_raysent_wall": "wall time, sentence-transformers ÷ raysent on its defaults"}
    notes += [f"* {text}: {p.ratios[k]:.2f}×" for k, text in ratios.items() if k in p.ratios]
    return lines + (notes + [""] if notes else [])
