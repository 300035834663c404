"""`raysent suite FILE.yaml`: paper defaults vs searched for many methods, one table."""

from __future__ import annotations

import argparse
import json
import sys

from raysent.cli.common import EPILOG, disconnect_ray, split_list, stdout_for, yaml_dump

# Lazy imports: raysent's heavier modules (the command's work is imported when it runs, so `raysent --help` and every
# other command start without torch, Ray or MLflow).


def register(sub) -> None:
    su = sub.add_parser("suite", help="a benchmark: several methods, each with the paper's defaults and searched, "
                        "on the same seeds; one table and the searched-vs-paper statistics",
                        description="Runs every experiment of a suite file (benchmarks/*.yaml) as `raysent tune` "
                        "does: the 'paper' arm (the paper's defaults, final phase only) and the 'searched' arm "
                        "(Optuna over the entry's space, then the best configuration) of each entry, on the same "
                        "seeds. Writes results/<suite>/table.{md,tex,csv} (with the papers' rows) and "
                        "compare.{md,json} (paired t-test and Wilcoxon of searched vs paper).",
                        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    su.add_argument("suite", help="suite YAML (see benchmarks/)")
    su.add_argument("--dry-run", action="store_true", help="print the experiments, their runs and the estimated "
                    "time, and exit")
    su.add_argument("--resume", action="store_true", help="continue an interrupted suite: finished experiments "
                    "are kept, an interrupted one continues from its saved state")
    su.add_argument("--report-only", action="store_true", help="rewrite the suite's tables and comparisons from the "
                    "run files there are, without training")
    su.add_argument("--only", action="append", metavar="NAME", help="run (or plan) only these entries; "
                    "repeatable or comma-separated")
    su.add_argument("--format", choices=["text", "json"], default="text", help="summary format")
    su.set_defaults(func=run)


def run(args) -> int:
    from raysent.tune.suite import plan, report_only, run_suite

    only = split_list(args.only) or None
    if args.dry_run:
        p = plan(args.suite, only=only)
        print(json.dumps(p, indent=2, default=str) if args.format == "json" else yaml_dump(p))
        return 0
    if args.report_only:
        report = report_only(args.suite)
        print(report["table_markdown"])
        print(report["compare_markdown"])
        return 0
    with stdout_for(args.format):
        report = run_suite(args.suite, resume=args.resume, only=only,
                           say=lambda m: print(m, file=sys.stderr, flush=True))
        disconnect_ray()
    if args.format == "json":
        print(json.dumps({k: v for k, v in report.items() if not k.endswith("_markdown")}, indent=2, default=str))
    else:
        print(report["table_markdown"])
        print(report["compare_markdown"])
        print(f"suite {report['suite']}: {len(report['experiments'])} experiments in {report['wall_seconds'] / 60:.1f} "
              f"min; table {report['table']}, comparisons {report['compare']}")
    return 0
