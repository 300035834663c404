"""`raysent methods`: every method, its paper, variants and defaults."""

from __future__ import annotations

import json
from typing import Any

# Lazy imports: raysent's heavier modules (the command's work is imported when it runs, so `raysent --help` and every
# other command start without torch, Ray or MLflow).


def register(sub) -> None:
    m = sub.add_parser("methods", help="list the methods, their variants and paper defaults",
                       description="Every registered method with its paper, variants, hyperparameter defaults "
                       "(params), training defaults and seeds.")
    m.add_argument("--format", choices=["text", "json"], default="text")
    m.set_defaults(func=run)


def run(args) -> int:
    from raysent.methods.spec import SPECS

    rows: list[dict[str, Any]] = []  # as --format json prints them
    for name, cls in SPECS.items():
        params = cls.Params()
        defaults = cls.defaults(params)
        rows.append({
            "method": name,
            "paper": cls.paper,
            "arxiv": cls.arxiv,
            "citation": cls.citation,
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
        print(f"{r['method']}  —  {r['paper']}" + (f"  (arXiv:{r['arxiv']})" if r["arxiv"] else ""))
        print(f"    trains:    {r['trains']}")
        print(f"    data:      {r['data']} (default {r['train_data']})")
        for k, v in r["variants"].items():
            print(f"    {k + ':':10s} {', '.join(map(str, v))}")
        print(f"    params:    {', '.join(f'{k}={v}' for k, v in r['params'].items())}")
        print(f"    train:     {', '.join(f'{k}={v}' for k, v in r['train'].items())}")
        print(f"    seeds:     {', '.join(map(str, r['seeds']))}")
        print()
    return 0
