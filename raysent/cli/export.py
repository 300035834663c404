"""`raysent export MODEL OUTPUT`: any encoder with a pooling, written as a sentence-transformers model."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from raysent.cli.common import EPILOG
from raysent.errors import RaysentError
from raysent.models.pooling import BASE_POOLINGS, check_pooling

# Lazy imports: torch, raysent's heavier modules (the command's work is imported when it runs, so `raysent --help`
# and every other command start without torch, Ray or MLflow; raysent.models.pooling's names need no torch).

POOLINGS_HELP = (f"{', '.join(p for p in BASE_POOLINGS if p != 'cls_mlp_train')}, layer<K>_<cls|mean|max> (K = 0 "
                 "for the embeddings .. L), or layeratt (a model the layeratt method trained); cls reads [CLS] "
                 "through the model's trained pooler, cls_before_pooler the raw [CLS]")


def register(sub) -> None:
    ex = sub.add_parser("export", help="write a model with its pooling as a sentence-transformers folder",
                        description="Load MODEL (a folder raysent saved, a sentence-transformers or save_pretrained "
                        "folder, a name under RAYSENT_MODEL_DIR, a hub id) and write it to OUTPUT as raysent saves "
                        "every model: save_pretrained files, raysent.json, the sentence-transformers layout "
                        "(SentenceTransformer(OUTPUT) encodes as `raysent eval` does) and a model card. A model "
                        "raysent trained is exported with the pooling it was trained for; --pooling picks another "
                        "(a baseline pooling of a raw encoder, say). The folder is written beside OUTPUT and renamed "
                        "to it at the end: a failed export leaves nothing, and an earlier export there is replaced "
                        "whole.",
                        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    ex.add_argument("model", help="the model to export")
    ex.add_argument("output", help="the folder to write: a new or empty one, or an earlier export (replaced)")
    ex.add_argument("--pooling", metavar="POOLING", help=f"the inference pooling: {POOLINGS_HELP} (default: what "
                    "the model's raysent.json or sentence-transformers config says)")
    ex.add_argument("--max-length", type=int, help="tokens per sentence the exported model reads (default: what "
                    "the model was saved with, else 256; at most the model's positions)")
    ex.set_defaults(func=run)


def check_output(out: Path) -> None:
    """OUTPUT can take an export: absent, an empty folder, or an earlier export (its raysent.json), never a file
    or a folder of other files, which replacing it whole would delete."""
    if out.exists() and not out.is_dir():
        raise RaysentError(f"{out} is a file; give a folder to write the model to")
    if out.is_dir() and any(out.iterdir()) and not (out / "raysent.json").is_file():
        raise RaysentError(f"{out} holds files and is not a model raysent saved (no raysent.json); the export "
                           "replaces its folder whole, so give a new or empty folder")


def run(args) -> int:
    # what can be checked without the model, before torch loads (seconds)
    check_pooling(args.pooling, "--pooling", error=RaysentError)
    if args.max_length is not None and args.max_length < 2:
        raise RaysentError(f"--max-length {args.max_length}: expected at least 2 tokens")
    out = Path(args.output)
    check_output(out)
    from raysent.models.locate import refuse_unreadable_pooling

    refuse_unreadable_pooling(args.model, args.pooling)  # from the model's files: cls without a trained pooler

    from raysent.methods.card import write_card
    from raysent.models.sentence_encoder import load
    from raysent.models.st_export import replaced_whole

    # refuses a pooling the model cannot read (cls without a trained pooler, layeratt without its pooler) and a
    # --max-length beyond its positions, before anything is written
    model = load(args.model, pooling=args.pooling, max_length=args.max_length)
    extra = {k: v for k, v in (model.encoder.meta.extra or {}).items()
             if k not in ("pooling", "saved_by", "has_trained_pooler", "sentence_transformers")}
    with replaced_whole(out) as folder:
        model.encoder.save(folder, model.pooling, mlp=model.encoder.head, extra=extra, max_length=model.max_length)
        write_card(folder)
    print(f"wrote {out} (pooling {model.pooling}, {model.max_length} tokens): "
          f"SentenceTransformer({str(out)!r}"
          + (", trust_remote_code=True" if model.pooling in ("mean_no_cls", "layeratt") else "") + ") loads it",
          file=sys.stderr)
    return 0
