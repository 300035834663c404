"""`raysent compare A B`: per-data-set differences, paired tests across seeds."""

from __future__ import annotations

import argparse
import json

from raysent.cli.common import check_results_dir

# Lazy imports: raysent's heavier modules (the command's work is imported when it runs, so `raysent --help` and every
# other command start without torch, Ray or MLflow).


def register(sub) -> None:
    cp = sub.add_parser("compare", help="per-data-set differences between runs, paired t-test and Wilcoxon across "
                        "seeds", description="RUN: an experiment (its final-phase runs), EXPERIMENT:CONFIG_ID, a "
                        "config_id, or a quoted glob of run files (e.g. 'results/quick/runs/final-*.json'); each "
                        "must name one configuration per seed. Every RUN after the first is compared with the "
                        "first, seed by seed: Δ = B − A, scipy.stats.ttest_rel and scipy.stats.wilcoxon (two-sided).",
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    cp.add_argument("runs", nargs="+", metavar="RUN")
    cp.add_argument("--phase", choices=["final", "search", "any"], default="final",
                    help="phase of the runs an experiment or config_id names (default final; globs are taken as given)")
    cp.add_argument("--search", metavar="ID", help="for a RUN that is an experiment or a config_id: the search whose "
                    "runs to take (its id; default: the experiment's newest); a glob of run files is taken as given")
    cp.add_argument("--aggregation", choices=["all", "mean", "wmean"], default="all")
    cp.add_argument("--correlation", choices=["spearman", "pearson"], default="spearman")
    cp.add_argument("--alpha", type=float, default=0.05, help="p-values below it are marked * (default 0.05)")
    cp.add_argument("--results-dir", default="results")
    cp.add_argument("--format", choices=["text", "json"], default="text")
    cp.add_argument("--budget-plot", metavar="PNG", default=None,
                    help="also write the budget curves of each RUN's search, overlaid, to this PNG (the expected best "
                         "dev of n configurations with its bootstrap band, against n and against optimizer steps)")
    cp.set_defaults(func=run)


def run(args) -> int:
    from raysent.report.compare import compare, format_comparison

    check_results_dir(args.results_dir)
    phase = None if args.phase == "any" else args.phase
    res = compare(args.runs, args.results_dir, phase=phase, aggregation=args.aggregation,
                  correlation=args.correlation, budget=True, search=args.search)
    print(json.dumps(res.to_json(), indent=2) if args.format == "json" else format_comparison(res, alpha=args.alpha))
    if args.budget_plot:
        from raysent.report.plots import plot_budget

        sides = [res.baseline, *(c.run for c in res.comparisons)]
        curves = [(f"{d.spec} (search {d.search})", d.budget) for d in sides if d.budget is not None]
        if curves:
            print(f"budget curves: {plot_budget(curves, args.budget_plot)}")
        else:
            print("budget curves: none of the runs comes from one search; no plot written")
    return 0
