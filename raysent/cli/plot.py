"""`raysent plot EXPERIMENT`: dev curves, score per hyperparameter, Optuna's plots."""

from __future__ import annotations

import sys

from raysent.cli.common import check_results_dir, split_list
from raysent.errors import RaysentError

# Lazy imports: raysent's heavier modules (the command's work is imported when it runs, so `raysent --help` and every
# other command start without torch, Ray or MLflow).


def register(sub) -> None:
    pl = sub.add_parser("plot", help="PNG plots of an experiment: dev curves, score per hyperparameter, Optuna's "
                        "importance and parallel-coordinate plots",
                        description="Writes results/<experiment>/plots/dev_curves.png (dev score over steps per "
                        "seed), search_hyperparameters.png (best dev score against each searched hyperparameter), "
                        "optuna_importances.png and optuna_parallel_coordinate.png (Optuna's own matplotlib plots "
                        "of the study in results/<experiment>/optuna.db) and budget.png (the search's budget curve: "
                        "the expected best dev of n configurations). The layer x pooling grid is "
                        "`raysent eval --model M --layers --plot FILE.png`.")
    pl.add_argument("experiment", help="experiment name (a folder under --results-dir)")
    pl.add_argument("--kinds", action="append", metavar="K1,K2",
                    help="subset of dev, hp, importance, parallel, budget (default: all five)")
    pl.add_argument("--search", metavar="ID", help="one search's runs and study (default: every run; the study of "
                    "the experiment's last search)")
    pl.add_argument("--results-dir", default="results")
    pl.add_argument("--output-dir", metavar="DIR", help="default results/<experiment>/plots")
    pl.set_defaults(func=run)


def run(args) -> int:
    from raysent.report.plots import PLOT_KINDS, plot_experiment

    check_results_dir(args.results_dir)
    kinds = split_list(args.kinds) or list(PLOT_KINDS)
    bad = [k for k in kinds if k not in PLOT_KINDS]
    if bad:
        raise RaysentError(f"--kinds {','.join(bad)}: unknown; allowed: {', '.join(PLOT_KINDS)}")
    written, skipped = plot_experiment(args.experiment, args.results_dir, kinds, search=args.search,
                                       out_dir=args.output_dir)
    for p in written:
        print(p)
    for s in skipped:
        print(f"skipped {s}", file=sys.stderr)
    if not written:
        raise RaysentError(f"no plot written for {args.experiment!r}: " + "; ".join(skipped))
    return 0
