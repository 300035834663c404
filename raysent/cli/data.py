"""`raysent data`: the named data sets and where each is found."""

from __future__ import annotations

# Lazy imports: raysent's heavier modules (the command's work is imported when it runs, so `raysent --help` and every
# other command start without torch, Ray or MLflow).


def register(sub) -> None:
    d = sub.add_parser("data", help="list the named data sets and where they are found",
                       description="Named data sets (local RAYSENT_DATA_DIR first, the Hugging Face hub second).")
    d.set_defaults(func=run)


def run(args) -> int:
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
