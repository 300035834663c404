"""`raysent export MODEL OUTPUT`: any encoder with a pooling, written as a sentence-transformers model."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from raysent.cli.common import EPILOG
from raysent.errors import RaysentError

# Lazy imports: raysent's heavier modules (the command's work is imported when it runs, so `raysent --help` and every
# other command start without torch, Ray or MLflow).


def register(sub) -> None:
    ex = sub.add_parser("export", help="write a model with its pooling as a sentence-transformers folder",
                        description="Load MODEL (a folder raysent saved, a sentence-transformers or save_pretrained "
                        "folder, a name under RAYSENT_MODEL_DIR, a hub id) and write it to OUTPUT as raysent saves "
                        "every model: save_pretrained files, raysent.json, the sentence-transformers layout "
                        "(SentenceTransformer(OUTPUT) encodes as `raysent eval` does) and a model card. A model "
                        "raysent trained is exported with the pooling it was trained for; --pooling picks another "
                        "(a baseline pooling of a raw encoder, say).",
                        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    ex.add_argument("model", help="the model to export")
    ex.add_argument("output", help="the folder to write (created; files of an earlier export are replaced)")
    ex.add_argument("--pooling", help="the inference pooling (default: what the model's raysent.json or "
                    "sentence-transformers config says)")
    ex.add_argument("--max-length", type=int, help="tokens per sentence the exported model reads (default: what "
                    "the model was saved with, else 256)")
    ex.set_defaults(func=run)


def run(args) -> int:
    from raysent.methods.card import write_card
    from raysent.models.sentence_encoder import load

    out = Path(args.output)
    if out.exists() and not out.is_dir():
        raise RaysentError(f"{out} is a file; give a folder to write the model to")
    if args.max_length is not None and args.max_length < 2:
        raise RaysentError(f"--max-length {args.max_length}: expected at least 2 tokens")
    model = load(args.model, pooling=args.pooling, max_length=args.max_length)
    extra = {k: v for k, v in (model.encoder.meta.extra or {}).items()
             if k not in ("pooling", "saved_by", "has_trained_pooler", "sentence_transformers")}
    model.encoder.save(out, model.pooling, mlp=model.encoder.head, extra=extra, max_length=model.max_length)
    write_card(out)
    print(f"wrote {out} (pooling {model.pooling}, {model.max_length} tokens): "
          f"SentenceTransformer({str(out)!r}"
          + (", trust_remote_code=True" if model.pooling in ("mean_no_cls", "layeratt") else "") + ") loads it",
          file=sys.stderr)
    return 0
