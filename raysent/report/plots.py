"""PNG plots of an experiment (``raysent plot EXPERIMENT``) and of a layer grid (``raysent eval --layers``).

* ``dev_curves.png``: the dev score (STS-B dev by default) over training steps, one line per run
  (configuration × seed), one panel per phase.
* ``search_hyperparameters.png``: each searched hyperparameter against the run's best dev score
  (a dot per seed, the mean ± sample std of each configuration).
* ``optuna_importances.png``: Optuna's ``optuna.visualization.matplotlib.plot_param_importances`` on the
  study in ``results/<experiment>/optuna.db`` (study ``search-<search id>``), from 8 completed trials on;
  ``optuna_parallel_coordinate.png``: the study's trials in parallel coordinates (:func:`plot_parallel`).
* the layer × pooling heatmap of :func:`raysent.eval.layers.layer_grid` (SG-BERT's Figure 1).
* ``budget.png``: the search's budget curve (:func:`plot_search_budget`; :mod:`raysent.report.budget`); several
  searches' overlaid by :func:`plot_budget` (``raysent compare --budget-plot``).

matplotlib with the Agg backend (no display needed). Imports no Ray.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter

from raysent.errors import RaysentError
from raysent.report.runs import Run, format_value, load_experiment

# Lazy imports: optuna (heavy, and only the functions that need them import them).

PLOT_KINDS = ("dev", "hp", "importance", "parallel", "budget")
FILES = {"dev": "dev_curves.png", "hp": "search_hyperparameters.png", "importance": "optuna_importances.png",
         "parallel": "optuna_parallel_coordinate.png", "budget": "budget.png"}


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def _dev_label(runs: list[Run]) -> str:
    specs = sorted({", ".join((r.config.get("data") or {}).get("dev") or ["stsb:dev"]) for r in runs})
    return f"dev Spearman ×100 ({'; '.join(specs)})"


def plot_dev_curves(runs: list[Run], path: str | Path, title: str = "") -> Path:
    """The dev curve of every run: step on x, dev Spearman on y; a colour per configuration."""
    runs = [r for r in runs if r.dev_curve()]
    if not runs:
        raise RaysentError("no run has a dev_curve to plot")
    phases = [p for p in ("search", "final") if any(r.phase == p for r in runs)]
    fig, axes = plt.subplots(1, len(phases), figsize=(6.0 * len(phases), 4.2), squeeze=False, sharey=True)
    configs = sorted({r.config_id for r in runs})
    colors = {c: plt.cm.tab10(i % 10) for i, c in enumerate(configs)}
    styles = ["-", "--", ":", "-."]
    for ax, phase in zip(axes[0], phases):
        prs = sorted((r for r in runs if r.phase == phase), key=lambda r: (r.config_id, r.seed or 0))
        seeds = sorted({r.seed for r in prs})
        for r in prs:
            steps, vals = zip(*r.dev_curve())
            hp = ", ".join(f"{k}={format_value(v)}" for k, v in r.hp.items())
            ax.plot(steps, vals, marker="o", ms=3, color=colors[r.config_id],
                    linestyle=styles[seeds.index(r.seed) % len(styles)],
                    label=f"{r.config_id} seed {r.seed}" + (f" ({hp})" if hp else ""))
        ax.set_title(f"{phase} phase ({len(prs)} runs)")
        ax.set_xlabel("training step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    axes[0][0].set_ylabel(_dev_label(runs))
    fig.suptitle(title or f"{runs[0].experiment}: dev score over training, per seed")
    return _save(fig, Path(path))


def _space(runs: list[Run]) -> dict:
    for r in runs:
        space = ((r.config.get("search") or {}).get("space")) or {}
        if space:
            return space
    return {}


def plot_hyperparameters(runs: list[Run], path: str | Path, title: str = "") -> Path:
    """Each searched hyperparameter (x) against the best dev score of each run (y)."""
    runs = [r for r in runs if r.phase == "search" and r.hp and r.score("dev") is not None]
    if not runs:
        raise RaysentError("no search-phase run with searched hyperparameters (hp) and a dev score")
    names = list(dict.fromkeys(k for r in runs for k in r.hp))
    space = _space(runs)
    fig, axes = plt.subplots(1, len(names), figsize=(4.6 * len(names), 4.0), squeeze=False, sharey=True)
    for ax, name in zip(axes[0], names):
        have = [r for r in runs if name in r.hp]
        xs = [r.hp[name] for r in have]
        entry = space.get(name)
        spec = entry if isinstance(entry, dict) else {}
        kind = str(spec.get("type", ""))
        numeric = kind not in ("choice", "grid") and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                         for x in xs)
        cats: list[Any] = [] if numeric else sorted({x for x in xs}, key=lambda v: (
            isinstance(v, str), v if not isinstance(v, str) else 0, str(v)))

        def pos(x, numeric=numeric, cats=cats):
            return x if numeric else cats.index(x)

        ax.scatter([pos(x) for x in xs], [r.score("dev") for r in have], s=14, alpha=0.5, color="tab:gray",
                   label="one seed")
        by_cfg: dict[str, list[Run]] = {}
        for r in have:
            by_cfg.setdefault(r.config_id, []).append(r)
        mx, my, me = [], [], []
        for rs in by_cfg.values():
            vals = [v for r in rs if (v := r.score("dev")) is not None]
            if not vals:
                continue
            mx.append(pos(rs[0].hp[name]))
            my.append(float(np.mean(vals)))
            me.append(float(np.std(vals, ddof=1)) if len(vals) > 1 else 0.0)
        ax.errorbar(mx, my, yerr=me, fmt="o", color="tab:blue", capsize=3, label="configuration mean ± std")
        if numeric:
            if kind in ("loguniform", "qloguniform") and min(xs) > 0 and max(xs) / min(xs) >= 10:
                ax.set_xscale("log")  # a log axis only pays over a decade or more
                ax.xaxis.set_minor_formatter(NullFormatter())
            ax.tick_params(axis="x", labelrotation=30)
        else:
            ax.set_xticks(range(len(cats)), [format_value(c) for c in cats], rotation=30)
            ax.set_xlim(-0.5, len(cats) - 0.5)
        ax.set_xlabel(name + (f" ({kind})" if kind else ""))
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("best " + _dev_label(runs))
    axes[0][0].legend(fontsize=7)
    fig.suptitle(title or f"{runs[0].experiment}: dev score against each searched hyperparameter "
                 f"({len({r.config_id for r in runs})} configurations, {len(runs)} runs)")
    return _save(fig, Path(path))


def load_study(results_dir: str | Path, experiment: str, search: str | None = None):
    """The Optuna study of a search: ``results/<experiment>/optuna.db``, study ``search-<search id>``."""
    import optuna

    db = Path(results_dir) / experiment / "optuna.db"
    if not db.is_file():
        raise RaysentError(f"{db}: no Optuna study (the search used algorithm random/grid, or did not run)")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = f"sqlite:///{db}"
    names = [s.study_name for s in optuna.get_all_study_summaries(storage)]
    if search is None:
        state = Path(results_dir) / experiment / "state.json"
        run = json.loads(state.read_text()).get("run") if state.is_file() else None
        search = run if run and f"search-{run}" in names else (sorted(names)[-1].removeprefix("search-") if names
                                                                 else None)
    name = f"search-{search}"
    if name not in names:
        raise RaysentError(f"{db}: no study {name!r}; studies: {', '.join(names) or 'none'} (--search ID picks one)")
    return optuna.load_study(study_name=name, storage=storage)


MIN_IMPORTANCE_TRIALS = 8  # fANOVA's importances from fewer completed trials are noise, not a finding


def plot_optuna(study, kind: str, path: str | Path) -> Path:
    """Optuna's matplotlib ``plot_param_importances`` (kind importance; from
    :data:`MIN_IMPORTANCE_TRIALS` completed trials on) or the parallel coordinates of the study
    (:func:`plot_parallel`)."""
    import optuna
    from optuna.visualization import matplotlib as ovm

    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    if len(done) < 2:
        raise RaysentError(f"study {study.study_name}: {len(done)} completed trial(s); the {kind} plot needs 2")
    if kind == "parallel":
        return plot_parallel(study.study_name, done, study.direction == optuna.study.StudyDirection.MAXIMIZE, path)
    if kind != "importance":
        raise ValueError(kind)
    if len(done) < MIN_IMPORTANCE_TRIALS:
        raise RaysentError(f"study {study.study_name}: {len(done)} completed trials; hyperparameter importances "
                           f"need at least {MIN_IMPORTANCE_TRIALS} to mean anything (fANOVA fits a forest to them)")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ExperimentalWarning of optuna.visualization.matplotlib
        ax = ovm.plot_param_importances(study)
    ax = np.ravel(ax)[0] if isinstance(ax, np.ndarray) else ax
    fig = ax.figure
    if not isinstance(fig, Figure):  # a subfigure: its figure is the one to size and save
        fig = fig.figure
    fig.suptitle(f"{study.study_name} ({len(done)} trials; objective: mean dev Spearman over seeds)", fontsize=9)
    fig.set_size_inches(max(fig.get_size_inches()[0], 8), max(fig.get_size_inches()[1], 5))
    return _save(fig, Path(path))


def plot_parallel(name: str, trials: list, maximize: bool, path: str | Path) -> Path:
    """Parallel coordinates of completed Optuna trials: one vertical axis per hyperparameter (log-scaled where
    it was searched on a log scale, categories evenly spaced) and the objective last; a line per trial,
    coloured by its objective (viridis: no line fades into the background), the best drawn thickest on top.
    Optuna's own plot puts lines near white on a white background and overlaps log-axis ticks."""
    from optuna.distributions import CategoricalDistribution

    params = sorted({k for t in trials for k in t.params})
    values = np.array([t.value for t in trials], dtype=float)
    axes, ticks = [], []
    for p in params:
        dist = next(t.distributions[p] for t in trials if p in t.distributions)
        raw = [t.params.get(p) for t in trials]
        if isinstance(dist, CategoricalDistribution):
            cats = [c for c in dist.choices if c in raw] or list(dist.choices)
            pos = np.linspace(0, 1, len(cats)) if len(cats) > 1 else np.array([0.5])
            axes.append([pos[cats.index(v)] if v in cats else np.nan for v in raw])
            ticks.append(list(zip(pos, (format_value(c) for c in cats))))
            continue
        log = bool(getattr(dist, "log", False))
        f = np.log10 if log else (lambda x: x)
        lo, hi = f(dist.low), f(dist.high)
        span = (hi - lo) or 1.0
        axes.append([(f(v) - lo) / span if v is not None else np.nan for v in raw])
        marks = np.linspace(lo, hi, 4)
        whole = type(dist).__name__.startswith("Int")
        shown = [10 ** m if log else m for m in marks]
        ticks.append([((m - lo) / span, f"{round(v)}" if whole else f"{v:.3g}") for m, v in zip(marks, shown)])
    lo, hi = float(np.min(values)), float(np.max(values))
    axes.append(list((values - lo) / ((hi - lo) or 1.0)))
    ticks.append([(x, f"{lo + x * (hi - lo):.2f}") for x in np.linspace(0, 1, 5)])
    labels = [*params, "objective"]

    fig, ax = plt.subplots(figsize=(max(6.0, 2.2 * len(labels)), 4.8))
    cmap = plt.get_cmap("viridis")
    order = np.argsort(values if maximize else -values)  # the best last, on top
    best = order[-1]
    xs = np.arange(len(labels))
    for i in order:
        ys = [a[i] for a in axes]
        score = (values[i] - lo) / ((hi - lo) or 1.0)
        ax.plot(xs, ys, color=cmap(score if maximize else 1 - score), lw=3.0 if i == best else 1.4,
                alpha=1.0 if i == best else 0.8, zorder=3 if i == best else 2)
    for x, axis_ticks in zip(xs, ticks):
        ax.axvline(float(x), color="0.3", lw=0.8, zorder=1)
        for y, text in axis_ticks:
            ax.text(x - 0.04, y, text, ha="right", va="center", fontsize=8, color="0.2", zorder=4,
                    bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.6, "alpha": 0.85})
    ax.set_xticks(xs, labels, fontsize=9)
    ax.set_xlim(-0.6, len(labels) - 0.7)
    ax.set_ylim(-0.05, 1.05)
    ax.set_yticks([])
    for side in ("left", "right", "top"):
        ax.spines[side].set_visible(False)
    sm = plt.cm.ScalarMappable(cmap=cmap, norm=plt.Normalize(lo, hi))
    fig.colorbar(sm, ax=ax, pad=0.02, label="objective (mean dev Spearman over seeds)")
    ax.set_title(f"{name}: {len(trials)} trials; best thickest", fontsize=10)
    return _save(fig, Path(path))


def plot_experiment(experiment: str, results_dir: str | Path = "results", kinds=PLOT_KINDS,
                    search: str | None = None, out_dir: str | Path | None = None) -> tuple[list[Path], list[str]]:
    """Every plot of ``kinds`` for an experiment; returns (written files, reasons a plot was skipped)."""
    runs = load_experiment(experiment, results_dir)
    if search is not None:
        runs = [r for r in runs if r.search == search]
        if not runs:
            raise RaysentError(f"experiment {experiment!r}: no runs of search {search!r}")
    out = Path(out_dir) if out_dir else Path(results_dir) / experiment / "plots"
    written, skipped = [], []
    for kind in kinds:
        try:
            if kind == "dev":
                written.append(plot_dev_curves(runs, out / FILES[kind]))
            elif kind == "hp":
                written.append(plot_hyperparameters(runs, out / FILES[kind]))
            elif kind == "budget":
                written.append(plot_search_budget(runs, Path(results_dir) / experiment, out / FILES[kind]))
            else:
                study = load_study(results_dir, experiment, search)
                written.append(plot_optuna(study, kind, out / FILES[kind]))
        except RaysentError as exc:
            skipped.append(f"{kind}: {exc}")
    return written, skipped


def plot_layer_grid(result: dict, path: str | Path, title: str = "") -> Path:
    """Heatmap of :func:`raysent.eval.layers.layer_grid`: layers as rows, poolings as columns."""
    pools, layers = result["poolings"], result["layers"]
    z = np.array([[np.nan if result["grid"][p][k] is None else result["grid"][p][k] for p in pools] for k in layers])
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(9.5, 0.45 * len(layers) + 2.2),
                                  gridspec_kw={"width_ratios": [1, 1.4]}, layout="constrained")
    im = ax.imshow(z, cmap="viridis", aspect="auto", origin="lower")
    ax.set_xticks(range(len(pools)), pools)
    ax.set_yticks(range(len(layers)), [f"{k}" + (" (emb)" if k == 0 else "") for k in layers])
    ax.set_xlabel("pooling")
    ax.set_ylabel("layer")
    for i in range(len(layers)):
        for j in range(len(pools)):
            ax.text(j, i, "n/a" if np.isnan(z[i, j]) else f"{z[i, j]:.1f}", ha="center", va="center", fontsize=8,
                    color="white" if z[i, j] < np.nanmean(z) else "black")
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="Spearman ×100")
    for j, p in enumerate(pools):
        ax2.plot(layers, z[:, j], marker="o", label=p)
    ax2.set_xlabel("layer (0 = embeddings)")
    ax2.set_ylabel("Spearman ×100")
    ax2.set_xticks(layers)
    ax2.grid(alpha=0.3)
    ax2.legend()
    sets = ", ".join(f"{s} ({n} pairs)" for s, n in result["n_pairs"].items())
    fig.suptitle(title or f"{Path(result['model']).name}: Spearman ×100 per layer and pooling on {sets}", fontsize=10)
    return _save(fig, Path(path))


def plot_arm_curves(panels: list[tuple[str, dict[str, list[Run]]]], path: str | Path, title: str = "") -> Path:
    """One panel per method: the mean dev curve (± std over seeds) of each arm's final-phase runs, with the
    untouched encoder's score (step 0) as a dotted line. ``panels``: (title, {arm: runs})."""
    panels = [(t, arms) for t, arms in panels if any(r.dev_curve() for rs in arms.values() for r in rs)]
    if not panels:
        raise RaysentError("no run has a dev_curve to plot")
    cols = 3
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.0 * rows), squeeze=False)
    colors = {"paper": "tab:blue", "searched": "tab:orange"}
    for ax, (name, arms) in zip(axes.flat, panels):
        start = None
        for arm, runs in arms.items():
            curves = [dict(r.dev_curve()) for r in runs if r.dev_curve()]
            steps = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
            if not steps:
                continue
            vals = np.array([[c[s] for s in steps] for c in curves])
            mean, std = vals.mean(axis=0), vals.std(axis=0, ddof=1) if len(vals) > 1 else np.zeros(len(steps))
            ax.plot(steps, mean, marker="o", ms=3, color=colors.get(arm), label=f"{arm} (n={len(vals)})")
            ax.fill_between(steps, mean - std, mean + std, color=colors.get(arm), alpha=0.2)
            start = start if start is not None else mean[0]
        if start is not None:
            ax.axhline(start, color="grey", linestyle=":", linewidth=1)
        ax.set_title(name, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
        ax.set_xlabel("training step", fontsize=8)
    for ax in axes.flat[len(panels):]:
        ax.axis("off")
    for ax in axes[:, 0]:
        ax.set_ylabel("STS-B dev Spearman ×100", fontsize=8)
    fig.suptitle(title or "dev score over training: mean ± std over seeds")
    fig.tight_layout()
    return _save(fig, Path(path))


def plot_search_budget(runs: list[Run], exp: Path, path: str | Path) -> Path:
    """``budget.png``: the budget curve of the newest search of the runs
    (:func:`raysent.report.budget.search_budget`)."""
    from raysent.report.budget import search_budget

    searched = [r for r in runs if r.phase == "search"]
    if not searched:
        raise RaysentError("no search-phase runs: a final phase alone has no budget curve")
    run = max(r.search for r in searched)
    mode = (searched[0].record.config.get("search") or {}).get("mode", "max")
    curve = search_budget(exp, run, mode, final_config=None)
    if curve is None:
        raise RaysentError(f"search {run}: no configuration finished")
    return plot_budget([(f"search {run}", curve)], path,
                       title=f"{exp.name} (search {run}): expected best dev of n configurations; band: 95 % bootstrap; "
                             "dotted: observed best so far")


def plot_budget(curves: list[tuple[str, Any]], path: str | Path, title: str = "") -> Path:
    """Budget curves (:class:`raysent.report.budget.BudgetCurve`), one per search, overlaid: the expected best dev
    score of n configurations with its bootstrap band, against n (left) and against the optimizer steps n
    configurations cost in expectation (right, where the steps are known); dotted, each search's observed best so
    far in the order its configurations finished."""
    if not curves:
        raise RaysentError("no budget curve to plot")
    with_steps = [c for c in curves if c[1].expected_steps]
    fig, axes = plt.subplots(1, 2 if with_steps else 1, figsize=(12.0 if with_steps else 6.4, 4.4), squeeze=False,
                             sharey=True)
    for i, (label, c) in enumerate(curves):
        color = plt.cm.tab10(i % 10)
        n = np.arange(1, c.configurations + 1)
        xs = [(axes[0][0], n)] + ([(axes[0][1], np.asarray(c.expected_steps))] if with_steps and c.expected_steps
                                  else [])
        for ax, x in xs:
            ax.plot(x, c.expected_best, marker="o", ms=3, color=color,
                    label=f"{label}: {c.configurations} configurations" + (f", {c.stopped_configurations} stopped"
                                                                            if c.stopped_configurations else ""))
            ax.fill_between(x, c.band_low, c.band_high, color=color, alpha=0.15, linewidth=0)
            ax.plot(x, c.observed_best, color=color, linestyle=":", linewidth=1)
    what = curves[0][1].estimator
    axes[0][0].set_xlabel(f"configurations tried, n (drawn {what})")
    axes[0][0].set_ylabel("expected best dev (mean over seeds, ×100)")
    if with_steps:
        axes[0][1].set_xlabel("optimizer steps, every seed (n × the search's mean per configuration)")
    for ax in axes[0]:
        ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=min(len(curves), 2))
    fig.suptitle(title or "expected best of n configurations; band: 95 % bootstrap; dotted: observed best so far",
                 fontsize=10)
    return _save(fig, Path(path))
