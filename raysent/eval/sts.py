"""STS evaluation: cosine similarity of two sentence vectors against the gold score.

Protocol (docs/evaluation.md):

* STS12-16, STS-B (test), SICK-R (test); Spearman's ρ ×100 of cosine similarity vs gold (Pearson's r
  recorded beside it).
* STS12-16 aggregate in three ways, all recorded: ``all`` (every pair of the year in one
  correlation: SimCSE's and MTEB's choice, the default headline), ``mean`` (plain mean over the
  sub-sets) and ``wmean`` (mean weighted by sub-set size: SentEval's, used by SupCon, Liao 2021).
  STS-B and SICK-R have no sub-sets, so the three agree.
* Avg. = mean of the seven headline numbers (the papers' last column).
* Dev mode (model selection): STS-B dev and/or SICK-R dev, Spearman ×100.

Every distinct sentence of the requested sets is embedded once (:class:`Embedder` sorts by length).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from scipy import stats

from raysent.data import STS_TASKS, ScoredPairs, load

TASK_LABELS = {"sts12": "STS12", "sts13": "STS13", "sts14": "STS14", "sts15": "STS15", "sts16": "STS16",
               "stsb": "STS-B", "sickr": "SICK-R"}
AGGREGATIONS = ("all", "mean", "wmean")


def pair_cosines(vectors: dict[str, np.ndarray], data: ScoredPairs) -> np.ndarray:
    a = np.stack([vectors[s] for s in data.sentence1]).astype(np.float64)
    b = np.stack([vectors[s] for s in data.sentence2]).astype(np.float64)
    a /= np.linalg.norm(a, axis=1, keepdims=True).clip(min=1e-12)
    b /= np.linalg.norm(b, axis=1, keepdims=True).clip(min=1e-12)
    return (a * b).sum(axis=1)


def _corr(cos: np.ndarray, gold: np.ndarray) -> tuple[float, float]:
    return (float(stats.spearmanr(cos, gold).statistic) * 100.0,
            float(stats.pearsonr(cos, gold).statistic) * 100.0)


def score_pairs(vectors: dict[str, np.ndarray], data: ScoredPairs) -> dict:
    """Spearman/Pearson ×100 of one set in the three aggregations, and per sub-set."""
    cos = pair_cosines(vectors, data)
    sp_all, pe_all = _corr(cos, data.scores)
    out: dict[str, Any] = {"n": len(data), "spearman_all": sp_all, "pearson_all": pe_all}
    names = list(dict.fromkeys(data.subsets))
    subsets = {}
    if len(names) > 1 or (names and names[0]):
        subset_arr = np.asarray(data.subsets)
        for name in names:
            m = subset_arr == name
            sp, pe = _corr(cos[m], data.scores[m])
            subsets[name] = {"n": int(m.sum()), "spearman": sp, "pearson": pe}
        sizes = np.array([subsets[s]["n"] for s in names], dtype=np.float64)
        for stat in ("spearman", "pearson"):
            vals = np.array([subsets[s][stat] for s in names])
            out[f"{stat}_mean"] = float(vals.mean())
            out[f"{stat}_wmean"] = float((vals * sizes).sum() / sizes.sum())
        out["subsets"] = subsets
    else:  # no sub-sets: the three aggregations coincide
        for stat in ("spearman", "pearson"):
            out[f"{stat}_mean"] = out[f"{stat}_wmean"] = out[f"{stat}_all"]
    return out


def evaluate_sts(
    encode: Callable[[Sequence[str]], np.ndarray],
    tasks: Sequence[str] = STS_TASKS,
    aggregation: str = "all",
    progress: Callable[[str], None] | None = None,
) -> dict:
    """The 7-set STS evaluation (test splits). ``encode(sentences) -> [N, d]``.

    Returns ``{"aggregation", "tasks": {task: {...,"spearman","pearson"}}, "avg", "avg_pearson",
    "sources", "seconds"}`` where ``spearman``/``pearson`` are the headline numbers in the chosen
    aggregation (STS12-16) and every aggregation is kept beside them.
    """
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation {aggregation!r}; allowed: {', '.join(AGGREGATIONS)}")
    t0 = time.perf_counter()
    sets = {t: load(t, "scored_pairs") for t in tasks}
    result = _score_sets(encode, sets, progress)
    for r in result["tasks"].values():
        r["spearman"] = r[f"spearman_{aggregation}"]
        r["pearson"] = r[f"pearson_{aggregation}"]
    result["aggregation"] = aggregation
    result["avg"] = float(np.mean([r["spearman"] for r in result["tasks"].values()]))
    result["avg_pearson"] = float(np.mean([r["pearson"] for r in result["tasks"].values()]))
    result["seconds"] = time.perf_counter() - t0
    return result


def evaluate_dev(encode: Callable[[Sequence[str]], np.ndarray], specs: Sequence[str] = ("stsb:dev",),
                 sets: dict[str, ScoredPairs] | None = None) -> dict:
    """Model selection: Spearman ×100 on each dev set and their mean (``dev_spearman``)."""
    sets = sets if sets is not None else {s: load(s, "scored_pairs") for s in specs}
    scored = _score_sets(encode, sets)["tasks"]
    out = {f"dev/{name}": r["spearman_all"] for name, r in scored.items()}
    out["dev_spearman"] = float(np.mean(list(out.values())))
    return out


def _score_sets(encode, sets: dict[str, ScoredPairs], progress=None) -> dict:
    sentences = list(dict.fromkeys(s for d in sets.values() for s in d.sentences()))
    if progress:
        progress(f"embedding {len(sentences):,} distinct sentences of {len(sets)} set(s)")
    vecs = encode(sentences)
    vectors = dict(zip(sentences, vecs))
    return {"tasks": {name: score_pairs(vectors, d) for name, d in sets.items()},
            "sources": {name: d.source for name, d in sets.items()},
            "notes": [n for d in sets.values() for n in d.notes]}


def format_table(result: dict, title: str = "") -> str:
    """The papers' table: STS12 … SICK-R and Avg. (Spearman ×100 in the chosen aggregation)."""
    tasks = list(result["tasks"])
    heads = [TASK_LABELS.get(t, t) for t in tasks] + ["Avg."]
    vals = [f"{result['tasks'][t]['spearman']:.2f}" for t in tasks] + [f"{result['avg']:.2f}"]
    widths = [max(len(h), len(v)) for h, v in zip(heads, vals)]
    lines = []
    if title:
        lines.append(title)
    lines.append("  ".join(h.rjust(w) for h, w in zip(heads, widths)))
    lines.append("  ".join(v.rjust(w) for v, w in zip(vals, widths)))
    lines.append(f"(Spearman x100 of cosine; STS12-16 aggregated as '{result['aggregation']}'"
                 f"{'; ' + '; '.join(result.get('notes', [])) if result.get('notes') else ''})")
    return "\n".join(lines)
