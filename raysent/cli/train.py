"""`raysent train FILE.yaml`: one configuration, in this process or on N Ray Train workers."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from raysent.cli.common import EPILOG, disconnect_ray, parse_set, stdout_for, yaml_dump
from raysent.train.records import TrainSummary

# Lazy imports: raysent's heavier modules (the command's work is imported when it runs, so `raysent --help` and every
# other command start without torch, Ray or MLflow).


def register(sub) -> None:
    t = sub.add_parser("train", help="train one configuration of an experiment YAML",
                       description="Train the experiment's configuration once (train.seed). Without "
                       "resources.workers it runs in this process; with it, through Ray Train on that many "
                       "workers. The best model (by mean dev Spearman) is saved with save_pretrained in "
                       "<output_dir>/best, the run summary in <output_dir>/result.json.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    t.add_argument("config", help="experiment YAML (see search_spaces/)")
    t.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a hyperparameter (flat name, e.g. temperature=0.1, lr=1e-4, or a dotted "
                        "path, e.g. data.train=stsb-unlabeled); repeatable")
    t.add_argument("--output-dir", help="where the run's files go (default results/<name>/train/<method>-seed<seed>)")
    t.add_argument("--resume", action="store_true", help="continue from the last checkpoint in the output dir")
    t.add_argument("--print-config", action="store_true", help="print the resolved config (defaults filled) and exit")
    t.add_argument("--dry-run", action="store_true", help="check the model, data, batch size, resources and output "
                   "folder, print what was found and the estimated time, and exit without training")
    t.add_argument("--format", choices=["text", "json"], default="text", help="summary format")
    t.add_argument("--quiet", action="store_true", help="no progress lines")
    t.set_defaults(func=run)


def run(args) -> int:
    from raysent.api import fit, resolve_config

    overrides = parse_set(args.set)
    if args.output_dir:
        overrides["train.output_dir"] = args.output_dir
    cfg = resolve_config(args.config, overrides)
    if args.print_config:
        print(cfg.to_yaml())
        return 0
    if args.dry_run:
        from raysent.preflight import preflight
        from raysent.tune.cost import rough_estimate

        report = {"checked": preflight(cfg, output_dir=True), "estimate": rough_estimate(cfg, searched=False)}
        print(json.dumps(report, indent=2, default=str) if args.format == "json" else yaml_dump(report))
        return 0
    with stdout_for(args.format):
        summary = fit(cfg, resume=args.resume, quiet=args.quiet)  # checks first: one error listing every problem
        disconnect_ray()
    _print_train_summary(summary, args.format)
    return 0


def _print_train_summary(summary: TrainSummary, fmt: str) -> None:
    if fmt == "json":
        print(json.dumps(summary.model_dump(exclude={"config"}), indent=2, default=str))
        return
    init = (summary.initial_dev or {}).get("dev_spearman")
    lines = [
        f"method {summary.method}  seed {summary.seed}  model {summary.model}",
        f"steps {summary.final_step}/{summary.total_steps}"
        + ("  (stopped early)" if summary.stopped_early else "")
        + f"  in {summary.train_seconds:.0f} s on {summary.workers} worker(s)",
        (f"dev Spearman: untuned {init:.2f} -> best {summary.best_dev_spearman:.2f} at step "
         f"{summary.best_step}" if init is not None
         else f"best dev Spearman {summary.best_dev_spearman:.2f} at step {summary.best_step}"),
        f"best model: {summary.best_model_dir}",
        f"result: {Path(str(summary.output_dir)) / 'result.json'}",
    ]
    if summary.transductive:
        lines.append("setting: transductive (trained on the unlabelled text of evaluation sets)")
    for note in summary.data.get("notes", []):
        lines.append(f"note: {note}")
    print("\n".join(lines))
