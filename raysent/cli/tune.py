"""`raysent tune FILE.yaml`: the search, then the best configuration on every seed."""

from __future__ import annotations

import argparse
import json
import os
from typing import TYPE_CHECKING

from raysent.cli.common import EPILOG, disconnect_ray, is_connected, parse_set, stdout_for, yaml_dump
from raysent.config import no_search_part, with_overrides
from raysent.errors import RaysentError

if TYPE_CHECKING:
    from raysent.tune.state import Summary

# Lazy imports: raysent's heavier modules (the command's work is imported when it runs, so `raysent --help` and every
# other command start without torch, Ray or MLflow).


def register(sub) -> None:
    tu = sub.add_parser("tune", help="search an experiment's space with Ray Tune + Optuna, then run the best "
                        "configuration on every seed", description="Search phase: search.num_samples configurations "
                        "(Optuna TPE by default), each trained search.seeds times through Ray Train (the search sees "
                        "the mean). Final phase: the best configuration trained on every seed of `seeds` and "
                        "evaluated on the test sets (eval.tasks). Every run is written to "
                        "results/<experiment>/runs/*.json and to MLflow (default sqlite:///results/mlflow.db).",
                        epilog=EPILOG + "  RAY_ADDRESS        Ray cluster to join (like --address)\n"
                        "  MLFLOW_TRACKING_URI  MLflow store (default sqlite:///results/mlflow.db)\n",
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    tu.add_argument("config", nargs="?", help="experiment YAML with a search part (see search_spaces/)")
    tu.add_argument("--config", dest="config_opt", metavar="FILE",
                    help="the experiment YAML (same as the positional argument; e.g. with --final-only best.yaml)")
    tu.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a fixed value; repeatable")
    tu.add_argument("--dry-run", action="store_true", help="check the model, data, batch sizes, resources and results "
                    "folder, print the plan (trials, seeds, resources, where results go) and the estimated time, and "
                    "exit without training")
    tu.add_argument("--resume", action="store_true", help="continue the interrupted search of this experiment "
                    "(Tuner.restore): finished trials kept, none run twice")
    tu.add_argument("--final-only", action="store_true", help="skip the search: run the configuration as given "
                    "(e.g. results/<experiment>/best.yaml) on every seed and evaluate on the test sets")
    tu.add_argument("--address", help="Ray cluster address: auto, or ray://HOST:10001 (default: RAY_ADDRESS, else "
                    "a local Ray)")
    tu.add_argument("--format", choices=["text", "json"], default="text", help="summary format")
    tu.add_argument("--quiet", action="store_true",
                    help="no progress lines and no Tune tables; the summary still prints")
    tu.set_defaults(func=run)


def run(args) -> int:
    from raysent.api import resolve_config

    path = args.config_opt or args.config
    if not path:
        raise RaysentError("raysent tune: give the experiment YAML (raysent tune FILE.yaml, or --config FILE.yaml)")
    cfg = resolve_config(path, parse_set(args.set))
    if cfg.search is None and not args.final_only:  # before the search's modules (torch, Ray, MLflow) load
        raise no_search_part(path)
    if args.address:
        cfg = with_overrides(cfg, {"resources.address": args.address})
    if args.dry_run:
        from raysent.preflight import check_address, preflight
        from raysent.tune.cost import rough_estimate
        from raysent.tune.driver import experiment_dir
        from raysent.tune.plan import dry_run

        joined = False
        if (cfg.resources.address or os.environ.get("RAY_ADDRESS")) and not is_connected():
            # a cluster named by address is joined (nothing is started on it) to read what it has and what its
            # autoscaler can add: how many trials run at once, and on what; left again below
            from raysent.train.ray_train import init_ray

            check_address(cfg)  # a wrong address: one line in seconds, not ray.init's wait
            init_ray(cfg, log_to_driver=False)
            joined = True
        p = {**dry_run(cfg, experiment_dir(cfg), final_only=args.final_only).to_dict(),
             "estimate": rough_estimate(cfg, searched=not args.final_only and cfg.search is not None)}
        try:  # the same checks as a real run makes before its first trial
            p["checked"] = preflight(cfg, mlflow=True)
        except RaysentError:
            p["checked"] = "FAILED: the run would stop here (the error below)"
            raise  # exit 2, after the plan
        finally:
            print(json.dumps(p, indent=2, default=str) if args.format == "json" else yaml_dump(p))
            if joined:
                disconnect_ray()
        return 0
    from raysent.api import tune_search
    from raysent.tune.publish import PublishError

    try:
        with stdout_for(args.format):
            try:
                result = tune_search(cfg, resume=args.resume, final_only=args.final_only, quiet=args.quiet)
            finally:
                disconnect_ray()
    except PublishError as exc:  # the search finished; MLflow did not take its outcome: the summary, then why
        if exc.result is not None:
            _print(exc.result.summary, args.format)
        raise
    _print(result.summary, args.format)
    return 0


def _print(summary: Summary, fmt: str) -> None:
    from raysent.report.summary import format_summary

    print(json.dumps(summary.model_dump(mode="json"), indent=2) if fmt == "json" else format_summary(summary))
