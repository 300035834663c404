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

import math
import time
from collections.abc import Callable, Sequence
from typing import cast

import numpy as np
from scipy import stats

from raysent.data import STS_TASKS, ScoredPairs, load
from raysent.data.datasets import check_scores_vary
from raysent.errors import DataError
from raysent.eval.results import AGGREGATIONS, Aggregation, PairScores, StsResult, StsSetScore, SubsetScore
from raysent.eval.results import STS_LABELS as TASK_LABELS

__all__ = ["AGGREGATIONS", "TASK_LABELS", "evaluate_dev", "evaluate_sts", "format_table", "nan_dev_sets",
           "score_pairs"]

DEV_USE = "a dev set (the best checkpoint is chosen by its Spearman)"


def pair_cosines(vectors: dict[str, np.ndarray], data: ScoredPairs) -> np.ndarray:
    a = np.stack([vectors[s] for s in data.sentence1]).astype(np.float64)
    b = np.stack([vectors[s] for s in data.sentence2]).astype(np.float64)
    a /= np.linalg.norm(a, axis=1, keepdims=True).clip(min=1e-12)
    b /= np.linalg.norm(b, axis=1, keepdims=True).clip(min=1e-12)
    return (a * b).sum(axis=1)


def _corr(cos: np.ndarray, gold: np.ndarray) -> tuple[float, float]:
    return (float(stats.spearmanr(cos, gold).statistic) * 100.0,
            float(stats.pearsonr(cos, gold).statistic) * 100.0)


def score_pairs(vectors: dict[str, np.ndarray], data: ScoredPairs) -> PairScores:
    """Spearman/Pearson ×100 of one set in the three aggregations, and per sub-set."""
    cos = pair_cosines(vectors, data)
    sp_all, pe_all = _corr(cos, data.scores)
    names = list(dict.fromkeys(data.subsets))
    if not (len(names) > 1 or (names and names[0])):  # no sub-sets: the three aggregations coincide
        return PairScores(n=len(data), spearman_all=sp_all, pearson_all=pe_all, spearman_mean=sp_all,
                          spearman_wmean=sp_all, pearson_mean=pe_all, pearson_wmean=pe_all)
    subset_arr = np.asarray(data.subsets)
    subsets = {}
    for name in names:
        m = subset_arr == name
        sp, pe = _corr(cos[m], data.scores[m])
        subsets[name] = SubsetScore(n=int(m.sum()), spearman=sp, pearson=pe)
    sizes = np.array([subsets[s].n for s in names], dtype=np.float64)
    agg: dict[str, float] = {}
    for stat in ("spearman", "pearson"):
        vals = np.array([getattr(subsets[s], stat) for s in names])
        agg[f"{stat}_mean"] = float(vals.mean())
        agg[f"{stat}_wmean"] = float((vals * sizes).sum() / sizes.sum())
    return PairScores(n=len(data), spearman_all=sp_all, pearson_all=pe_all, subsets=subsets, **agg)


def evaluate_sts(
    encode: Callable[[Sequence[str]], np.ndarray],
    tasks: Sequence[str] = STS_TASKS,
    aggregation: str = "all",
    progress: Callable[[str], None] | None = None,
) -> StsResult:
    """The 7-set STS evaluation (test splits). ``encode(sentences) -> [N, d]``.

    Returns a :class:`~raysent.eval.results.StsResult`: per set (``tasks``) every aggregation and the headline
    ``spearman``/``pearson`` in the chosen ``aggregation`` (STS12-16), their ``avg`` and ``avg_pearson``, the
    ``sources`` and ``seconds``.
    """
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation {aggregation!r}; allowed: {', '.join(AGGREGATIONS)}")
    agg = cast(Aggregation, aggregation)
    t0 = time.perf_counter()
    sets = {t: load(t, "scored_pairs") for t in tasks}
    for data in sets.values():
        check_scores_vary(data, "an STS test set (scored by the Spearman correlation of cosines with them)")
    if agg != "all":
        for name, data in sets.items():
            if name in STS_TASKS[:5] and not any(data.subsets):
                raise DataError(f"{name}: {data.source} has no sub-set labels, so '{agg}' (SentEval's average over "
                                "the sub-sets) cannot be computed from it; use the aggregation 'all', or a copy with "
                                "SentEval's sub-sets (RAYSENT_DATA_DIR's layout, or SentEval's senteval.tar)")
    scored = _score_sets(encode, sets, progress)
    per_set = {name: StsSetScore(**r.model_dump(), spearman=r.correlation("spearman", agg),
                                 pearson=r.correlation("pearson", agg)) for name, r in scored.items()}
    return StsResult(aggregation=agg, tasks=per_set,
                     avg=float(np.mean([r.spearman for r in per_set.values()])),
                     avg_pearson=float(np.mean([r.pearson for r in per_set.values()])),
                     sources={name: d.source for name, d in sets.items()},
                     notes=[n for d in sets.values() for n in d.notes], seconds=time.perf_counter() - t0)


def evaluate_dev(encode: Callable[[Sequence[str]], np.ndarray], specs: Sequence[str] = ("stsb:dev",),
                 sets: dict[str, ScoredPairs] | None = None) -> dict[str, float]:
    """Model selection: Spearman ×100 on each dev set (``dev/<set>``) and their mean (``dev_spearman``). A dev set
    whose gold scores are all equal is refused (:class:`DataError` naming its file): its Spearman is NaN whatever
    the model, so no checkpoint could be chosen on it. A NaN left is the model's (its cosines all equal, or not
    numbers): see :func:`nan_dev_sets`."""
    sets = sets if sets is not None else {s: load(s, "scored_pairs") for s in specs}
    for data in sets.values():
        check_scores_vary(data, DEV_USE)
    scored = _score_sets(encode, sets)
    out = {f"dev/{name}": r.spearman_all for name, r in scored.items()}
    out["dev_spearman"] = float(np.mean(list(out.values())))
    return out


def nan_dev_sets(scores: dict[str, float]) -> list[str]:
    """The dev sets (``dev/<set>`` of :func:`evaluate_dev`) whose Spearman is NaN."""
    return [k.removeprefix("dev/") for k, v in scores.items()
            if k.startswith("dev/") and isinstance(v, float) and math.isnan(v)]


def _score_sets(encode: Callable[[Sequence[str]], np.ndarray], sets: dict[str, ScoredPairs],
                progress: Callable[[str], None] | None = None) -> dict[str, PairScores]:
    sentences = list(dict.fromkeys(s for d in sets.values() for s in d.sentences()))
    if progress:
        progress(f"embedding {len(sentences):,} distinct sentences of {len(sets)} set(s)")
    vecs = encode(sentences)
    vectors = dict(zip(sentences, vecs))
    return {name: score_pairs(vectors, d) for name, d in sets.items()}


def format_table(result: StsResult, title: str = "") -> str:
    """The papers' table: STS12 … SICK-R and Avg. (Spearman ×100 in the chosen aggregation)."""
    return result.table(title)
