"""The ``raysent`` command.

    raysent train FILE.yaml        train one configuration (one worker here, or N with Ray Train)
    raysent tune FILE.yaml         search the space, run the best configuration on every seed, log to MLflow
    raysent suite SUITE.yaml       several experiments (each arm a search or the paper's setting), one table
    raysent eval --model M         the 7-set STS table of any encoder (or a model raysent trained)
    raysent eval --model M --layers  the per-layer × pooling STS-B dev grid of an encoder
    raysent export MODEL OUT       a model with its pooling as a sentence-transformers folder
    raysent table [EXPERIMENT...]  paper-style mean±std tables (md, tex, csv), --published beside them
    raysent plot EXPERIMENT        PNG plots: dev curves, score per hyperparameter, Optuna's plots
    raysent compare RUN_A RUN_B    per-data-set differences with a paired test across seeds
    raysent methods                every method with its variants and paper defaults
    raysent bench                  speed and memory of training steps, evaluation and the orchestration
    raysent data                   the named data sets and where each one is found

Errors a user can cause (a bad config, a malformed file, a missing model) are printed as one
clear message and exit with status 2; no traceback from inside a library.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import sys

from raysent import __version__
from raysent.cli import bench, compare, data, evaluate, export, methods, plot, suite, table, train, tune
from raysent.cli.common import EPILOG
from raysent.errors import DOOR, Interrupted, RaysentError
from raysent.io import is_disk_full

# Lazy imports: raysent's heavier modules (the command's work is imported when it runs, so `raysent --help` and every
# other command start without torch, Ray or MLflow).

COMMANDS = (train, tune, suite, evaluate, export, table, plot, compare, methods, bench, data)  # the order of --help


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="raysent",
        description="Train, tune and compare contrastive sentence-embedding methods "
        "(SimCSE, SG-OPT, ConSERT, layer-wise attention pooling, SupCon) with Ray and MLflow.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    p.add_argument("--version", action="version", version=f"raysent {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for command in COMMANDS:
        command.register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    door = DOOR.set("cli")  # errors advise what a user of the command line types (--set KEY=VALUE, --model PATH)
    try:
        return _main(argv)
    finally:
        DOOR.reset(door)


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("raysent").setLevel(logging.DEBUG if args.verbose else logging.INFO)
    if args.command is None:
        parser.print_help()
        return 2
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from raysent.orphans import stop_orphaned_local_ray

    stop_orphaned_local_ray(say=lambda m: print(m, file=sys.stderr))  # a local Ray left by a killed raysent
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
    except OSError as exc:
        if exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.ENOTDIR, errno.EISDIR,
                             errno.EEXIST, errno.EDQUOT):
            raise
        # the folder a command writes to (results/, --output-dir) is read-only, full, or not a folder
        where = exc.filename or "its output"
        print(f"raysent: error: cannot write {where}: {exc.strerror}. Give a writable folder (--results-dir, "
              f"--output-dir, or --set tracking.results_dir=PATH)", file=sys.stderr)
        return 2
    except Exception as exc:
        if not is_disk_full(exc):  # a full disk can come back as another error: sqlite's, or Ray's around it
            raise
        print(f"raysent: error: the disk is full ({' '.join(str(exc).split())[:300]}). Free space, then run the "
              "command again (`raysent tune ... --resume` goes on with a search)", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
