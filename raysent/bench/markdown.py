"""The markdown summary of a bench run (``results/bench/<date>-<time>.md``, and what `raysent bench` prints):
one function per section, each empty where its part did not run."""

from __future__ import annotations

from collections.abc import Callable

from raysent.bench.result import BenchResult, CpuShare, Target


def format_markdown(result: BenchResult) -> str:
    sections: list[Callable[[BenchResult], list[str]]] = [
        _header, _targets, _not_measured, _training, _speedups, _evaluation, _overhead, _gpu]
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
            ratio("SG-OPT steps/s, cached BERT_F views ÷ not cached", t.sg_opt_cached_views), ""]


def _not_measured(r: BenchResult) -> list[str]:
    if not r.failed and not r.interrupted:
        return []
    lines = ["## Not measured", ""]
    if r.interrupted:
        lines.append(f"* interrupted (Ctrl-C) during `{r.interrupted}`; the parts after it did not run")
    for part, error in r.failed.items():
        last = (error.strip().splitlines() or [""])[-1][:300]  # a worker's error ends its traceback
        lines.append(f"* `{part}` failed ({'what it measured before is below; ' if r.measured(part) else ''}"
                     f"the whole error is in the .json): {last}")
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
                     f"{c.peak_rss_mib:.0f} | {tr.steps_per_second_vs_st_mnrl[name]:.2f} |")
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


def _gpu(r: BenchResult) -> list[str]:
    g = r.gpu
    if g is None:
        return []
    if g.skipped:
        return ["## GPU", "", f"Skipped: {g.skipped}.", ""]
    lines = ["## GPU", "", f"{g.device}, bf16 peak {_f(g.peak_bf16_tflops, '.0f', ' TFLOP/s')}.", "",
             "| case | steps/s | sentences/s | GPU peak (MiB) | model TFLOP/s | MFU |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for label, c in g.cases.items():
        lines.append(f"| {label} | {c.steps_per_second:.2f} | {c.sentences_per_second:.0f} | "
                     f"{_f(c.cuda_peak_mib, '.0f')} | {_f(c.model_tflops, '.1f')} | "
                     f"{_f(c.mfu * 100 if c.mfu is not None else None, '.1f', ' %')} |")
    return [*lines, ""]
