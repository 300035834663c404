"""`raysent eval --model M`: STS, SentEval transfer, search, geometry, STS17, the layer grid."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from raysent.cli.common import EPILOG, add_schema_options, json_default, split_list
from raysent.config import EvalConfig
from raysent.errors import RaysentError

# Lazy imports: pydantic, torch, raysent's heavier modules (the command's work is imported when it runs, so `raysent
# --help` and every other command start without torch, Ray or MLflow).

# the eval.* fields `raysent eval` takes as options
EVAL_OPTIONS = ("aggregation", "max_length", "batch_size", "senteval_tasks", "probe", "nhid", "kfold",
                "mrpc_features", "search_data", "search_min_score", "geometry_data", "geometry_min_score",
                "sts17_tracks")


def register(sub) -> None:
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
    # options an experiment file also holds (eval.*): defined once, in raysent.config.EvalConfig
    add_schema_options(e, EvalConfig, ["aggregation", "max_length", "batch_size"],
                       defaults={"max_length": (None, "what the model was saved with (raysent.json), else 256")})
    g = e.add_argument_group("senteval")
    add_schema_options(g, EvalConfig, ["senteval_tasks", "probe", "nhid", "kfold", "mrpc_features"],
                       metavars={"senteval_tasks": "TASK"})
    g.add_argument("--n-jobs", type=int, default=1, help="probe fits run in parallel (processes)")
    g = e.add_argument_group("search and geometry")
    add_schema_options(g, EvalConfig, ["search_data", "search_min_score", "geometry_data", "geometry_min_score",
                                       "sts17_tracks"], metavars={"search_data": "SPEC", "geometry_data": "SPEC",
                                                                  "sts17_tracks": "TRACK"})
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
    e.add_argument("--format", choices=["table", "text", "json"], default="table",
                   help="table/text: printed tables; json: every number")
    e.set_defaults(func=run)


def _eval_config(args, tasks: list[str]) -> EvalConfig:
    """The eval.* options given on the command line, checked as an experiment file's are."""
    from pydantic import ValidationError

    values = {k: getattr(args, k) for k in EVAL_OPTIONS if getattr(args, k) is not None}
    for k in ("senteval_tasks", "sts17_tracks"):  # repeatable or comma-separated
        values[k] = split_list(values.get(k)) or None
    try:
        return EvalConfig(tasks=tasks, sts_sets=args.tasks_sts, **values)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise RaysentError(f"--{str(err['loc'][0]).replace('_', '-')} {err.get('input')!r}: {err['msg']}") from None


def check_model_files(model: str) -> None:
    """A local model folder that cannot load (no config.json, weights cut short: :func:`raysent.models.locate.
    check_weights`) is refused from its files, in milliseconds, before torch is imported and the weights read."""
    from raysent.models.locate import check_weights, resolve_model

    where, _ = resolve_model(model)
    if Path(where).is_dir():
        check_weights(where)


def _dev_sets(args, tasks: list[str]) -> dict:
    """``--split dev``: the --dev sets, read and checked (a set whose gold scores are all equal is refused) before
    the model loads."""
    if tasks != ["sts"]:
        raise RaysentError(f"--split dev evaluates the model-selection sets (--dev) only; it cannot be combined "
                           f"with --tasks {','.join(tasks)}")
    from raysent.data.datasets import check_scores_vary, load
    from raysent.eval.sts import DEV_USE

    sets = {spec: load(spec, "scored_pairs") for spec in args.dev}
    for data in sets.values():
        check_scores_vary(data, DEV_USE)
    return sets


def run(args) -> int:
    started = time.perf_counter()
    from raysent.eval.suite import check_tasks

    tasks = check_tasks(args.tasks, field="--tasks")  # before importing torch and loading the model
    args.eval_config = _eval_config(args, tasks)
    if args.layers and (tasks != ["sts"] or args.pooling):
        raise RaysentError("--layers scores every layer with each of --layer-poolings on the --dev sets; it cannot "
                           "be combined with --tasks or --pooling")
    if args.plot and not args.layers:
        raise RaysentError("--plot writes the --layers grid; add --layers")
    check_model_files(args.model)
    dev_sets = _dev_sets(args, tasks) if args.split == "dev" and not args.layers else None
    from raysent.api import evaluate, load
    from raysent.eval.results import StsResult
    from raysent.eval.sts import TASK_LABELS, evaluate_dev, format_table
    from raysent.models.pooling import check_pooling

    if args.threads is not None:
        if args.threads < 1:
            raise RaysentError(f"--threads {args.threads}: expected a positive number of CPU threads")
        import torch

        torch.set_num_threads(args.threads)
    if args.pooling:
        check_pooling(args.pooling, "--pooling", error=RaysentError)
    if args.layers:
        from raysent.models.encoder import Encoder

        return _eval_layers(args, Encoder.load(args.model))
    # the tokens per sentence: --max-length, else what the model was exported with (raysent.json), else 256
    encoder = load(args.model, pooling=args.pooling, max_length=args.max_length, batch_size=args.batch_size)
    progress = None if args.format == "json" else (lambda m: print(m, file=sys.stderr))
    if dev_sets is not None:
        res = {"model": args.model, "pooling": encoder.pooling, "split": "dev",
               **evaluate_dev(encoder.encode, args.dev, sets=dev_sets)}
        if args.format == "json":
            print(json.dumps(res, indent=2))
        else:
            for k, v in res.items():
                if k.startswith("dev"):
                    print(f"{k:24s} {v:.2f}")
        return 0
    options = args.eval_config.task_options(n_jobs=args.n_jobs)
    if tasks == ["sts"]:
        options["sts"] = {"tasks": args.tasks_sts or list(TASK_LABELS), "aggregation": args.aggregation}
    result = evaluate(encoder, tasks, max_samples=args.max_samples, options={t: options[t] for t in tasks},
                      progress=progress)
    if tasks == ["sts"]:  # the STS table alone: the output it has always had
        sts = result.details["sts"]
        assert isinstance(sts, StsResult)
        if args.format == "json":
            print(json.dumps({"model": args.model, "pooling": encoder.pooling, "split": "test",
                              **sts.model_dump(mode="json", exclude_none=True)}, indent=2))
        else:
            print(format_table(sts, title=f"{args.model}  pooling={encoder.pooling}"))
        return 0
    result.seconds["wall_incl_model_load"] = time.perf_counter() - started
    if args.format == "json":
        out = {"model": args.model, "pooling": encoder.pooling, "split": "test", "tasks": tasks,
               "metrics": result.metrics,
               "details": {t: r.model_dump(mode="json", exclude_none=True) for t, r in result.details.items()},
               "seconds": result.seconds, "sentences_embedded": result.sentences_embedded, "notes": result.notes}
        print(json.dumps(out, indent=2, default=json_default))
    else:
        result.model = args.model
        print(result.text)
    return 0


def _eval_layers(args, encoder) -> int:
    """``--layers``: Spearman of every (layer, pooling) on the --dev sets (raysent.eval.layers)."""
    from raysent.eval.layers import format_grid, layer_grid

    progress = None if args.format == "json" else (lambda m: print(m, file=sys.stderr))
    res = layer_grid(encoder, args.dev, poolings=args.layer_poolings, max_pairs=args.max_samples,
                     max_length=args.max_length or 256, batch_size=args.batch_size, progress=progress)
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
