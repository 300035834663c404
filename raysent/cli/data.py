"""`raysent data`: the named data sets, where each is found, and their download into the Hugging Face cache."""

from __future__ import annotations

import os
import sys

from raysent.errors import RaysentError, did_you_mean

# Lazy imports: raysent's heavier modules (the command's work is imported when it runs, so `raysent --help` and every
# other command start without torch, Ray or MLflow).


def register(sub) -> None:
    d = sub.add_parser("data", help="list the named data sets and where they are found; --download fetches them",
                       description="Named data sets (local RAYSENT_DATA_DIR first, the Hugging Face hub second, at the "
                       "revision raysent pins). --download fetches the hub copies into the Hugging Face cache "
                       "(HF_HUB_CACHE or HF_HOME), where later runs read them, offline (HF_HUB_OFFLINE=1) too: "
                       "download once on a machine with the hub, then copy the cache to nodes that have none.")
    d.add_argument("names", nargs="*", metavar="NAME", help="with --download: the data sets to fetch (default: "
                   "every one with a hub copy)")
    d.add_argument("--download", action="store_true", help="fetch the hub copies of NAME (or all) into the cache")
    d.add_argument("--model", action="append", default=[], metavar="HUB_ID[@REVISION]",
                   help="with --download: also fetch this hub model (repeatable)")
    d.set_defaults(func=run)


def run(args) -> int:
    from raysent.data.datasets import DATASETS, data_dir

    if args.download:
        return download(args.names, args.model)
    if args.names or args.model:
        raise RaysentError("raysent data: NAME and --model are for --download (`raysent data --download NAME`)")
    root = data_dir()
    print(f"RAYSENT_DATA_DIR = {root or '(not set)'}\n")
    for name, d in DATASETS.items():
        splits = list(dict.fromkeys([*d.local, *d.hub])) or [d.default_split]
        print(f"{name:16s} {d.kind:13s} splits {'/'.join(splits)} (default {d.default_split})"
              + ("  [transductive]" if d.transductive else ""))
        print(f"{'':16s} {d.description}")
        hubs = sorted({h.where() for h in d.hub.values()})
        if hubs:
            print(f"{'':16s} hub: {', '.join(hubs)}")
    print(f"{'path:FILE':16s} your own .txt (a sentence a line), .tsv or .csv with a header")
    return 0


def download(names: list[str], models: list[str]) -> int:
    """Fetch each hub source of ``names`` (every declared one by default) and each model into the cache, and read
    each split once (so a copy that differs from the papers' is refused now, not after a search)."""
    from raysent.data.datasets import DATASETS, load
    from raysent.hub import hub_cache_dir
    from raysent.models.locate import locate_model, model_source

    unknown = [n for n in names if n not in DATASETS]
    if unknown:
        known = ", ".join(n for n, d in DATASETS.items() if d.hub)
        raise RaysentError(f"raysent data --download: unknown data set {unknown[0]!r}"
                           f"{did_you_mean(unknown[0], DATASETS)}; with a hub copy: {known}")
    wanted = names or [n for n, d in DATASETS.items() if d.hub]
    print(f"into the Hugging Face cache {hub_cache_dir()}", file=sys.stderr)
    saved = os.environ.pop("RAYSENT_DATA_DIR", None)  # the hub's copy, even where a local one exists
    try:
        for name in wanted:
            for split in DATASETS[name].hub:
                data = load(f"{name}:{split}")
                print(f"{name}:{split}: {len(data):,} rows from {data.source}")
    finally:
        if saved is not None:
            os.environ["RAYSENT_DATA_DIR"] = saved
    for spec in models:
        model, _, revision = spec.partition("@")
        where, _ = locate_model(model, revision or None)
        print(f"model {model}: {model_source(where)} ({where})")
    return 0
