"""`raysent suite`: a benchmark of several methods, each with the paper's defaults and searched.

A suite file (``benchmarks/mini.yaml``) lists experiments: an experiment YAML of ``search_spaces/``
and the overrides that scale it to the suite's budget. Every entry has up to two arms:

``paper``
    the configuration as given (the paper's defaults at the suite's budget), the final phase only,
    on the suite's seeds: ``raysent tune --final-only``;
``searched``
    the entry's search space searched with Optuna, then its best configuration on the same seeds.

Arms run one after another as experiments named ``<suite>-<entry>-<arm>`` under the same results
folder, each one exactly as ``raysent tune`` runs it (run records, MLflow, resume). ``--resume``
continues an interrupted suite: finished experiments are skipped, an interrupted one continues where
it stopped (``raysent tune --resume``). At the end the suite writes its combined table (every
arm, with the papers' rows beside it) and the searched-vs-paper comparison of every entry (paired
over the seeds: mean Δ, t-test, Wilcoxon) to ``results/<suite>/``.

The time estimate of ``--dry-run`` is the suite's own cost model (``estimate`` in the file): seconds
per optimizer step of each method, per dev evaluation, per test evaluation and per run, as measured
on the machine the suite was written for.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from raysent.config import ExperimentConfig, Name, load_config, parse_config, read_yaml, with_overrides
from raysent.data.datasets import DATASETS, STS_TASKS, local_files, parse_spec
from raysent.errors import ConfigError, Interrupted, RaysentError
from raysent.methods.spec import get_spec
from raysent.models.locate import resolve_model
from raysent.report.compare import ComparisonResult, Side, compare
from raysent.report.published import default_file as default_published_file
from raysent.report.runs import Run, load_experiment
from raysent.tune.cost import Estimate, estimate_seconds
from raysent.tune.driver import experiment_dir, tune_experiment
from raysent.tune.state import SearchState

# Lazy imports: raysent's heavier modules (heavy, and only the functions that need them import them).

Arm = Literal["paper", "searched"]
ARMS: tuple[Arm, ...] = ("paper", "searched")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class SuiteEntry(_Strict):
    name: Name = Field(description="names <suite>-<name>-<arm> (raysent.config.NAME_RULE)")
    config: str = Field(description="experiment YAML, relative to the suite file")
    set: dict[str, Any] = Field(default_factory=dict, description="overrides (as --set) after the suite's own")
    space: dict[str, Any] = Field(default_factory=dict, description="search-space entries added or replaced "
                                  "(null removes one)")
    arms: list[Arm] = Field(default_factory=lambda: list(ARMS))
    label: str | None = Field(None, description="the row's name in the tables (default: the entry's name)")


class SuiteConfig(_Strict):
    name: Name
    description: str = ""
    set: dict[str, Any] = Field(default_factory=dict, description="overrides of every experiment")
    estimate: Estimate = Field(default_factory=Estimate)
    experiments: list[SuiteEntry]


class EntryComparison(BaseModel):
    """One entry's searched arm against its paper arm (:func:`raysent.report.compare.compare`), as compare.json
    holds it."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    experiment: str  # the suite entry's name
    label: str
    result: ComparisonResult

    def to_json(self) -> dict[str, Any]:
        return {"experiment": self.experiment, "label": self.label, **self.result.to_json()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> EntryComparison:
        """An entry of compare.json."""
        rest = {k: v for k, v in data.items() if k not in ("experiment", "label")}
        return cls(experiment=data["experiment"], label=data["label"], result=ComparisonResult.from_json(rest))


def load_suite(path: str | Path) -> SuiteConfig:
    path = Path(path)
    raw, _ = read_yaml(path, "a suite YAML file")
    if isinstance(raw, dict) and "experiments" not in raw and ("method" in raw or "model" in raw):
        raise ConfigError(f"{path}: is an experiment file (it has {'method' if 'method' in raw else 'model'}:), not a "
                          "suite file (a suite, like benchmarks/mini.yaml, lists experiment files under "
                          f"'experiments'). Run this experiment with: raysent tune {path}")
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: a suite file is a mapping with name, set, estimate and experiments")
    try:
        suite = SuiteConfig(**raw)
    except ValidationError as exc:
        e = exc.errors()[0]
        where = ".".join(str(p) for p in e["loc"])
        raise ConfigError(f"{path}: field {where}: {e['msg']} (got {e.get('input')!r})") from None
    names = [e.name for e in suite.experiments]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ConfigError(f"{path}: experiments: names must be unique, repeated: {', '.join(dup)}")
    return suite


def arm_name(suite: SuiteConfig, entry: SuiteEntry, arm: str) -> str:
    return f"{suite.name}-{entry.name}-{arm}"


def arm_config(suite: SuiteConfig, entry: SuiteEntry, arm: str, base: Path) -> ExperimentConfig:
    """The experiment one arm runs: the entry's YAML with the suite's and the entry's overrides."""
    src = (base / entry.config) if not Path(entry.config).is_absolute() else Path(entry.config)
    where = f"{base / 'suite'}: experiment {entry.name!r}"
    try:
        cfg = load_config(src)
        cfg = with_overrides(cfg, {**suite.set, **entry.set, "name": arm_name(suite, entry, arm)})
        if entry.space:
            raw = cfg.to_dict()
            if raw.get("search") is None:
                raise ConfigError(f"{src}: has no search part to add 'space' entries to")
            space = raw["search"]["space"]
            for key, value in entry.space.items():
                if value is None:
                    space.pop(key, None)
                else:
                    space[key] = value
            cfg = parse_config(raw, source=str(src))
    except RaysentError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    if arm == "searched" and cfg.search is None:
        raise ConfigError(f"{where}: arm 'searched' needs a search part in {src}")
    return cfg


def arms(suite: SuiteConfig, base: Path,
         only: list[str] | None = None) -> list[tuple[SuiteEntry, str, ExperimentConfig]]:
    if only:
        unknown = sorted(set(only) - {e.name for e in suite.experiments})
        if unknown:
            raise ConfigError(f"--only {','.join(unknown)}: not in the suite; its experiments: "
                              f"{', '.join(e.name for e in suite.experiments)}")
    return [(e, a, arm_config(suite, e, a, base)) for e in suite.experiments if not only or e.name in only
            for a in e.arms]


# --------------------------------------------------------------------------- what a run reads
def sources(cfg: ExperimentConfig) -> dict[str, str]:
    """Every model and data split an experiment reads, and where from: a local path, or the hub (a download)."""
    out: dict[str, str] = {}
    path, _ = resolve_model(cfg.model.name)
    out[f"model {cfg.model.name}"] = (f"local: {path}" if path != cfg.model.name or Path(path).is_dir()
                                      else f"download: Hugging Face hub {cfg.model.name}")
    method = get_spec(cfg.method)
    specs = [cfg.data.train or next(iter(method.data_defaults.values()), None), cfg.data.sup, *cfg.data.dev,
             *(cfg.eval.sts_sets or STS_TASKS)]
    for spec in filter(None, specs):
        name, splits = parse_spec(spec)
        if name == "path":
            out[f"data {spec}"] = f"local: {splits[0]}"
            continue
        if name in ("sts-unlabeled", "stsb-unlabeled"):  # built from the STS sets' text
            base = ["stsb:train", "stsb:dev", "stsb:test"] + ([] if name == "stsb-unlabeled" else [
                *STS_TASKS[:5], "sickr:train", "sickr:dev", "sickr:test"])
            specs.extend(base)
            out[f"data {spec}"] = "built from the STS sets below (transductive)"
            continue
        decl = DATASETS[name]
        for split in splits:
            files = local_files(decl, split)
            hub = decl.hub.get(split)
            sample = files and decl.local_notes.get(split) and not (
                name == "wiki1m" and files[0].name == "wiki1m_for_simcse.txt")
            out[f"data {name}:{split}"] = (f"local: {', '.join(str(f) for f in files)}"
                                           + (" (a local stand-in, not the paper's full set: see `raysent data`)"
                                              if sample else "") if files else
                                           f"download: Hugging Face hub {hub.where()}"
                                           if hub else "missing: not local and not on the hub")
    return out


# --------------------------------------------------------------------------- running
def status(cfg: ExperimentConfig) -> str:
    """'done', 'started' or 'new' for one arm's experiment folder."""
    state = SearchState.load(experiment_dir(cfg))
    if state is None:
        return "new"
    return "done" if state.phase == "done" else "started"


def plan(path: str | Path, only: list[str] | None = None) -> dict:
    path = Path(path)
    suite = load_suite(path)
    rows, total, gpu, reads = [], 0.0, 0.0, {}
    for _entry, arm, cfg in arms(suite, path.parent, only):
        reads.update(sources(cfg))
        e = estimate_seconds(cfg, arm, suite.estimate)
        total += e["seconds"]
        gpu += e["gpu_seconds"]
        rows.append({"experiment": cfg.name, "method": cfg.method, "arm": arm, "status": status(cfg),
                     "search runs": e["search_runs"], "final runs": e["final_runs"],
                     "final runs that evaluate a search run": e["final_runs_reused"],
                     "steps per run": e["steps_per_run"], "batch": cfg.train.batch_size,
                     "estimated wall minutes": round(e["seconds"] / 60, 1),
                     **({"searched": sorted(cfg.search.space)} if arm == "searched" and cfg.search else {})})
    return {"suite": suite.name, "file": str(path), "experiments": rows,
            "runs": sum(r["search runs"] + r["final runs"] for r in rows),
            "estimated wall hours": round(total / 3600, 2),
            **({"estimated GPU-hours": round(gpu / 3600, 1)} if gpu else {}),
            "estimate from": f"{path}: estimate ({suite.estimate.device})",
            "downloads": sorted(f"{k}: {v.split(': ', 1)[1]}" for k, v in reads.items() if v.startswith("download")),
            "missing": sorted(k for k, v in reads.items() if v.startswith("missing")),
            "local": sorted(k for k, v in reads.items() if v.startswith("local")),
            "local stand-ins": sorted(k for k, v in reads.items() if v.startswith("local") and "stand-in" in v)}


def run_suite(path: str | Path, resume: bool = False, only: list[str] | None = None, say=print) -> dict:
    """Every arm in order (finished ones skipped with ``resume``), then the table and the comparisons."""
    path = Path(path)
    suite = load_suite(path)
    todo = arms(suite, path.parent, only)
    started = [c.name for _, _, c in todo if status(c) != "new"]
    if started and not resume:
        raise RaysentError(f"suite {suite.name}: {len(started)} experiment(s) already have results "
                           f"({', '.join(started[:3])}{', ...' if len(started) > 3 else ''}); "
                           "`raysent suite FILE --resume` continues the suite (finished experiments are kept)")
    t0 = time.time()
    done = []
    for i, (entry, arm, cfg) in enumerate(todo, 1):
        st = status(cfg)
        if st == "done":
            say(f"[{i}/{len(todo)}] {cfg.name}: finished before, kept")
            done.append(cfg.name)
            continue
        say(f"[{i}/{len(todo)}] {cfg.name}: {entry.name} with the "
            + ("paper's defaults" if arm == "paper" or cfg.search is None
               else f"search over {', '.join(sorted(cfg.search.space))}")
            + f" ({time.time() - t0:.0f} s into the suite)")
        a = time.time()
        try:
            # the suite's own paper arm is the comparison: the searched arm runs no second paper final phase
            tune_experiment(cfg, resume=st == "started", final_only=arm == "paper", quiet=True,
                            source=f"{path} ({entry.name}, {arm})", paper_arm=False)
        except (Interrupted, KeyboardInterrupt) as exc:
            raise Interrupted(f"suite {suite.name} interrupted in {cfg.name} after {len(done)} of {len(todo)} "
                              f"experiment(s) ({exc or 'Ctrl-C'}); `raysent suite {path} --resume` continues it: "
                              "finished experiments are kept, this one goes on from its saved state") from None
        say(f"[{i}/{len(todo)}] {cfg.name}: done in {time.time() - a:.0f} s, results in {experiment_dir(cfg)}")
        done.append(cfg.name)
    results_dir = Path(todo[0][2].tracking.results_dir) if todo else Path("results")
    report = write_report(suite, path, results_dir)
    report["wall_seconds"] = time.time() - t0
    return report


def write_report(suite: SuiteConfig, path: Path, results_dir: Path) -> dict:
    """The suite's tables and its searched-vs-paper comparisons, in results/<suite>/: ``table.*`` (every arm,
    full labels, the papers' rows), ``summary.md`` (one line per method and arm, then the papers' rows),
    ``compare.{md,json}`` and ``headline.md`` (one line per method: both arms' Avg, Δ, p and whether each
    learned; the README's table)."""
    from raysent.report.table import build_table

    out = results_dir / suite.name
    out.mkdir(parents=True, exist_ok=True)
    def finished(name: str) -> bool:  # has final-phase runs (a searched arm may have search runs only so far)
        return any((results_dir / name / "runs").glob("final-*.json"))

    names = [arm_name(suite, e, a) for e in suite.experiments for a in e.arms if finished(arm_name(suite, e, a))]
    if not names:
        raise RaysentError(f"suite {suite.name}: no experiment has run files under {results_dir}/")
    runs = [r for n in names for r in load_experiment(n, results_dir, "final")]
    published = results_dir / "published.yaml"
    if not published.is_file():
        published = default_published_file()
    table = build_table(runs, published="match" if published.is_file() else None,
                        published_file=published if published.is_file() else None, title=f"suite {suite.name}")
    table.write(out / "table")
    comparisons = []
    for e in suite.experiments:
        a, b = arm_name(suite, e, "paper"), arm_name(suite, e, "searched")
        if not (finished(a) and finished(b)):
            continue
        comparisons.append(EntryComparison(experiment=e.name, label=e.label or e.name,
                                           result=compare([a, b], results_dir)))
    (out / "compare.json").write_text(json.dumps([c.to_json() for c in comparisons], indent=2, default=str))
    (out / "compare.md").write_text(format_comparisons(comparisons))
    headline = format_headline(comparisons, transductive={r.experiment for r in runs if r.transductive})
    (out / "headline.md").write_text(headline)
    summary = format_summary_table(suite, table)
    (out / "summary.md").write_text(summary)
    from raysent.report.plots import plot_arm_curves

    by_name: dict[str, list[Run]] = {}
    for r in runs:
        by_name.setdefault(r.experiment, []).append(r)
    panels: list[tuple[str, dict[str, list[Run]]]] = [(e.label or e.name,
               {a: by_name[arm_name(suite, e, a)] for a in e.arms if arm_name(suite, e, a) in by_name})
              for e in suite.experiments if "paper" in e.arms and len(e.arms) > 1]
    if any(p[1] for p in panels):
        plot_arm_curves(panels, out / "plots" / "dev_curves.png",
                        title=f"suite {suite.name}: STS-B dev over training, final-phase runs, mean ± std over seeds "
                              "(dotted: step 0)")
    return {"suite": suite.name, "table": str(out / "table.md"), "summary": str(out / "summary.md"),
            "compare": str(out / "compare.md"), "headline": str(out / "headline.md"), "experiments": names,
            "table_markdown": summary, "compare_markdown": format_comparisons(comparisons),
            "headline_markdown": headline}


def format_summary_table(suite: SuiteConfig, table) -> str:
    """One line per entry and arm (mean±std over the seeds; n in the header), then the papers' rows."""
    from raysent.report.table import TASK_LABELS

    cols = table.columns
    arm_of = {arm_name(suite, e, a): (e.label or e.name, a) for e in suite.experiments for a in e.arms}
    lines = ["| Method | arm | n | " + " | ".join(TASK_LABELS[c] for c in cols) + " | learned |",
             "| :--- | :--- | ---: | " + " | ".join("---:" for _ in cols) + " | :--- |"]

    def cell(c):
        return "—" if c.mean is None else f"{c.mean:.2f}" + (f"±{c.std:.2f}" if c.std is not None else "")

    ours = [r for r in table.rows if r.kind == "ours"]
    order = {n: i for i, n in enumerate(arm_of)}
    for r in sorted(ours, key=lambda r: order.get(r.info["experiment"], 10**6)):
        label, arm = arm_of.get(r.info["experiment"], (r.info["experiment"], "?"))
        flat = sum(1 for x in r.runs if x.learned is False)
        trained = sum(1 for x in r.runs if x.learned is not None)
        learned = "—" if not trained else ("yes" if not flat else f"no ({flat}/{trained} at step 0)")
        arm_txt = {"paper": "paper defaults", "searched": "searched"}[arm] if arm in ARMS else arm
        if r.label.endswith("[transductive]") or "[transductive]" in r.label:
            arm_txt += " [transductive]"
        lines.append(f"| {label} | {arm_txt} | {len(r.runs)} | " + " | ".join(cell(r.cells[c]) for c in cols)
                     + f" | {learned} |")
    papers = [r for r in table.rows if r.kind == "paper" and "bert-base" in r.model]  # the papers' BERT-base rows
    for r in papers:
        runs = next((c.runs_given for c in r.cells.values() if c.runs_given), None)
        lines.append(f"| {r.label} | {r.model} | {runs or ''} | " + " | ".join(cell(r.cells[c]) for c in cols) + " | |")
    lines.append("")
    lines.append("Spearman ×100 of cosine similarity on the test sets, STS12-16 aggregated as 'all'; mean±std over "
                 "the n seeds (sample std). learned: whether each run's best dev checkpoint came after step 0 (a run "
                 "whose best is step 0 reports the untouched encoder). [paper]: the papers' own numbers "
                 "(results/published.yaml), on their encoders and budgets, for reference.")
    return "\n".join(lines) + "\n"


def report_only(path: str | Path) -> dict:
    """Rewrite the suite's tables and comparisons from the run files there are (no training)."""
    path = Path(path)
    suite = load_suite(path)
    cfg = arm_config(suite, suite.experiments[0], suite.experiments[0].arms[0], path.parent)
    rep = write_report(suite, path, Path(cfg.tracking.results_dir))
    rep["wall_seconds"] = 0.0
    return rep


def format_comparisons(comparisons: list[EntryComparison], task: str = "avg") -> str:
    """One line per entry: paper defaults vs searched on ``task`` (Avg of the 7 STS sets), paired over seeds."""
    lines = ["| Method | paper defaults | searched | Δ (searched − paper) | n | t-test p | Wilcoxon p "
             "| searched best |",
             "| :--- | ---: | ---: | ---: | ---: | ---: | ---: | :--- |"]

    def f(m, s):
        return "—" if m is None else f"{m:.2f}" + (f"±{s:.2f}" if s is not None else "")

    def p(v):
        return "—" if v is None else (f"{v:.3g}" if v >= 1e-3 else f"{v:.1e}")

    for c in comparisons:
        comp = c.result.comparisons[0]
        r = comp.tasks.get(task)
        if r is None:
            continue
        hp = ", ".join(f"{k}={v}" for k, v in comp.run.hp.items())
        lines.append(f"| {c.label} | {f(r.a_mean, r.a_std)} | {f(r.b_mean, r.b_std)} | "
                     + ("—" if r.diff_mean is None else f"{r.diff_mean:+.2f}"
                        + (f"±{r.diff_std:.2f}" if r.diff_std is not None else ""))
                     + f" | {r.n} | {p(r.t_p)} | {p(r.wilcoxon_p)} | {hp} |")
    lines.append("")
    what = "Avg of STS12-16 ('all'), STS-B and SICK-R test" if task == "avg" else task
    lines.append(f"Spearman ×100, {what}; mean±std over the paired seeds "
                 "(sample std); p two-sided (paired t-test, Wilcoxon signed-rank; with 5 seeds Wilcoxon's "
                 "smallest possible p is 0.0625).")
    return "\n".join(lines) + "\n"


def _learned_cell(side: Side) -> str:
    """As summary.md's learned column: yes, no (k/n at step 0), or — for a method that does not train."""
    if side.learned is None:
        return "—"
    flat = side.not_learned_seeds
    return "yes" if not flat else f"no ({len(flat)}/{len(side.seeds)} at step 0)"


def format_headline(comparisons: list[EntryComparison], transductive: set[str] | frozenset[str] = frozenset(),
                    task: str = "avg") -> str:
    """The compact table: one line per entry with both arms (``comparisons`` as compare.json holds them): the
    paper defaults' and the searched arm's ``task`` (Avg of the 7 STS sets), Δ paired over the seeds, the paired
    t-test's p, and whether each arm learned. Δ is marked †k/n where on k of its n paired seeds neither arm
    learned (both best dev checkpoints at step 0): there it compares two untouched encoders, not training.
    ``transductive``: experiments (arms) that train on the evaluation sets' text, marked [transductive]."""
    lines = ["| Method | paper defaults | searched | Δ (searched − paper) | t-test p | paper learned "
             "| searched learned |",
             "| :--- | ---: | ---: | ---: | ---: | :--- | :--- |"]

    def f(m, s):
        return "—" if m is None else f"{m:.2f}" + (f"±{s:.2f}" if s is not None else "")

    def p(v):
        return "—" if v is None else (f"{v:.3g}" if v >= 1e-3 else f"{v:.1e}")

    ns, whole = set(), []
    for c in comparisons:
        paper, comp = c.result.baseline, c.result.comparisons[0]
        r = comp.tasks.get(task)
        if r is None:
            continue
        ns.add(r.n)
        neither = comp.neither_learned_seeds
        delta = "—" if r.diff_mean is None else (f"{r.diff_mean:+.2f}"
                                                 + (f"±{r.diff_std:.2f}" if r.diff_std is not None else ""))
        if neither:
            delta += f" †{len(neither)}/{r.n}"
            if comp.neither_learned:
                whole.append(c.label)
        trans = " [transductive]" if {paper.experiment, comp.run.experiment} & set(transductive) else ""
        lines.append(f"| {c.label}{trans} | {f(r.a_mean, r.a_std)} | {f(r.b_mean, r.b_std)} | {delta} "
                     f"| {p(r.t_p)} | {_learned_cell(paper)} | {_learned_cell(comp.run)} |")
    what = "Avg of STS12-16 ('all'), STS-B and SICK-R test" if task == "avg" else task
    seeds = f"the {ns.pop()} seeds" if len(ns) == 1 else "the paired seeds"
    lines += ["",
              f"Spearman ×100, {what}; mean±std over {seeds} (sample std); Δ paired by seed; p: two-sided paired "
              "t-test (—: the differences are equal on every seed, so it is undefined). learned: whether each run's "
              "best dev checkpoint came after step 0 (k/n at step 0: k runs report the untouched encoder). "
              + ("[transductive]: trains on the unlabeled text of the evaluation sets." if any(
                  "[transductive]" in ln for ln in lines) else "")]
    if any("†" in ln for ln in lines[2:]):
        lines.append("")
        lines.append("†k/n: on k of the n paired seeds neither arm learned, so there Δ compares two untouched "
                     "encoders (the input model as each arm reads it, e.g. another pooling), not training"
                     + (f"; for {', '.join(whole)} that is all of Δ." if whole else "."))
    return "\n".join(ln.rstrip() for ln in lines) + "\n"
