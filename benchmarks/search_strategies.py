"""Which search, and how much of it: `python benchmarks/search_strategies.py [benchmarks/search_strategies.yaml]`.

Runs every (method, strategy, repeat) of the study file as a search of its own (`raysent tune`, search phase only;
its summary.json holds its budget curve, raysent.report.budget), then the final phase of every configuration the
searches of a method picked (once per configuration, on the final seeds, the 7 STS test sets), and writes the report
(docs/search-strategies.md, its plots beside it, and results/search-strategies/study.json).

    --dry-run       every search with its runs and estimated minutes (the cost model of the file's `estimate`), the
                    total, what each reads; checks every config; trains nothing
    --report-only   the report from the records there are
    --only M,...    some methods; --strategies S,...; --repeats 0,1 (the others are left as they are)
    --results-dir   another results folder (a smoke run: --results-dir /tmp/ss --report /tmp/ss/report.md)

Resumable: a search whose summary.json exists is kept, one with a state.json but no summary goes on
(`raysent tune --resume`), a final phase that is done is kept. The report states only what the records show: it
computes every number from them and says where the evidence is too thin to separate two strategies.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from raysent.config import ExperimentConfig, read_yaml, with_overrides
from raysent.errors import ConfigError, Interrupted
from raysent.tune.cost import Estimate, estimate_seconds, run_steps
from raysent.tune.suite import SuiteConfig, SuiteEntry, arm_config, sources

LIKELY_SHARE = 0.67  # the share of steps an early-stopping search trains, for the dry run's likely figure
ENV = "RAYSENT_DATA_DIR=../shared/data RAYSENT_MODEL_DIR=../shared/models"
HIT = 0.5  # dev points (×100): a search "found" the best when its pick is within this of the best any search found


# --------------------------------------------------------------------------- the study file
class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Method(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
    config: str = Field(description="experiment YAML, relative to the study file")
    set: dict[str, Any] = Field(default_factory=dict)
    space: dict[str, Any] = Field(default_factory=dict)
    label: str | None = None
    run: bool = Field(True, description="false: planned by --dry-run (its cost shown), run only when --only names it")


class Strategy(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
    label: str
    set: dict[str, Any] = Field(default_factory=dict, description="search.algorithm, .scheduler, .pruner, ...")


class Study(_Strict):
    name: str
    description: str = ""
    results_dir: str = "results/search-strategies"
    report: str = "docs/search-strategies.md"
    repeats: list[int] = Field(min_length=1)
    final_seeds: list[int] = Field(min_length=1)
    set: dict[str, Any] = Field(default_factory=dict)
    strategies: list[Strategy] = Field(min_length=1)
    methods: list[Method] = Field(min_length=1)
    estimate: Estimate = Field(default_factory=Estimate)


def load_study(path: Path) -> Study:
    raw, _ = read_yaml(path, "a search-strategies study file")
    try:
        study = Study(**(raw or {}))
    except ValidationError as exc:
        e = exc.errors()[0]
        where = ".".join(map(str, e["loc"]))
        raise ConfigError(f"{path}: field {where}: {e['msg']} (got {e.get('input')!r})") from None
    for what, names in (("strategies", [s.name for s in study.strategies]),
                        ("methods", [m.name for m in study.methods])):
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ConfigError(f"{path}: {what}: names must be unique, repeated: {', '.join(dup)}")
    return study


class Selection(_Strict):
    methods: list[str] | None = None
    strategies: list[str] | None = None
    repeats: list[int] | None = None
    results_dir: str | None = None


def _pick(items, names, what, path):
    if not names:
        return list(items)
    have = [getattr(i, "name", i) for i in items]
    unknown = [n for n in names if n not in have]
    if unknown:
        raise ConfigError(f"{path}: no {what} {', '.join(map(str, unknown))}; the file has {', '.join(map(str, have))}")
    return [i for i in items if getattr(i, "name", i) in names]


# --------------------------------------------------------------------------- its experiments
def results_dir(study: Study, sel: Selection) -> Path:
    return Path(sel.results_dir or study.results_dir)


def search_name(m: Method, s: Strategy, rep: int) -> str:
    return f"{m.name}-{s.name}-r{rep}"


def search_config(study: Study, path: Path, sel: Selection, m: Method, s: Strategy, rep: int) -> ExperimentConfig:
    """One search: the method's experiment file with the study's, the method's and the strategy's overrides."""
    suite = SuiteConfig(name=study.name, set={**study.set, "seeds": study.final_seeds,
                                               "tracking.results_dir": str(results_dir(study, sel))},
                        estimate=study.estimate, experiments=[])
    entry = SuiteEntry(name=search_name(m, s, rep), config=m.config, arms=["searched"], space=m.space,
                       set={**m.set, **s.set, "search.seed": rep})
    cfg = arm_config(suite, entry, "searched", path.parent)
    return with_overrides(cfg, {"name": search_name(m, s, rep)})


def final_config(study: Study, path: Path, sel: Selection, m: Method, hp: dict, cid: str) -> ExperimentConfig:
    """The final phase of one picked configuration ``hp`` of method ``m``, on the final seeds."""
    base = search_config(study, path, sel, m, study.strategies[0], study.repeats[0])
    return with_overrides(base, {**hp, "name": f"{m.name}-final-{cid}"})


def searches(study: Study, path: Path, sel: Selection, everything: bool = False):
    methods = _pick(study.methods, sel.methods, "method", path)
    for m in methods if (sel.methods or everything) else [m for m in methods if m.run]:
        for rep in _pick(study.repeats, sel.repeats, "repeat", path):
            for s in _pick(study.strategies, sel.strategies, "strategy", path):
                yield m, s, rep, search_config(study, path, sel, m, s, rep)


def _exp(cfg: ExperimentConfig) -> Path:
    return Path(cfg.tracking.results_dir) / cfg.name


def search_status(cfg: ExperimentConfig) -> str:
    exp = _exp(cfg)
    return "done" if (exp / "summary.json").is_file() else "started" if (exp / "state.json").is_file() else "new"


def final_status(cfg: ExperimentConfig) -> str:
    state = _exp(cfg) / "state.json"
    if not state.is_file():
        return "new"
    return "done" if json.loads(state.read_text()).get("phase") == "done" else "started"


# --------------------------------------------------------------------------- the dry run
def _search_seconds(cfg: ExperimentConfig, est: Estimate) -> float:
    """The search phase by the suite's cost model: a searched arm's time less its final phase."""
    return (estimate_seconds(cfg, "searched", est)["seconds"] - estimate_seconds(cfg, "paper", est)["seconds"]
            + est.phase_overhead_seconds)


def plan(path: Path, sel: Selection) -> dict:
    study = load_study(path)
    rows, reads, total, finals, likely, optional = [], {}, 0.0, 0.0, 0.0, {}
    per_method: dict[str, float] = {}
    runs = {m.name for m, *_ in searches(study, path, sel)}
    for m, _s, _rep, cfg in searches(study, path, sel, everything=True):
        if m.name not in runs:  # a method the study does not run unless --only names it: its cost, apart
            optional[m.name] = optional.get(m.name, 0.0) + _search_seconds(cfg, study.estimate)
            continue
        reads.update(sources(cfg))
        seconds = _search_seconds(cfg, study.estimate)
        total += seconds
        final = with_overrides(cfg, {"name": f"{m.name}-final"})
        per_method[m.name] = estimate_seconds(final, "paper", study.estimate)["seconds"]
        finals += per_method[m.name]
        st = cfg.search
        assert st is not None
        early = "asha" if st.scheduler else "wilcoxon" if st.pruner else None
        likely += seconds * (LIKELY_SHARE if early else 1.0)
        rows.append({"search": cfg.name, "status": search_status(cfg), "algorithm": st.algorithm,
                     "early stopping": early, "configurations": st.num_samples, "seeds": st.seeds,
                     "runs": st.num_samples * st.seeds, "steps per run": run_steps(cfg, study.estimate),
                     "estimated minutes": round(seconds / 60, 1) if not early else f"<= {seconds / 60:.1f}"})
    n_searches = len(rows)
    fewest = sum(per_method.values())  # every search of a method picks the same configuration
    return {"study": study.name, "file": str(path), "results": str(results_dir(study, sel)), "searches": rows,
            "search phase hours (upper bound: early stopping trains less)": round(total / 3600, 2),
            "final phases": f"one per distinct configuration the searches of a method pick: between "
                            f"{len(per_method)} and {n_searches}, {fewest / 60:.0f} to {finals / 60:.0f} min",
            "estimated wall hours": f"{(total + fewest) / 3600:.2f} to {(total + finals) / 3600:.2f}",
            "likely wall hours": f"{(likely + (fewest + finals) / 2) / 3600:.2f} (early stopping training "
                                 f"{LIKELY_SHARE:.0%} of the steps, as ASHA did in docs/early-stopping.md; half of "
                                 "the final phases)",
            **({"not run (run: false; --only NAME adds it)": {k: f"+{v / 3600:.2f} h of searches"
                                                               for k, v in optional.items()}} if optional else {}),
            "estimate from": f"{path}: estimate ({study.estimate.device})",
            "downloads": sorted(k for k, v in reads.items() if v.startswith("download")),
            "missing": sorted(k for k, v in reads.items() if v.startswith("missing"))}


# --------------------------------------------------------------------------- running
def run(path: Path, sel: Selection, say=print, out: Path | None = None) -> dict:
    study = load_study(path)
    started = time.time()
    todo = list(searches(study, path, sel))
    for i, (m, s, rep, cfg) in enumerate(todo, 1):
        st = search_status(cfg)
        if st == "done":
            say(f"[{i}/{len(todo)}] {cfg.name}: done before, kept")
            continue
        say(f"[{i}/{len(todo)}] {cfg.name}: {s.label}, repeat {rep} ({time.time() - started:.0f} s into the study)")
        _run_phase(study, path, cfg, resumed=st == "started", search_only=True)
        if i == len(todo) or todo[i][0].name != m.name:  # a method's searches are done: its final phases
            run_finals(study, path, sel, m, say)
    rep = report(path, sel, out)
    rep["wall_seconds"] = time.time() - started
    return rep


def picks(study: Study, path: Path, sel: Selection, m: Method) -> dict[str, dict]:
    """The configurations the finished searches of method ``m`` picked: {config_id: hp}."""
    out = {}
    for mm, _, _, cfg in searches(study, path, sel.model_copy(update={"methods": [m.name]})):
        summary = _exp(cfg) / "summary.json"
        if mm.name == m.name and summary.is_file():
            best = json.loads(summary.read_text())["best"]
            out[best["config_id"]] = best["hp"]
    return out


def run_finals(study: Study, path: Path, sel: Selection, m: Method, say=print) -> None:
    for cid, hp in sorted(picks(study, path, sel, m).items()):
        cfg = final_config(study, path, sel, m, hp, cid)
        st = final_status(cfg)
        if st == "done":
            continue
        say(f"{cfg.name}: the final phase of {hp} on seeds {list(cfg.seeds)}")
        _run_phase(study, path, cfg, resumed=st == "started", final_only=True)


def _run_phase(study: Study, path: Path, cfg, resumed: bool, **phase: bool) -> None:
    """One search (``search_only``) or final phase (``final_only``), quiet; Ctrl-C says how to continue."""
    from raysent.tune.driver import tune_experiment

    try:
        tune_experiment(cfg, resume=resumed, quiet=True, paper_arm=False, source=f"{path} ({cfg.name})", **phase)
    except (Interrupted, KeyboardInterrupt) as exc:
        raise Interrupted(f"study {study.name} interrupted in {cfg.name} ({exc or 'Ctrl-C'}); the same command "
                          "continues it: finished searches and phases are kept, this one goes on from its saved "
                          "state") from None


# --------------------------------------------------------------------------- the report
def _finished_scores(exp: Path) -> dict[str, float]:
    """Each configuration's seed-mean best dev over the seeds that finished (runs/; stopped ones are partial)."""
    groups: dict[str, list[float]] = {}
    for p in sorted((exp / "runs").glob("search-*.json")):
        r = json.loads(p.read_text())
        groups.setdefault(r["config_id"], []).append(r["best_dev_spearman"])
    return {c: float(np.mean(v)) for c, v in groups.items()}


def collect(study: Study, path: Path, sel: Selection) -> dict:
    """Every finished search's numbers, and each method's best configuration any search found."""
    from raysent.report.budget import BudgetCurve

    rows: list[dict] = []
    for m, s, rep, cfg in searches(study, path, sel):
        exp = _exp(cfg)
        if not (exp / "summary.json").is_file():
            continue
        summary = json.loads((exp / "summary.json").read_text())
        if not summary.get("budget"):
            continue
        curve = BudgetCurve.model_validate(summary["budget"])
        best = summary["best"]
        final = final_config(study, path, sel, m, best["hp"], best["config_id"])
        fsum = _exp(final) / "summary.json"
        avg = json.loads(fsum.read_text()).get("final", {}).get("scores", {}).get("sts/avg") if fsum.is_file() else None
        rows.append({"method": m.name, "strategy": s.name, "repeat": rep, "search": cfg.name, "curve": curve,
                     "pick": best["config_id"], "pick_hp": best["hp"], "pick_dev": best["dev_mean"],
                     "finished": _finished_scores(exp), "steps": curve.steps_total, "final": avg,
                     "stopped": curve.stopped_configurations, "wall": summary.get("wall_seconds")})
    best_found = {}
    for m in study.methods:
        scores = [v for r in rows if r["method"] == m.name for v in r["finished"].values()]
        if scores:
            best_found[m.name] = max(scores)
    return {"rows": rows, "best": best_found}


def observed_at_steps(curve, budget: float) -> float | None:
    """The best score a search had seen once it had spent ``budget`` optimizer steps (configurations in the order
    they finished; None before its first configuration finished)."""
    if not curve.steps:
        return None
    spent, best = 0, None
    for score, steps in zip(curve.scores, curve.steps):
        spent += steps
        if spent > budget:
            break
        best = score if best is None else max(best, score)
    return best


def paired_test(a: list[float], b: list[float]) -> float | None:
    """Two-sided Wilcoxon signed-rank p of paired values (None when every difference is 0 or too few pairs)."""
    from scipy import stats

    d = np.asarray(a) - np.asarray(b)
    if len(d) < 2 or not np.any(d != 0):
        return None
    return float(stats.wilcoxon(d, zero_method="zsplit").pvalue)


def _fmt(x, digits=2, signed=False) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "—"
    return f"{x:+.{digits}f}" if signed else f"{x:.{digits}f}"


def report(path: Path, sel: Selection | None = None, out: Path | None = None) -> dict:
    """docs/search-strategies.md (or ``out``), its plots beside it, and <results>/study.json, from the records."""
    sel = sel or Selection()
    study = load_study(path)
    data = collect(study, path, sel)
    doc = Path(out) if out else Path(study.report)
    text, plots = render(study, path, sel, data, doc)
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(text)
    if data["rows"]:  # every number the page shows, per search
        res = results_dir(study, sel)
        flat = [{k: (v.model_dump() if k == "curve" else v) for k, v in r.items()} for r in data["rows"]]
        (res / "study.json").write_text(json.dumps({"best_found": data["best"], "searches": flat}, indent=2))
    return {"report": str(doc), "plots": [str(p) for p in plots], "searches": len(data["rows"])}


def render(study: Study, path: Path, sel: Selection, data: dict, doc: Path) -> tuple[str, list[Path]]:
    rows, best = data["rows"], data["best"]
    strategies = {s.name: s for s in study.strategies}
    labels = {s.name: s.label for s in study.strategies}
    n_conf = study.set.get("search.num_samples", "?")
    p = plan(path, sel)
    ran = [m for m in study.methods if m.run or (sel.methods and m.name in sel.methods)]
    if sel.methods:  # --only: the methods named, whatever the file's `run`
        ran = [m for m in ran if m.name in sel.methods]
    left = [m.name for m in study.methods if m not in ran]
    skipped = [r for r in study.repeats if sel.repeats and r not in sel.repeats]
    if skipped:  # --repeats: the page counts and describes the repeats that ran
        study = study.model_copy(update={"repeats": [r for r in study.repeats if r not in skipped]})
    finished = _repeats_run(ran, rows)
    lines = [
        "# Which search, and how much of it: search strategies measured", "",
        "<!-- generated by benchmarks/search_strategies.py from the records under "
        f"{study.results_dir}/; edit the generator, not this page -->", "",
        "The question of issue 48: would more trials have helped, and which search to run for a budget. "
        "Every search below reports its **budget curve** (the expected best dev score of n of its configurations, "
        "[docs/search.md](search.md#budget-curves)); this page runs the search strategies raysent offers on the mini "
        "suite's setting and compares them at equal budgets.", "",
        "```bash",
        f"{ENV} python benchmarks/search_strategies.py --dry-run",
        "```", "",
        "<!-- doctest: skip (the study itself: about 3 hours of two cores; its records are committed) -->",
        "```bash",
        f"{ENV} python benchmarks/search_strategies.py",
        "```", "",
        "## Setup", "",
        f"`{path.as_posix()}`: the methods {', '.join(m.name for m in ran)} from `raw-bert-mini-mlm`, "
        f"{study.set.get('train.max_steps')} optimizer steps per run (ConSERT joint-unsup: per stage), batch "
        f"{study.set.get('train.batch_size')}, STS-B dev every {study.set.get('train.eval_every')} steps, the best "
        f"checkpoint kept; each search tries {n_conf} configurations of the mini suite's space, each on "
        f"{study.set.get('search.seeds')} seeds (its score: the mean of their best dev), two trials at a time; every "
        f"search is repeated with sampler seeds {study.repeats} (`search.seed`); the configuration each search picks "
        f"runs on seeds {study.final_seeds} and is evaluated on the 7 STS test sets (once per method and "
        "configuration: searches that pick the same one share it)."
        + (f" In the file but not run (`run: false`, for the time: `--dry-run` gives its cost): {', '.join(left)}."
           if left else "")
        + (f" Repeats of the file not run, for the time (`--repeats`): {skipped}." if skipped else "")
        + "".join(f" {m}: {'repeat' if len(reps) == 1 else 'repeats'} {reps} only, for the time (the same command "
                  "continues it)." for m, reps in finished.items() if reps != study.repeats)
        + "".join(f" {m.name}: no search finished yet." for m in ran
                  if rows and m.name not in finished), "",
        "| strategy | search.algorithm | early stopping | other settings |", "| --- | --- | --- | --- |"]
    for s in study.strategies:
        st = s.set
        stop = ("ASHA on the seed mean " + json.dumps(st["search.scheduler"]) if "search.scheduler" in st else
                "Wilcoxon (Optuna's WilcoxonPruner) " + json.dumps(st["search.pruner"]) if "search.pruner" in st
                else "none")
        other = ", ".join(f"{k} {v}" for k, v in st.items() if k not in ("search.algorithm", "search.scheduler",
                                                                            "search.pruner")) or "—"
        lines.append(f"| {s.label} | `{st.get('search.algorithm')}` | {stop} | {other} |")
    lines += ["", "The random-sampler strategies of one repeat propose the same configurations in the same order, so "
              "random, random + ASHA and random + Wilcoxon differ only in what their early stopping stopped. TPE and "
              "GP draw their first `search.n_startup_trials` configurations with the same random sampler, then choose.",
              "", f"`--dry-run` (the cost model of the file's `estimate`, measured here; early stopping trains less): "
              f"{len(p['searches'])} "
              f"searches, search phases at most {p['search phase hours (upper bound: early stopping trains less)']} h, "
              f"{p['final phases']}; **{p['estimated wall hours']} hours** in all, likely "
              f"{p['likely wall hours'].replace(' (', ' h (', 1)}.", ""]
    lines += what_it_can_show(study, ran, rows)
    if not rows:
        lines += ["## Results", "", "Not run yet: no search of this study has finished under "
                  f"`{results_dir(study, sel)}/`. Run the commands above; this page is then written from the records.",
                  ""]
        return "\n".join(lines), []
    plots = plot_curves(study, rows, doc)
    lines += results_sections(study, rows, best, labels, strategies, plots, doc)
    return "\n".join(lines), plots


def _repeats_run(methods: list[Method], rows: list[dict]) -> dict[str, list[int]]:
    """The repeats with a finished search, per method that has any."""
    out = {m.name: sorted({r["repeat"] for r in rows if r["method"] == m.name}) for m in methods}
    return {m: reps for m, reps in out.items() if reps}


def what_it_can_show(study: Study, methods: list[Method], rows: list[dict] | None = None) -> list[str]:
    """What the size can show: counted from the finished searches where there are any, else from the plan."""
    reps = _repeats_run(methods, rows or []) or {m.name: list(study.repeats) for m in methods}
    units = sum(len(r) for r in reps.values())
    most = max(len(r) for r in reps.values()) if reps else 0
    shape = (f"{len(reps)} methods × {len(study.repeats)} repeats" if all(len(r) == len(study.repeats)
             for r in reps.values()) else " + ".join(f"{m} {len(r)}" for m, r in reps.items()))
    p_min = 2 / 2 ** units if units else float("nan")
    return ["## What this size can show, and what it cannot", "",
            f"- Each strategy has {units} searches ({shape}); two "
            f"strategies are compared paired over those {units} (same method, same sampler seed) with Wilcoxon's "
            f"signed-rank test, whose smallest two-sided p over {units} pairs is {p_min:.3g}"
            + (f" (so only a difference in the same direction in all {units} pairs reaches p < 0.05)"
               if p_min < 0.05 <= 2 / 2 ** (units - 1) else "")
            + ". A difference is called only where p < 0.05; everywhere else the page says the evidence is too thin.",
            f"- Within one method there are at most {most} repeats: no per-method difference can reach p < 0.05 "
            f"(the smallest p over {most} pairs is {2 / 2 ** most:.3g}); per-method rows are descriptive.",
            f"- {study.set.get('search.num_samples')} configurations per search: the budget curves stop there; what "
            "happens beyond (the regime of 20-50 trials where TPE and GP are usually said to pay off) is not measured.",
            "- One model (4 layers), one budget of 40 steps, one dev set: a strategy that wins here may lose on "
            "BERT-base with thousands of steps, where the landscape over lr is different.",
            *([f"- TPE and GP draw their first {startup} configurations at random (`search.n_startup_trials`), so "
               f"they choose only {n - startup} of {n}: a small-budget comparison by construction."]
              if (startup := _startup(study)) is not None and isinstance(n := study.set.get("search.num_samples"), int)
              else []),
            f"- Wilcoxon pruning pairs {study.set.get('search.seeds')} seeds × the evaluations before a run's last: "
            "its p cannot fall below 1/2^pairs, so it can stop a configuration only from the round where that bound is "
            "below its p_threshold (search.md, the refused combinations).",
            "- \"Found the best\" means within 0.5 dev points of the best configuration any search of the method "
            "found, which is itself a sample: a configuration no search tried may be better.", ""]


def _startup(study: Study) -> int | None:
    values = {s.set.get("search.n_startup_trials") for s in study.strategies
              if s.set.get("search.algorithm") in ("optuna-tpe", "optuna-gp")}
    return values.pop() if len(values) == 1 and None not in values else None


def _regret(r, best, n) -> float | None:
    c = r["curve"]
    return None if n > c.configurations else best[r["method"]] - c.observed_best[n - 1]


def results_sections(study, rows, best, labels, strategies, plots, doc) -> list[str]:
    names = [s.name for s in study.strategies if any(r["strategy"] == s.name for r in rows)]
    n_max = max(r["curve"].configurations for r in rows)
    lines = ["## Results", "", f"{len(rows)} searches finished. Best configuration any search found, seed-mean dev "
             "(×100) over the search seeds: " + ", ".join(f"{m} {v:.2f}" for m, v in best.items()) + ".", ""]
    for pth in plots:
        lines += [f"![budget curves: {pth.stem}]({pth.name})", ""]
    # per strategy: steps, found-the-best, final test, pick's dev
    lines += ["### Per strategy (all methods and repeats)", "",
              "| strategy | searches | optimizer steps (mean ± sd) | stopped configurations | pick within 0.5 of the "
              "best | pick's dev (regret vs best, mean) | expected best of n (mean over searches) | curve flattened |",
              "| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: |"]
    shown_n = sorted({1, *(n for n in (2, 4) if n < n_max), n_max})
    for s in names:
        rs = [r for r in rows if r["strategy"] == s]
        steps = [r["steps"] for r in rs if r["steps"] is not None]
        hits = sum(best[r["method"]] - r["pick_dev"] <= HIT for r in rs)
        regret = np.mean([best[r["method"]] - r["pick_dev"] for r in rs])
        ebn = ", ".join(f"n={n}: " + _fmt(float(np.mean([r["curve"].at(n) - best[r["method"]] for r in rs
                                                           if n <= r["curve"].configurations])), 2, True)
                        for n in shown_n)
        flat = sum(bool(r["curve"].flattened) for r in rs)
        sd = float(np.std(steps, ddof=1)) if len(steps) > 1 else 0.0
        lines.append(f"| {labels[s]} | {len(rs)} | {np.mean(steps):,.0f} ± {sd:,.0f} | "
                     f"{sum(r['stopped'] for r in rs)} | {hits}/{len(rs)} | {regret:.2f} | {ebn} | {flat}/{len(rs)} |")
    lines += ["", "Expected best of n: relative to the best any search of the method found (0 is that best). "
              "Flattened: the search's own verdict (its last configuration's expected gain below the seed noise).", ""]
    # per method and strategy
    most = max(len({r["repeat"] for r in rows if r["method"] == m.name}) for m in study.methods
               if any(r["method"] == m.name for r in rows))
    lines += [f"### Per method (descriptive: {most} repeats cannot separate strategies)", "",
              "| method | strategy | picks (config: dev) | steps | final test Avg ± std (seeds) per pick |",
              "| --- | --- | --- | ---: | --- |"]
    for m in study.methods:
        for s in names:
            rs = sorted((r for r in rows if r["method"] == m.name and r["strategy"] == s), key=lambda r: r["repeat"])
            if not rs:
                continue
            pk = "; ".join(f"r{r['repeat']} {r['pick']}: {r['pick_dev']:.2f}" for r in rs)
            fin = "; ".join(f"r{r['repeat']} " + (f"{r['final']['mean']:.2f} ± {r['final']['std']:.2f} "
                                                   f"({r['final']['n']})" if r["final"] else "—") for r in rs)
            lines.append(f"| {m.name} | {labels[s]} | {pk} | {np.mean([r['steps'] for r in rs]):,.0f} | {fin} |")
    lines += [""]
    lines += budget_comparison(names, labels, rows, best, n_max)
    lines += pruning_comparison(names, labels, strategies, rows, best)
    return lines


def budget_comparison(names, labels, rows, best, n_max) -> list[str]:
    """Which strategy at which budget: regret of the observed best after n configurations, paired by (method,
    repeat), and the hit rate; a lead is called only at p < 0.05."""
    lines = ["### Which strategy at which budget", "",
             "Regret after n configurations: the best any search of the method found minus the best this search had "
             "seen after its first n configurations (in the order they finished); hits: searches within 0.5 of the "
             "best.",
             "", "| n | " + " | ".join(labels[s] for s in names) + " | lowest regret | vs the runner-up (paired "
             "Wilcoxon p) | verdict |", "| ---: | " + " | ".join("---:" for _ in names) + " | --- | ---: | --- |"]
    for n in sorted({1, *(k for k in (2, 3, 4, 6, 8) if k < n_max), n_max}):
        per = {}
        for s in names:
            rs = sorted((r for r in rows if r["strategy"] == s), key=lambda r: (r["method"], r["repeat"]))
            per[s] = {(r["method"], r["repeat"]): _regret(r, best, n) for r in rs}
        cells, means = [], {}
        for s in names:
            vals = [v for v in per[s].values() if v is not None]
            hits = sum(v <= HIT for v in vals)
            means[s] = float(np.mean(vals)) if vals else math.inf
            cells.append(f"{means[s]:.2f} ({hits}/{len(vals)})" if vals else "—")
        order = sorted(names, key=lambda s: means[s])
        lead, second = order[0], order[1] if len(order) > 1 else None
        tied = [s for s in names if means[s] == means[lead]]
        p = None
        if second is not None:
            keys = sorted(set(per[lead]) & set(per[second]))
            a = [per[lead][k] for k in keys if per[lead][k] is not None and per[second][k] is not None]
            b = [per[second][k] for k in keys if per[lead][k] is not None and per[second][k] is not None]
            p = paired_test(a, b)
        verdict = (f"{labels[lead]} leads" if p is not None and p < 0.05 and len(tied) == 1 else
                   "too thin to separate the leaders" if second is not None else "")
        leader = labels[lead] if len(tied) == 1 else f"tie ({len(tied)})"
        lines.append(f"| {n} | " + " | ".join(cells) + f" | {leader} | {_fmt(p, 3)} | {verdict} |")
    lines += ["", "Cells: mean regret (dev points ×100) over the searches, (hits/searches). Early-stopping strategies "
              "are compared at equal optimizer steps below: after n configurations they have spent fewer steps.", ""]
    return lines


def pruning_comparison(names, labels, strategies, rows, best) -> list[str]:
    """Early stopping against the same search without it (same sampler and seed: the same configurations)."""
    lines = ["### Early stopping: steps saved and what it picked", ""]
    pairs, saved = [], []  # saved: (strategy, without it, median steps ratio, same picks, searches) for advice
    for s in names:
        st = strategies[s].set
        if "search.scheduler" not in st and "search.pruner" not in st:
            continue
        plain = [b for b in names if "search.scheduler" not in strategies[b].set
                 and "search.pruner" not in strategies[b].set]
        base = next((b for b in plain if strategies[b].set.get("search.algorithm") == st.get("search.algorithm")), None)
        if base is not None:
            pairs.append((s, base))
    if not pairs:
        return lines + ["No early-stopping strategy with a matching strategy without it.", ""] + advice(
            rows, best, labels, strategies, names, saved)
    lines += ["| strategy | vs | searches | steps (its / without, median) | same pick | pick's regret (its − "
              "without, mean) | best seen at equal steps (its − without, mean; paired Wilcoxon p) |",
              "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for s, base in pairs:
        by = {(r["method"], r["repeat"]): r for r in rows if r["strategy"] == base}
        mine = [(r, by[(r["method"], r["repeat"])]) for r in rows
                if r["strategy"] == s and (r["method"], r["repeat"]) in by]
        if not mine:
            continue
        ratio = np.median([a["steps"] / b["steps"] for a, b in mine if a["steps"] and b["steps"]])
        same = sum(a["pick"] == b["pick"] for a, b in mine)
        dregret = np.mean([(best[a["method"]] - a["pick_dev"]) - (best[b["method"]] - b["pick_dev"]) for a, b in mine])
        eq_a, eq_b = [], []
        for a, b in mine:
            budget = a["steps"]  # what the early-stopping search spent: what had the full search seen by then?
            ob = observed_at_steps(b["curve"], budget)
            oa = max(a["curve"].scores) if a["curve"].scores else None
            if oa is not None and ob is not None:
                eq_a.append(oa)
                eq_b.append(ob)
        diff = np.mean(np.array(eq_a) - np.array(eq_b)) if eq_a else None
        p = paired_test(eq_a, eq_b)
        saved.append((s, base, float(ratio), same, len(mine)))
        lines.append(f"| {labels[s]} | {labels[base]} | {len(mine)} | {ratio:.0%} | {same}/{len(mine)} | "
                     f"{dregret:+.2f} | {_fmt(diff, 2, True)} ({_fmt(p, 3)}) |")
    lines += ["", "Same pick: the early-stopping search picked the configuration the search without it picked (both "
              "tried the same ones). At equal steps: the best the early-stopping search saw against the best the full "
              "search had seen after spending as many steps (its configurations in the order they finished). "
              "A difference is called only at p < 0.05; otherwise the evidence is too thin.", ""]
    return lines + advice(rows, best, labels, strategies, names, saved)


def advice(rows, best, labels, strategies, names, saved) -> list[str]:
    """What to run, in plain words, from the numbers above: a lead is a finding only at p < 0.05."""
    n_max = max(r["curve"].configurations for r in rows)
    startup = min((int(strategies[s].set.get("search.n_startup_trials", 0)) for s in names
                   if strategies[s].set.get("search.algorithm") in ("optuna-tpe", "optuna-gp")), default=0)
    at_max = {s: [v for r in rows if r["strategy"] == s and (v := _regret(r, best, n_max)) is not None]
              for s in names}
    order = sorted((s for s in names if at_max[s]), key=lambda s: float(np.mean(at_max[s])))
    if len(order) < 2:
        return ["## What to run, on this evidence", "", "One strategy ran: nothing to compare.", ""]
    lead, runner = order[0], order[1]
    keyed = {s: {(r["method"], r["repeat"]): _regret(r, best, n_max) for r in rows if r["strategy"] == s}
             for s in (lead, runner)}
    keys = sorted(k for k in set(keyed[lead]) & set(keyed[runner])
                  if keyed[lead][k] is not None and keyed[runner][k] is not None)
    p = paired_test([keyed[lead][k] for k in keys], [keyed[runner][k] for k in keys])
    hits = {s: sum(v <= HIT for v in at_max[s]) for s in (lead, runner)}
    lines = ["## What to run, on this evidence", ""]
    if startup:
        lines.append(f"- **Up to {startup} configurations, the sampler does not matter**: TPE and GP draw their first "
                     f"{startup} (`search.n_startup_trials`) with the random sampler, so every strategy without early "
                     "stopping is the same search there (the table's identical rows).")
    found = "a finding" if p is not None and p < 0.05 else "a lead, not a finding"
    lines.append(f"- **At {n_max} configurations**, {labels[lead]} had the lowest mean regret "
                 f"({np.mean(at_max[lead]):.2f} dev points; within {HIT} of the best in {hits[lead]} of "
                 f"{len(at_max[lead])} searches) against "
                 f"{labels[runner]}'s {np.mean(at_max[runner]):.2f} ({hits[runner]} of {len(at_max[runner])}); paired "
                 f"over {len(keys)} searches, p = {_fmt(p, 3)}: {found}. Run {labels[lead]} if you run one of them at "
                 "this budget; the evidence does not say it beats the others.")
    for s, base, ratio, same, n in saved:  # what pruning_comparison measured
        lines.append(f"- **{labels[s]}** trained {ratio:.0%} of {labels[base]}'s optimizer steps (median) and picked "
                     f"the same configuration in {same} of {n} searches: " +
                     (f"where steps are the budget, it saves {1 - ratio:.0%} of them at this size." if ratio <= 0.8 else
                      "at 2 seeds and 40 steps it can stop little (its p-value needs several paired evaluations), so "
                      "it saves little here; it has more to stop with more seeds or evaluations."))
    lines += ["- **Too thin to say**: any ranking of TPE, GP and random beyond the first configurations, anything "
              f"beyond {n_max} configurations (the 10-50 trials where model-based samplers are said to pay off), and "
              "any model other than this 4-layer one at 40 steps. A larger study (`search.num_samples`, more repeats: "
              "`--dry-run` prices it) is what would settle it.", ""]
    return lines


def plot_curves(study: Study, rows: list[dict], doc: Path) -> list[Path]:
    """One PNG per method beside the page: each strategy's budget curve, averaged over its repeats (the band: the
    repeats' bootstrap bands averaged), against configurations and against optimizer steps."""
    from raysent.report.budget import BudgetCurve
    from raysent.report.plots import plot_budget

    out = []
    for m in study.methods:
        curves = []
        for s in study.strategies:
            rs = [r["curve"] for r in rows if r["method"] == m.name and r["strategy"] == s.name]
            if not rs:
                continue
            n = min(c.configurations for c in rs)

            def mean(key: str, rs=rs, n=n) -> list[float]:
                return [float(np.mean([getattr(c, key)[i] for c in rs])) for i in range(n)]

            steps = [float(np.mean([c.steps_per_configuration for c in rs])) * k for k in range(1, n + 1)] \
                if all(c.steps_per_configuration for c in rs) else None
            curves.append((f"{s.label} ({len(rs)} repeats)", BudgetCurve(
                configurations=n, scores=mean("scores"), expected_best=mean("expected_best"),
                band_low=mean("band_low"), band_high=mean("band_high"), observed_best=mean("observed_best"),
                expected_steps=steps, stopped_configurations=sum(c.stopped_configurations for c in rs),
                verdict="", estimator=rs[0].estimator)))
        if curves:
            out.append(plot_budget(curves, doc.parent / f"search-strategies-{m.name}.png",
                                   title=f"{m.name}: expected best dev of n configurations, mean over repeats; "
                                         "dotted: observed best so far"))
    return out


# --------------------------------------------------------------------------- the command
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("study", nargs="?", default="benchmarks/search_strategies.yaml")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--only", help="methods, comma-separated")
    ap.add_argument("--strategies", help="strategies, comma-separated")
    ap.add_argument("--repeats", help="repeats, comma-separated")
    ap.add_argument("--results-dir", help="another results folder (e.g. a smoke run's)")
    ap.add_argument("--report", help="write the report here instead of the file's `report`")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override the study's `set` (YAML value), e.g. --set search.num_samples=2")
    args = ap.parse_args(argv)
    path = Path(args.study)
    sel = Selection(methods=args.only.split(",") if args.only else None,
                    strategies=args.strategies.split(",") if args.strategies else None,
                    repeats=[int(x) for x in args.repeats.split(",")] if args.repeats else None,
                    results_dir=args.results_dir)
    if args.set:
        path = _with_set(path, args.set, Path(args.results_dir or load_study(path).results_dir))
    say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    if args.dry_run:
        print(json.dumps(plan(path, sel), indent=2))
        return 0
    if args.report_only:
        print(json.dumps(report(path, sel, Path(args.report) if args.report else None), indent=2))
        return 0
    print(json.dumps(run(path, sel, say, Path(args.report) if args.report else None), indent=2))
    return 0


def _with_set(path: Path, items: list[str], folder: Path) -> Path:
    """A copy of the study file with ``--set`` applied, written into the results folder (kept with the records)."""
    import yaml

    raw, _ = read_yaml(path, "a search-strategies study file")
    for item in items:
        key, _, value = item.partition("=")
        raw.setdefault("set", {})[key] = yaml.safe_load(value)
    for m in raw.get("methods", []):  # their configs are relative to the original file
        m["config"] = str((path.parent / m["config"]).resolve())
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / path.name
    out.write_text(yaml.safe_dump(raw, sort_keys=False))
    return out


if __name__ == "__main__":
    sys.exit(main())
