"""`raysent table`: paper-style mean±std tables of experiments' runs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from raysent.cli.common import check_results_dir, split_list
from raysent.errors import RaysentError

# Lazy imports: raysent's heavier modules (the command's work is imported when it runs, so `raysent --help` and every
# other command start without torch, Ray or MLflow).


def register(sub) -> None:
    tb = sub.add_parser("table", help="paper-style mean±std tables of experiments' runs (markdown, LaTeX, CSV)",
                        description="One row per configuration (or per value of --group-by) with STS12, STS13, "
                        "STS14, STS15, STS16, STS-B, SICK-R and Avg as 'mean±std (n)' over the runs (sample std, "
                        "n-1), read from results/<experiment>/runs/*.json. A seed or data set that is missing shows "
                        "as '(n/N)' or '— (0/N)' with a note. Prints markdown and writes "
                        "results/<experiment>/table.{md,tex,csv} (table-<options>.* for non-default options).",
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    tb.add_argument("experiments", nargs="*", metavar="EXPERIMENT",
                    help="experiment names (folders under --results-dir; default: every one with run files)")
    tb.add_argument("--phase", choices=["final", "search"], default="final",
                    help="final: the best configuration on every seed, test scores (default); search: every "
                    "searched configuration, dev scores only")
    tb.add_argument("--search", metavar="ID", help="the search whose runs to tabulate (its id, e.g. 20261127-150022; "
                    "'all': every search); default: each experiment's newest")
    tb.add_argument("--aggregation", choices=["all", "mean", "wmean"], default="all",
                    help="STS12-16 aggregation: all (one correlation over every pair of the year, SimCSE/MTEB), mean "
                    "or wmean (SentEval's per-sub-set averages); run files written by raysent tune hold all three")
    tb.add_argument("--correlation", choices=["spearman", "pearson"], default="spearman")
    tb.add_argument("--group-by", action="append", metavar="FIELD",
                    help="one row per value of this run field (any hyperparameter or config field, e.g. temperature, "
                    "pooling, lr, batch_size, or a dotted config path such as data.train); repeatable or "
                    "comma-separated")
    tb.add_argument("--published", nargs="?", const="match", metavar="WHICH",
                    help="add the papers' rows from results/published.yaml, marked [paper], and a Δ row (ours − "
                    "paper) where method and encoder match; WHICH: match (rows of the table's methods, the "
                    "default), all, or paper names (SG-BERT, SimCSE, LayerAttPooler, ConSERT, SupCon), "
                    "comma-separated")
    tb.add_argument("--published-file", metavar="FILE", help="another published-numbers YAML (default "
                    "<results-dir>/published.yaml, else the repository's results/published.yaml)")
    tb.add_argument("--dev", action=argparse.BooleanOptionalAction, default=None,
                    help="add a Dev column (best model-selection score); default: on for --phase search")
    tb.add_argument("--results-dir", default="results", help="where the experiments are (default: results)")
    tb.add_argument("--output", metavar="STEM", help="write STEM.md, STEM.tex, STEM.csv instead of "
                    "results/<experiment>/table.*")
    tb.add_argument("--no-write", action="store_true", help="print only")
    tb.add_argument("--format", choices=["markdown", "latex", "csv"], default="markdown", help="what is printed")
    tb.set_defaults(func=run)


def run(args) -> int:
    from raysent.report.runs import experiments, load_experiment, pick_search
    from raysent.report.table import build_table, output_stem

    check_results_dir(args.results_dir)
    names = args.experiments or experiments(args.results_dir)
    if not names:
        raise RaysentError(f"no experiment with run files under {args.results_dir}/ (results/<experiment>/runs/*.json; "
                           "`raysent tune FILE.yaml` writes them)")
    runs, notes = pick_search([r for name in names for r in load_experiment(name, args.results_dir, args.phase)],
                              args.search, ", ".join(names))
    group_by = split_list(args.group_by)
    published_file = args.published_file
    if published_file is None and (Path(args.results_dir) / "published.yaml").is_file():
        published_file = Path(args.results_dir) / "published.yaml"
    table = build_table(runs, aggregation=args.aggregation, correlation=args.correlation, group_by=group_by,
                        published=args.published, published_file=published_file, dev=args.dev)
    table.notes[:0] = notes
    if args.format == "markdown":
        print(table.to_markdown(), end="")
    elif args.format == "latex":
        print(table.to_latex(), end="")
    else:
        print(table.to_csv(), end="")
    if not args.no_write:
        stem = args.output or output_stem(args.results_dir, names, args.phase, args.aggregation, args.correlation,
                                          group_by, args.published, args.search)
        paths = table.write(stem)
        print(f"wrote {', '.join(str(p) for p in paths)}", file=sys.stderr)
    return 0
