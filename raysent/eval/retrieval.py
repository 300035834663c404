"""Semantic search: a FAISS inner-product index over normalised corpus embeddings.

The layer-wise attention pooling paper (Oh et al. 2022, Table 3) evaluates sentence encoders as
retrievers: MRR@10, recall@k, retrieval time per query and index memory.

The search set is built from any data set of sentence pairs with a duplicate/similarity label:

* every pair whose gold score reaches ``min_score`` makes its ``sentence1`` a **query** and its
  ``sentence2`` a **relevant document** of that query (a query repeated over several such pairs
  has several relevant documents);
* the **corpus** is every distinct ``sentence2`` of the set (relevant to some query or not);
* a corpus document whose text equals the query and is not relevant to it is left out of that
  query's ranking (it would otherwise be a trivial, wrong first hit).

Offline default: STS-B test pairs with score >= 4.0 on the 0-5 scale (309 queries, 1,337
documents). For real users: ``quora-duplicates`` (Quora duplicate questions, 0/1 labels; from the
hub, thresholded at 1), or any ``path:FILE`` with score, sentence1, sentence2 columns.
``min_score`` defaults to 4.0, or 1.0 when every score is 0 or 1 (duplicate labels).

Metrics (sentence-transformers' ``InformationRetrievalEvaluator`` definitions):

* MRR@10 = mean over queries of 1 / rank of the first relevant document in the top 10 (0 if none);
* recall@k = mean over queries of |relevant ∩ top k| / |relevant|;
* ``ms_per_query``: FAISS search time of one query at a time (the latency a user sees, embedding
  excluded), averaged over up to ``timing_queries`` queries; ``batch_ms_per_query``: the whole
  query set searched in one call, divided by the number of queries;
* ``index_mb``: the size of the serialised index (``faiss.serialize_index``).

Metric names are MLflow-safe (MLflow refuses '@'): ``mrr_at_10``, ``recall_at_5``, ...
Imports no Ray and no MLflow.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from raysent.data import ScoredPairs, load
from raysent.errors import RaysentError
from raysent.eval.results import RetrievalResult

# Lazy imports: faiss (heavy, and only the functions that need them import them).


@dataclass
class SearchSet:
    queries: list[str]
    relevant: list[set[int]]  # per query, the corpus ids of its relevant documents
    corpus: list[str]
    exclude: list[int]  # per query, a corpus id to leave out of its ranking (its own text), or -1


def build_search_set(data: ScoredPairs, min_score: float) -> SearchSet:
    corpus = list(dict.fromkeys(data.sentence2))
    doc_id = {s: i for i, s in enumerate(corpus)}
    rel: dict[str, set[int]] = {}
    for a, b, score in zip(data.sentence1, data.sentence2, data.scores):
        if score >= min_score:
            rel.setdefault(a, set()).add(doc_id[b])
    queries = list(rel)
    exclude = [doc_id[q] if q in doc_id and doc_id[q] not in rel[q] else -1 for q in queries]
    return SearchSet(queries=queries, relevant=[rel[q] for q in queries], corpus=corpus, exclude=exclude)


def rank_metrics(ranked: np.ndarray, relevant: Sequence[set[int]], ks: Sequence[int] = (1, 5, 10),
                 mrr_k: int = 10) -> dict[str, float]:
    """MRR@mrr_k and recall@k from ``ranked`` [Q, K] corpus ids (best first; -1 pads)."""
    mrr: list[float] = []
    recall: dict[int, list[float]] = {k: [] for k in ks}
    for row, rel in zip(ranked, relevant):
        rr = 0.0
        for rank, doc in enumerate(row[:mrr_k], start=1):
            if doc in rel:
                rr = 1.0 / rank
                break
        mrr.append(rr)
        for k in ks:
            recall[k].append(len(rel.intersection(row[:k].tolist())) / len(rel))
    out = {f"mrr_at_{mrr_k}": float(np.mean(mrr))}
    out.update({f"recall_at_{k}": float(np.mean(v)) for k, v in recall.items()})
    return out


def _faiss():
    try:
        import faiss
    except ImportError:  # pragma: no cover - installed with raysent[search]
        raise RaysentError("semantic search needs FAISS: pip install faiss-cpu (or raysent[search])") from None
    return faiss


def search(index, queries: np.ndarray, k: int, exclude: Sequence[int]) -> np.ndarray:
    """Top-k corpus ids per query from a FAISS index, each query's excluded id dropped."""
    _, ids = index.search(queries, k + 1)
    out = np.full((len(queries), k), -1, dtype=np.int64)
    for i, (row, ex) in enumerate(zip(ids, exclude)):
        kept = [d for d in row if d != ex and d >= 0][:k]
        out[i, : len(kept)] = kept
    return out


def evaluate_search(
    encode: Callable[[Sequence[str]], np.ndarray],
    data: str = "stsb:test",
    min_score: float | None = None,
    ks: Sequence[int] = (1, 5, 10),
    mrr_k: int = 10,
    max_samples: int | None = None,
    timing_queries: int = 1000,
    threads: int | None = 1,
    progress: Callable[[str], None] | None = None,
) -> RetrievalResult:
    """MRR@10, recall@k, latency and index size of ``encode`` as a retriever on ``data``.

    ``threads``: FAISS's OpenMP threads for the search (1: the latency of one core; None: FAISS's
    default). ``max_samples`` keeps only the first N pairs (a quick check, noted).
    """
    faiss = _faiss()
    t0 = time.perf_counter()
    pairs = load(data, "scored_pairs")
    notes = list(pairs.notes)
    if max_samples is not None and len(pairs) > max_samples:
        notes.append(f"search: only the first {max_samples:,} of {len(pairs):,} pairs of {data} (max_samples)")
        pairs = ScoredPairs(name=pairs.name, source=pairs.source, sentence1=pairs.sentence1[:max_samples],
                            sentence2=pairs.sentence2[:max_samples], scores=pairs.scores[:max_samples],
                            subsets=pairs.subsets[:max_samples])
    if min_score is None:
        min_score = 1.0 if np.isin(pairs.scores, (0.0, 1.0)).all() else 4.0
    sset = build_search_set(pairs, min_score)
    if not sset.queries:
        raise RaysentError(f"search: no pair of {data} has a gold score >= {min_score}; lower min_score")
    sentences = list(dict.fromkeys(sset.queries + sset.corpus))
    if progress:
        progress(f"search: embedding {len(sentences):,} distinct sentences ({len(sset.queries):,} queries, "
                 f"{len(sset.corpus):,} documents) of {data}")
    vecs = dict(zip(sentences, encode(sentences)))
    docs = _unit(np.stack([vecs[s] for s in sset.corpus]))
    queries = _unit(np.stack([vecs[s] for s in sset.queries]))
    k = max(max(ks), mrr_k)

    before = faiss.omp_get_max_threads()
    if threads is not None:
        faiss.omp_set_num_threads(threads)
    try:
        t_build = time.perf_counter()
        index = faiss.IndexFlatIP(docs.shape[1])
        index.add(docs)
        build_s = time.perf_counter() - t_build
        t_batch = time.perf_counter()
        ranked = search(index, queries, k, sset.exclude)
        batch_s = time.perf_counter() - t_batch
        n_time = min(len(queries), timing_queries)
        t_single = time.perf_counter()
        for i in range(n_time):
            index.search(queries[i: i + 1], k + 1)
        single_s = time.perf_counter() - t_single
        index_bytes = int(faiss.serialize_index(index).nbytes)
    finally:
        faiss.omp_set_num_threads(before)
    ranking = rank_metrics(ranked, sset.relevant, ks, mrr_k)
    return RetrievalResult(
        mrr_k=mrr_k, mrr=ranking[f"mrr_at_{mrr_k}"], recall={k: ranking[f"recall_at_{k}"] for k in ks},
        ms_per_query=1000.0 * single_s / n_time, batch_ms_per_query=1000.0 * batch_s / len(queries),
        index_mb=index_bytes / 2 ** 20, index_build_s=build_s, queries=len(sset.queries), corpus=len(sset.corpus),
        multi_relevant_queries=sum(len(r) > 1 for r in sset.relevant),
        excluded_self_matches=sum(e >= 0 for e in sset.exclude), min_score=min_score,
        index="faiss.IndexFlatIP (exact inner product on L2-normalised vectors = cosine)",
        faiss_threads=threads if threads is not None else before, data=data, source=pairs.source, notes=notes,
        seconds=time.perf_counter() - t0)


def _unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    return np.ascontiguousarray(x / np.linalg.norm(x, axis=1, keepdims=True).clip(min=1e-12))
