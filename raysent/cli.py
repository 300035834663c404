"""The ``raysent`` command.

    raysent train FILE.yaml        train one configuration (one worker here, or N with Ray Train)
    raysent eval --model M         the 7-set STS table of any encoder (or a model raysent trained)
    raysent eval --model M --layers  the per-layer × pooling STS-B dev grid of an encoder
    raysent table [EXPERIMENT...]  paper-style mean±std tables (md, tex, csv), --published beside them
    raysent plot EXPERIMENT        PNG plots: dev curves, score per hyperparameter, Optuna's plots
    raysent compare RUN_A RUN_B    per-data-set differences with a paired test across seeds
    raysent methods                every method with its variants and paper defaults
    raysent data                   the named data sets and where each one is found

Errors a user can cause (a bad config, a malformed file, a missing model) are printed as one
clear message and exit with status 2; no traceback from inside a library.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

import yaml

from raysent.errors import Interrupted, RaysentError

EPILOG = """environment:
  RAYSENT_DATA_DIR   folder with the layout of shared/data, looked at before the Hugging Face hub
  RAYSENT_MODEL_DIR  folder of save_pretrained model folders, looked at before the hub
  HF_HUB_OFFLINE=1   never try the hub (fail fast with a message that says where raysent looked)
"""


def _parse_set(values: list[str] | None) -> dict:
    """``--set key=value`` pairs; values are read as YAML (numbers, lists, true/false)."""
    out = {}
    for item in values or []:
        if "=" not in item:
            raise RaysentError(f"--set {item!r}: expected KEY=VALUE, e.g. --set temperature=0.1")
        key, _, value = item.partition("=")
        try:
            out[key.strip()] = yaml.safe_load(value)
        except yaml.YAMLError:
            out[key.strip()] = value
    return out


# --------------------------------------------------------------------------- train
def cmd_tune(args) -> int:
    from raysent.config import load_config, with_overrides

    path = args.config_opt or args.config
    if not path:
        raise RaysentError("raysent tune: give the experiment YAML (raysent tune FILE.yaml, or --config FILE.yaml)")
    cfg = load_config(path, overrides=_parse_set(args.set))
    if args.address:
        cfg = with_overrides(cfg, {"resources.address": args.address})
    from raysent.tune.search import format_summary, plan, tune_experiment

    if args.dry_run:
        p = plan(cfg, final_only=args.final_only)
        print(json.dumps(p, indent=2, default=str) if args.format == "json" else yaml_dump(p))
        return 0
    with _stdout_for(args.format):
        summary = tune_experiment(cfg, resume=args.resume, final_only=args.final_only, quiet=args.quiet,
                                  source=str(path))
        _disconnect_ray()
    print(json.dumps(summary, indent=2, default=str) if args.format == "json" else format_summary(summary))
    return 0


def cmd_suite(args) -> int:
    from raysent.tune.suite import plan, report_only, run_suite

    only = _split_fields(args.only) or None
    if args.dry_run:
        p = plan(args.suite, only=only)
        print(json.dumps(p, indent=2, default=str) if args.format == "json" else yaml_dump(p))
        return 0
    if args.report_only:
        report = report_only(args.suite)
        print(report["table_markdown"])
        print(report["compare_markdown"])
        return 0
    with _stdout_for(args.format):
        report = run_suite(args.suite, resume=args.resume, only=only,
                           say=lambda m: print(m, file=sys.stderr, flush=True))
        _disconnect_ray()
    if args.format == "json":
        print(json.dumps({k: v for k, v in report.items() if not k.endswith("_markdown")}, indent=2, default=str))
    else:
        print(report["table_markdown"])
        print(report["compare_markdown"])
        print(f"suite {report['suite']}: {len(report['experiments'])} experiments in {report['wall_seconds'] / 60:.1f} "
              f"min; table {report['table']}, comparisons {report['compare']}")
    return 0


def _stdout_for(fmt: str):
    """With --format json, stdout carries the JSON alone: what Ray and Tune print meanwhile (worker
    logs forwarded to the driver, Tune's status tables) goes to stderr."""
    import contextlib

    return contextlib.redirect_stdout(sys.stderr) if fmt == "json" else contextlib.nullcontext()


def _disconnect_ray() -> None:
    """Leave Ray before the summary is printed: Ray holds back worker log lines that repeat across
    processes (its log deduplication) and prints what it still holds when the driver disconnects, which
    would otherwise be at exit, after the summary."""
    import ray

    if ray.is_initialized():
        ray.shutdown()


def yaml_dump(obj) -> str:
    import yaml

    return yaml.safe_dump(obj, sort_keys=False, default_flow_style=None).rstrip()


def cmd_train(args) -> int:
    from raysent.config import load_config

    cfg = load_config(args.config, overrides=_parse_set(args.set))
    if args.output_dir:
        from raysent.config import with_overrides

        cfg = with_overrides(cfg, {"train.output_dir": args.output_dir})
    if args.print_config:
        print(cfg.to_yaml())
        return 0
    if cfg.resources.workers:
        from raysent.train.ray_train import train_with_ray

        with _stdout_for(args.format):
            summary = train_with_ray(cfg, resume=args.resume, quiet=args.quiet)
            _disconnect_ray()
    else:
        from raysent.train.run import train_in_process

        summary = train_in_process(cfg, resume=args.resume, quiet=args.quiet)
    _print_train_summary(summary, args.format)
    return 0


def _print_train_summary(summary: dict, fmt: str) -> None:
    if fmt == "json":
        print(json.dumps({k: v for k, v in summary.items() if k != "config"}, indent=2, default=str))
        return
    init = (summary.get("initial_dev") or {}).get("dev_spearman")
    lines = [
        f"method {summary['method']}  seed {summary['seed']}  model {summary['model']}",
        f"steps {summary['final_step']}/{summary['total_steps']}"
        + ("  (stopped early)" if summary.get("stopped_early") else "")
        + f"  in {summary['train_seconds']:.0f} s on {summary['workers']} worker(s)",
        (f"dev Spearman: untuned {init:.2f} -> best {summary['best_dev_spearman']:.2f} at step {summary['best_step']}"
         if init is not None else f"best dev Spearman {summary['best_dev_spearman']:.2f} at step {summary['best_step']}"),
        f"best model: {summary['best_model_dir']}",
        f"result: {Path(summary['output_dir']) / 'result.json'}",
    ]
    if summary.get("transductive"):
        lines.append("setting: transductive (trained on the unlabelled text of evaluation sets)")
    for note in summary.get("data", {}).get("notes", []):
        lines.append(f"note: {note}")
    print("\n".join(lines))


# --------------------------------------------------------------------------- eval
def _default_pooling(encoder) -> str | None:
    if encoder.meta.pooling:
        return encoder.meta.pooling
    st = Path(encoder.source) / "1_Pooling" / "config.json"  # a sentence-transformers model
    if st.is_file():
        cfg = json.loads(st.read_text())
        for key, name in (("pooling_mode_mean_tokens", "mean"), ("pooling_mode_cls_token", "cls_before_pooler"),
                          ("pooling_mode_max_tokens", "max")):
            if cfg.get(key):
                return name
    return None


def cmd_eval(args) -> int:
    import time

    started = time.perf_counter()
    from raysent.eval.suite import check_tasks

    tasks = check_tasks(args.tasks, field="--tasks")  # before importing torch and loading the model
    if args.layers and (tasks != ["sts"] or args.pooling):
        raise RaysentError("--layers scores every layer with each of --layer-poolings on the --dev sets; it cannot "
                           "be combined with --tasks or --pooling")
    if args.plot and not args.layers:
        raise RaysentError("--plot writes the --layers grid; add --layers")
    from raysent.eval.sts import TASK_LABELS, evaluate_dev, evaluate_sts, format_table
    from raysent.models.embedder import Embedder
    from raysent.models.encoder import Encoder
    from raysent.models.pooling import describe_allowed, is_valid_pooling

    if args.threads is not None:
        if args.threads < 1:
            raise RaysentError(f"--threads {args.threads}: expected a positive number of CPU threads")
        import torch

        torch.set_num_threads(args.threads)
    encoder = Encoder.load(args.model)
    if args.layers:
        return _eval_layers(args, encoder)
    pooling = args.pooling or _default_pooling(encoder)
    if pooling is None:
        raise RaysentError(f"--pooling is needed: {args.model} does not say how its sentence vectors are read "
                           f"(no raysent.json, no sentence-transformers pooling config); allowed: {describe_allowed()}")
    if not is_valid_pooling(pooling):
        raise RaysentError(f"--pooling {pooling!r} is unknown; allowed: {describe_allowed()}")
    encoder.eval()

    def embed(tok):
        return encoder.embed(tok, pooling)

    embedder = Embedder(embed, encoder.tokenizer, module=encoder, max_length=args.max_length,
                        batch_size=args.batch_size)
    progress = None if args.format == "json" else (lambda m: print(m, file=sys.stderr))
    if args.split == "dev":
        if tasks != ["sts"]:
            raise RaysentError(f"--split dev evaluates the model-selection sets (--dev) only; it cannot be combined "
                               f"with --tasks {','.join(tasks)}")
        res = evaluate_dev(embedder, args.dev)
        res = {"model": args.model, "pooling": pooling, "split": "dev", **res}
        if args.format == "json":
            print(json.dumps(res, indent=2))
        else:
            for k, v in res.items():
                if k.startswith("dev"):
                    print(f"{k:24s} {v:.2f}")
        return 0
    if tasks == ["sts"]:  # the STS table alone: the output it has always had
        sts_sets = args.tasks_sts or list(TASK_LABELS)
        res = evaluate_sts(embedder, tasks=sts_sets, aggregation=args.aggregation, progress=progress)
        res = {"model": args.model, "pooling": pooling, "split": "test", **res}
        if args.format == "json":
            print(json.dumps(res, indent=2))
        else:
            print(format_table(res, title=f"{args.model}  pooling={pooling}"))
        return 0
    return _eval_suite(args, tasks, embedder, pooling, progress, started)


def _eval_layers(args, encoder) -> int:
    """``--layers``: Spearman of every (layer, pooling) on the --dev sets (raysent.eval.layers)."""
    from raysent.eval.layers import format_grid, layer_grid

    progress = None if args.format == "json" else (lambda m: print(m, file=sys.stderr))
    res = layer_grid(encoder, args.dev, poolings=args.layer_poolings, max_pairs=args.max_samples,
                     max_length=args.max_length, batch_size=args.batch_size, progress=progress)
    res["model"] = args.model
    if args.plot:
        from raysent.report.plots import plot_layer_grid

        res["plot"] = str(plot_layer_grid(res, args.plot))
    if args.format == "json":
        print(json.dumps(res, indent=2))
    else:
        print(format_grid(res, title=f"{args.model}: Spearman x100 per layer and pooling"))
        if args.plot:
            print(f"wrote {res['plot']}", file=sys.stderr)
    return 0


def _eval_suite(args, tasks: list[str], embedder, pooling: str, progress, started: float) -> int:
    """``--tasks`` with anything besides sts: raysent.eval.suite.evaluate_tasks."""
    import time

    from raysent.eval.suite import evaluate_tasks, format_tables

    options: dict[str, dict] = {
        "sts": {"aggregation": args.aggregation, **({"tasks": args.tasks_sts} if args.tasks_sts else {})},
        "senteval": {"classifier": args.probe, "kfold": args.kfold, "mrpc_features": args.mrpc_features,
                     "n_jobs": args.n_jobs, **({"nhid": args.nhid} if args.nhid is not None else {}),
                     **({"tasks": _split_list(args.senteval_tasks)} if args.senteval_tasks else {})},
        "search": {"data": args.search_data, "min_score": args.search_min_score},
        "geometry": {"data": args.geometry_data, "min_score": args.geometry_min_score},
        "sts17": {"tracks": _split_list(args.sts17_tracks)} if args.sts17_tracks else {},
    }
    res = evaluate_tasks(embedder, tasks, max_samples=args.max_samples,
                         options={t: options[t] for t in tasks}, progress=progress)
    res["seconds"]["wall_incl_model_load"] = time.perf_counter() - started
    if args.format == "json":
        out = {"model": args.model, "pooling": pooling, "split": "test", "tasks": res["tasks"],
               "metrics": res["metrics"], "details": res["details"], "seconds": res["seconds"],
               "sentences_embedded": res["sentences_embedded"], "notes": res["notes"]}
        print(json.dumps(out, indent=2, default=_json_default))
    else:
        print(format_tables(res, title=f"{args.model}  pooling={pooling}  tasks={','.join(tasks)}"))
    return 0


def _split_list(values: list[str] | None) -> list[str]:
    return [v.strip() for item in values or [] for v in item.split(",") if v.strip()]


def _json_default(o):
    import numpy as np

    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, set):
        return sorted(o)
    return str(o)


# --------------------------------------------------------------------------- report
def _split_fields(values: list[str] | None) -> list[str]:
    return [v.strip() for item in values or [] for v in item.split(",") if v.strip()]


def cmd_table(args) -> int:
    from raysent.report.runs import experiments, load_experiment
    from raysent.report.table import build_table, output_stem

    names = args.experiments or experiments(args.results_dir)
    if not names:
        raise RaysentError(f"no experiment with run files under {args.results_dir}/ (results/<experiment>/runs/*.json; "
                           "`raysent tune FILE.yaml` writes them)")
    runs = [r for name in names for r in load_experiment(name, args.results_dir, args.phase)]
    group_by = _split_fields(args.group_by)
    published_file = args.published_file
    if published_file is None and (Path(args.results_dir) / "published.yaml").is_file():
        published_file = Path(args.results_dir) / "published.yaml"
    table = build_table(runs, aggregation=args.aggregation, correlation=args.correlation, group_by=group_by,
                        published=args.published, published_file=published_file, dev=args.dev)
    if args.format == "markdown":
        print(table.to_markdown(), end="")
    elif args.format == "latex":
        print(table.to_latex(), end="")
    else:
        print(table.to_csv(), end="")
    if not args.no_write:
        stem = args.output or output_stem(args.results_dir, names, args.phase, args.aggregation, args.correlation,
                                          group_by, args.published)
        paths = table.write(stem)
        print(f"wrote {', '.join(str(p) for p in paths)}", file=sys.stderr)
    return 0


def cmd_plot(args) -> int:
    from raysent.report.plots import PLOT_KINDS, plot_experiment

    kinds = _split_fields(args.kinds) or list(PLOT_KINDS)
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


def cmd_compare(args) -> int:
    from raysent.report.compare import compare, format_comparison

    phase = None if args.phase == "any" else args.phase
    res = compare(args.runs, args.results_dir, phase=phase, aggregation=args.aggregation,
                  correlation=args.correlation)
    print(json.dumps(res, indent=2) if args.format == "json" else format_comparison(res, alpha=args.alpha))
    return 0


# --------------------------------------------------------------------------- methods / data
def cmd_bench(args) -> int:
    from raysent.bench import BenchOptions, format_markdown, run_bench, write_results

    try:
        import sentence_transformers  # noqa: F401
    except ImportError:
        raise RaysentError("raysent bench compares with sentence-transformers, which is not installed: "
                           "pip install -e '.[bench]'") from None
    opts = BenchOptions(model=args.model, batch_size=args.batch_size, max_length=args.max_length, steps=args.steps,
                        warmup=args.warmup, parts=_split_list([args.parts]), methods=_split_list([args.methods]),
                        overhead_steps=args.overhead_steps, overhead_trials=args.overhead_trials,
                        eval_repeats=args.eval_repeats, cpus=args.cpus,
                        eval_sets=_split_list([args.eval_sets]), speedups=_split_list([args.speedups]),
                        threads=args.threads, output_dir=args.output_dir, peak_tflops=args.peak_tflops,
                        grad_cache_rows=args.grad_cache_rows, grad_cache_batch=args.grad_cache_batch)
    result = run_bench(opts, say=lambda m: print(m, file=sys.stderr, flush=True))
    json_path, md_path = write_results(result, opts.output_dir)
    print(format_markdown(result))
    print(f"written: {json_path} and {md_path}")
    if result.get("interrupted"):
        return 130
    if result.get("failed"):
        print(f"raysent bench: failed: {', '.join(result['failed'])} (the others were measured and written)",
              file=sys.stderr)
        return 1
    return 0


def cmd_methods(args) -> int:
    from raysent.methods import METHODS

    rows = []
    for name, cls in METHODS.items():
        params = cls.Params()
        defaults = cls.defaults(params)
        rows.append({
            "method": name,
            "paper": cls.paper,
            "trains": cls.summary,
            "data": cls.data_kind(params),
            "variants": {k: list(v) for k, v in cls.variants.items()},
            "params": params.model_dump(mode="json"),
            "train": defaults["train"],
            "train_data": defaults["data"].get("train"),
            "seeds": list(cls.seeds),
        })
    if args.format == "json":
        print(json.dumps(rows, indent=2))
        return 0
    for r in rows:
        print(f"{r['method']}  —  {r['paper']}")
        print(f"    trains:    {r['trains']}")
        print(f"    data:      {r['data']} (default {r['train_data']})")
        for k, v in r["variants"].items():
            print(f"    {k + ':':10s} {', '.join(map(str, v))}")
        print(f"    params:    {', '.join(f'{k}={v}' for k, v in r['params'].items())}")
        print(f"    train:     {', '.join(f'{k}={v}' for k, v in r['train'].items())}")
        print(f"    seeds:     {', '.join(map(str, r['seeds']))}")
        print()
    return 0


def cmd_data(args) -> int:
    from raysent.data.datasets import DATASETS, data_dir

    root = data_dir()
    print(f"RAYSENT_DATA_DIR = {root or '(not set)'}\n")
    for name, d in DATASETS.items():
        splits = list(dict.fromkeys([*d.local, *d.hub])) or [d.default_split]
        print(f"{name:16s} {d.kind:13s} splits {'/'.join(splits)} (default {d.default_split})"
              + ("  [transductive]" if d.transductive else ""))
        print(f"{'':16s} {d.description}")
        hubs = sorted({h.repo + (f'/{h.file}' if h.file else '') for h in d.hub.values()})
        if hubs:
            print(f"{'':16s} hub: {', '.join(hubs)}")
    print(f"{'path:FILE':16s} your own .txt (a sentence a line), .tsv or .csv with a header")
    return 0


# --------------------------------------------------------------------------- parser
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="raysent",
        description="Train, tune and compare contrastive sentence-embedding methods "
        "(SimCSE, SG-OPT, ConSERT, layer-wise attention pooling, SupCon) with Ray and MLflow.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

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
    t.add_argument("--format", choices=["text", "json"], default="text", help="summary format")
    t.add_argument("--quiet", action="store_true", help="no progress lines")
    t.set_defaults(func=cmd_train)

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
    tu.add_argument("--dry-run", action="store_true", help="print the plan (trials, seeds, resources, where results "
                    "go) and exit without training")
    tu.add_argument("--resume", action="store_true", help="continue the interrupted search of this experiment "
                    "(Tuner.restore): finished trials kept, none run twice")
    tu.add_argument("--final-only", action="store_true", help="skip the search: run the configuration as given "
                    "(e.g. results/<experiment>/best.yaml) on every seed and evaluate on the test sets")
    tu.add_argument("--address", help="Ray cluster address: auto, or ray://HOST:10001 (default: RAY_ADDRESS, else "
                    "a local Ray)")
    tu.add_argument("--format", choices=["text", "json"], default="text", help="summary format")
    tu.add_argument("--quiet", action="store_true", help="no progress lines of raysent's own")
    tu.set_defaults(func=cmd_tune)

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
    su.set_defaults(func=cmd_suite)

    e = sub.add_parser("eval", help="evaluate an encoder: STS, SentEval transfer, search, geometry, STS17",
                       description="Evaluate an encoder. --tasks sts (default): STS12-16, STS-B and SICK-R (test) "
                       "or dev sets (--split dev); Spearman x100 of cosine, STS12-16 aggregated as 'all' by default. "
                       "Other tasks (comma-separated): senteval (MR CR SUBJ MPQA SST2 TREC MRPC, SentEval's "
                       "protocol: logistic-regression or MLP probe, accuracy x100), search (FAISS, MRR@10, "
                       "recall@k, ms/query, index MB), geometry (alignment, uniformity, singular values), sts17 "
                       "(multilingual STS, Pearson x100). Every distinct sentence is embedded once.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    e.add_argument("--model", required=True, help="hub id, folder, or a name under RAYSENT_MODEL_DIR")
    e.add_argument("--pooling", help="cls, cls_before_pooler, mean, max, first_last_avg, last2_avg, "
                   "layer<K>_<cls|mean|max> (default: what the model's raysent.json or "
                   "sentence-transformers config says)")
    e.add_argument("--tasks", default="sts", metavar="T1,T2",
                   help="evaluation tasks, comma-separated, from: sts, senteval, search, geometry, sts17 "
                   "(default: sts)")
    e.add_argument("--split", choices=["test", "dev"], default="test",
                   help="test: the evaluation tasks; dev: model-selection sets (--dev)")
    e.add_argument("--dev", nargs="+", default=["stsb:dev"], metavar="SPEC", help="dev sets for --split dev")
    e.add_argument("--tasks-sts", nargs="+", metavar="TASK", help="subset of sts12 sts13 sts14 sts15 sts16 stsb sickr")
    e.add_argument("--aggregation", choices=["all", "mean", "wmean"], default="all",
                   help="STS12-16 headline aggregation (all three are in the JSON)")
    g = e.add_argument_group("senteval")
    g.add_argument("--senteval-tasks", nargs="+", metavar="TASK",
                   help="subset of MR CR SUBJ MPQA SST2 TREC MRPC (default: all seven)")
    g.add_argument("--probe", choices=["logreg", "mlp"], default="logreg",
                   help="logreg: scikit-learn logistic regression (SentEval's usepytorch=False); mlp: SentEval's "
                   "PyTorch MLP (default: logreg)")
    g.add_argument("--nhid", type=int, help="hidden units of the mlp probe (default 50; 0: PyTorch logistic "
                   "regression, SimCSE's setting)")
    g.add_argument("--kfold", type=int, default=10, help="folds of the (inner) cross-validation (default 10)")
    g.add_argument("--mrpc-features", choices=["senteval", "full"], default="senteval",
                   help="MRPC classifier input: senteval = (|u-v|, u*v) as SentEval; full = (u, v, |u-v|, u*v)")
    g.add_argument("--n-jobs", type=int, default=1, help="probe fits run in parallel (processes)")
    g = e.add_argument_group("search and geometry")
    g.add_argument("--search-data", default="stsb:test", metavar="SPEC",
                   help="scored pairs whose high-score pairs are (query, relevant doc); e.g. stsb:test (default), "
                   "stsb:train+dev+test, sickr:test, quora-duplicates (hub), path:FILE")
    g.add_argument("--search-min-score", type=float,
                   help="gold score a pair needs to count as relevant (default 4.0; 1.0 for 0/1 labels)")
    g.add_argument("--geometry-data", default="stsb:test", metavar="SPEC",
                   help="scored pairs for alignment (pairs >= --geometry-min-score) and uniformity/spectrum "
                   "(all sentences) (default stsb:test)")
    g.add_argument("--geometry-min-score", type=float, default=4.0, help="positive pairs for alignment (default 4.0)")
    g.add_argument("--sts17-tracks", nargs="+", metavar="TRACK",
                   help="subset of ar-ar ar-en es-es es-en.track4a es-en.track4b en-en (default: all)")
    g = e.add_argument_group("layers")
    g.add_argument("--layers", action="store_true",
                   help="score every layer (0 = embeddings .. L) with each of --layer-poolings on the --dev sets "
                   "(default stsb:dev): the layer x pooling grid of SG-BERT's Figure 1")
    g.add_argument("--layer-poolings", nargs="+", default=["cls", "mean", "max"], metavar="P",
                   help="poolings of the grid, from cls (the layer's raw [CLS]), mean, max (default: all three)")
    g.add_argument("--plot", metavar="FILE.png", help="with --layers: also write the grid as a PNG heatmap")
    e.add_argument("--max-samples", type=int, metavar="N",
                   help="quick check: at most N rows per split / pairs per set for senteval, search, geometry "
                   "and sts17, and the first N pairs of each --dev set for --layers (noted in the output; not the "
                   "published protocol)")
    e.add_argument("--threads", type=int, help="CPU threads for embedding (torch.set_num_threads; default: torch's)")
    e.add_argument("--max-length", type=int, default=256, help="max tokens per sentence")
    e.add_argument("--batch-size", type=int, default=128)
    e.add_argument("--format", choices=["table", "text", "json"], default="table",
                   help="table/text: printed tables; json: every number")
    e.set_defaults(func=cmd_eval)

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
    tb.set_defaults(func=cmd_table)

    pl = sub.add_parser("plot", help="PNG plots of an experiment: dev curves, score per hyperparameter, Optuna's "
                        "importance and parallel-coordinate plots",
                        description="Writes results/<experiment>/plots/dev_curves.png (dev score over steps per "
                        "seed), search_hyperparameters.png (best dev score against each searched hyperparameter), "
                        "optuna_importances.png and optuna_parallel_coordinate.png (Optuna's own matplotlib plots "
                        "of the study in results/<experiment>/optuna.db). The layer x pooling grid is "
                        "`raysent eval --model M --layers --plot FILE.png`.")
    pl.add_argument("experiment", help="experiment name (a folder under --results-dir)")
    pl.add_argument("--kinds", action="append", metavar="K1,K2",
                    help="subset of dev, hp, importance, parallel (default: all four)")
    pl.add_argument("--search", metavar="ID", help="one search's runs and study (default: every run; the study of "
                    "the experiment's last search)")
    pl.add_argument("--results-dir", default="results")
    pl.add_argument("--output-dir", metavar="DIR", help="default results/<experiment>/plots")
    pl.set_defaults(func=cmd_plot)

    cp = sub.add_parser("compare", help="per-data-set differences between runs, paired t-test and Wilcoxon across "
                        "seeds", description="RUN: an experiment (its final-phase runs), EXPERIMENT:CONFIG_ID, a "
                        "config_id, or a quoted glob of run files (e.g. 'results/quick/runs/final-*.json'); each "
                        "must name one configuration per seed. Every RUN after the first is compared with the "
                        "first, seed by seed: Δ = B − A, scipy.stats.ttest_rel and scipy.stats.wilcoxon (two-sided).",
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    cp.add_argument("runs", nargs="+", metavar="RUN")
    cp.add_argument("--phase", choices=["final", "search", "any"], default="final",
                    help="phase of the runs an experiment or config_id names (default final; globs are taken as given)")
    cp.add_argument("--aggregation", choices=["all", "mean", "wmean"], default="all")
    cp.add_argument("--correlation", choices=["spearman", "pearson"], default="spearman")
    cp.add_argument("--alpha", type=float, default=0.05, help="p-values below it are marked * (default 0.05)")
    cp.add_argument("--results-dir", default="results")
    cp.add_argument("--format", choices=["text", "json"], default="text")
    cp.set_defaults(func=cmd_compare)

    m = sub.add_parser("methods", help="list the methods, their variants and paper defaults",
                       description="Every registered method with its paper, variants, hyperparameter defaults "
                       "(params), training defaults and seeds.")
    m.add_argument("--format", choices=["text", "json"], default="text")
    m.set_defaults(func=cmd_methods)

    from raysent.bench import METHODS as BENCH_METHODS, PARTS as BENCH_PARTS, BenchOptions

    bd = BenchOptions()
    b = sub.add_parser("bench", help="measure training, evaluation and orchestration speed side by side with "
                       "sentence-transformers; writes results/bench/<date>.{json,md}",
                       description="Side-by-side speed measurements on one model, batch size and sequence length: "
                       "training steps/s and peak memory of every method and of sentence-transformers' "
                       "MultipleNegativesRankingLoss (training), each speedup on and off (speedups), the 7-set STS "
                       "evaluation against sentence-transformers' EmbeddingSimilarityEvaluator with equal scores "
                       "checked (evaluation), the same run bare, on one Ray Train worker and in a Ray Tune trial "
                       "(overhead), and bf16 throughput and MFU on a GPU (gpu). Each training case runs in a fresh "
                       "process. Needs sentence-transformers (pip install -e '.[bench]').",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    b.add_argument("--model", default=bd.model, help=f"encoder (default {bd.model})")
    b.add_argument("--batch-size", type=int, default=bd.batch_size, help=f"training batch (default {bd.batch_size})")
    b.add_argument("--max-length", type=int, default=bd.max_length,
                   help=f"training sequence length (default {bd.max_length})")
    b.add_argument("--steps", type=int, default=bd.steps, help=f"timed steps per case (default {bd.steps})")
    b.add_argument("--warmup", type=int, default=bd.warmup, help=f"untimed steps first (default {bd.warmup})")
    b.add_argument("--parts", default=",".join(BENCH_PARTS),
                   help=f"comma-separated parts to run (default all: {','.join(BENCH_PARTS)})")
    b.add_argument("--methods", default=",".join(BENCH_METHODS),
                   help="comma-separated methods of the training part (default: every training method)")
    b.add_argument("--overhead-steps", type=int, default=bd.overhead_steps,
                   help=f"steps of the run the overhead part repeats four ways (default {bd.overhead_steps})")
    b.add_argument("--overhead-trials", type=int, default=bd.overhead_trials,
                   help="Tune trials of each Tune way, one after another as a search runs them: trials training "
                        "in their own process reuse the process of the trial before, trials running Ray Train "
                        f"start their own (default {bd.overhead_trials})")
    b.add_argument("--eval-repeats", type=int, default=bd.eval_repeats,
                   help=f"runs of each evaluator, the fastest counts (default {bd.eval_repeats})")
    b.add_argument("--speedups", default=",".join(bd.speedups),
                   help="speedups the speedups part turns on and off (default all: " + ",".join(bd.speedups) + ")")
    b.add_argument("--eval-sets", default=",".join(bd.eval_sets),
                   help="STS test sets of the evaluation part (default all seven)")
    b.add_argument("--grad-cache-batch", type=int, default=bd.grad_cache_batch,
                   help=f"batch of the gradient-caching case (default {bd.grad_cache_batch})")
    b.add_argument("--grad-cache-rows", type=int, default=None,
                   help="chunk rows of the gradient-caching case (default: an eighth of its batch)")
    b.add_argument("--cpus", type=float, default=bd.cpus, help=f"CPUs a Ray trial may use (default {bd.cpus:g})")
    b.add_argument("--threads", type=int, default=None, help="torch threads of each training case (default torch's)")
    b.add_argument("--peak-tflops", type=float, default=None,
                   help="the GPU's dense bf16 peak for MFU (default: looked up by device name)")
    b.add_argument("--output-dir", default=bd.output_dir, help=f"where the JSON and markdown go (default {bd.output_dir})")
    b.set_defaults(func=cmd_bench)

    d = sub.add_parser("data", help="list the named data sets and where they are found",
                       description="Named data sets (local RAYSENT_DATA_DIR first, the Hugging Face hub second).")
    d.set_defaults(func=cmd_data)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("raysent").setLevel(logging.DEBUG if args.verbose else logging.INFO)
    if args.command is None:
        parser.print_help()
        return 2
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        return args.func(args)
    except Interrupted as exc:
        print(f"raysent: {exc}", file=sys.stderr)
        return 130
    except RaysentError as exc:
        print(f"raysent: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("raysent: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
