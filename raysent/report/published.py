"""The papers' own numbers (``results/published.yaml``) as reference rows of a table.

An entry is a row of a paper's table with its method, model, evaluation setting and scores
(the file's header documents every field). :func:`select` picks entries for a table,
:func:`matches` says whether an entry is comparable with one of our rows (same raysent method,
same encoder, and no disagreeing parameter), and :func:`label` is the marked row label
(``[paper] SG-BERT + Contrastive (SG-OPT) CLS (Kim 2021, Table 1)``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from raysent.errors import RaysentError, did_you_mean
from raysent.report.runs import TASKS, short_model

# the papers' numbers, committed beside the package in a checkout (an editable install reads them there)
CHECKOUT_FILE = Path(__file__).resolve().parents[2] / "results" / "published.yaml"


def default_file() -> Path:
    """results/published.yaml of the checkout the package runs from, else of the working directory (a
    non-editable install, such as clusters/Dockerfile's image, whose package sits in site-packages)."""
    return CHECKOUT_FILE if CHECKOUT_FILE.is_file() else Path.cwd() / "results" / "published.yaml"
REQUIRED = ("paper", "table", "row", "method", "model", "eval", "scores")


def load(path: str | Path | None = None) -> list[dict]:
    """The entries of published.yaml (validated enough to build rows from)."""
    path = Path(path) if path else default_file()
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RaysentError(f"{path}: published numbers not found (--published-file names another file)") from None
    except yaml.YAMLError as exc:
        raise RaysentError(f"{path}: not valid YAML: {exc}") from None
    entries = (raw or {}).get("entries")
    if not isinstance(entries, list):
        raise RaysentError(f"{path}: expected a top-level 'entries' list (see the comment at the top of "
                           "results/published.yaml)")
    for i, e in enumerate(entries):
        missing = [k for k in REQUIRED if k not in e]
        if missing:
            raise RaysentError(f"{path}: entries[{i}] ({e.get('row', '?')}): missing field(s) {', '.join(missing)}")
        bad = [k for k in e["scores"] if k not in (*TASKS, "avg")]
        if bad:
            raise RaysentError(f"{path}: entries[{i}] ({e['row']}): unknown score key(s) {', '.join(bad)}; allowed: "
                               f"{', '.join((*TASKS, 'avg'))}")
    return entries


def papers(entries: list[dict]) -> list[str]:
    return sorted({e["paper"]["short"] for e in entries})


def select(entries: list[dict], which: str, methods: set[str]) -> list[dict]:
    """``which``: ``match`` (entries of the table's methods), ``all``, or paper names, comma-separated."""
    if which == "all":
        return list(entries)
    if which == "match":
        return [e for e in entries if e.get("method") in methods]
    wanted = [w.strip() for w in which.split(",") if w.strip()]
    names = {p.lower(): p for p in papers(entries)}
    for w in wanted:
        if w.lower() not in names:
            raise RaysentError(f"--published {w!r}: unknown paper{did_you_mean(w, names.values())}; allowed: match "
                               f"(the table's methods, the default), all, or paper names: {', '.join(names.values())}")
    keep = {names[w.lower()] for w in wanted}
    return [e for e in entries if e["paper"]["short"] in keep]


def label(e: dict) -> str:
    p = e["paper"]
    first = str(p.get("authors", "")).split(",")[0].strip().split(" ")[-1] or p["short"]
    block = f"{e['block']}: " if e.get("block") else ""
    return f"[paper] {p['short']} {block}{e['row']} ({first} {p.get('year', '')}, {e['table']})"


def std(e: dict, task: str) -> float | None:
    v = (e.get("std") or {}).get(task)
    return float(v) if isinstance(v, (int, float)) else None


def score(e: dict, task: str) -> float | None:
    v = e["scores"].get(task)
    return float(v) if isinstance(v, (int, float)) else None


def matches(e: dict, method: str, model: str, hyperparameters: dict[str, Any]) -> bool:
    """Same raysent method, same encoder (by its last name part, case-insensitive), and every
    parameter the entry names either absent from ours or equal to ours."""
    if not e.get("method") or e["method"] != method:
        return False
    if short_model(str(e["model"])).lower() != short_model(model).lower():
        return False
    for k, v in (e.get("params") or {}).items():
        if k in hyperparameters and hyperparameters[k] is not None and str(hyperparameters[k]) != str(v):
            return False
    return True
