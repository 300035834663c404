"""Embedding geometry: alignment, uniformity (Wang & Isola 2020) and the singular-value spectrum.

SimCSE (Gao et al. 2021, §5) and ConSERT (Yan et al. 2021, §5) analyse their embeddings this way:

* **alignment** = E_{(x, x+) ~ p_pos} ||f(x) - f(x+)||^2 over positive pairs (default: STS-B pairs
  with a gold score >= 4.0, SimCSE's choice); lower is better.
* **uniformity** = log E_{x, y ~ p_data} exp(-2 ||f(x) - f(y)||^2) over all pairs of distinct
  sentences of the set (the i < j pairs of Wang & Isola's ``torch.pdist`` code); lower is better.
* f(x) is the L2-normalised embedding.
* **spectrum**: the singular values of the [N, d] matrix of normalised embeddings of the set's
  distinct sentences (not centred), divided by the largest, and one summary number, the
  *effective rank* exp(H(p)) with p_i = s_i / sum_j s_j (Roy & Vetterli 2007): d when all
  directions are used equally, 1 when the embeddings collapse onto one direction. The share of the
  squared spectrum in the top direction (``top1_energy``) is recorded beside it.

Imports no Ray and no MLflow.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np

from raysent.data import ScoredPairs, load
from raysent.errors import RaysentError
from raysent.eval.results import GeometryResult


def normalize(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return x / np.linalg.norm(x, axis=1, keepdims=True).clip(min=1e-12)


def alignment(x: np.ndarray, y: np.ndarray, alpha: float = 2.0) -> float:
    """E ||x_i - y_i||^alpha over the rows of two [N, d] arrays of normalised positive pairs."""
    x, y = normalize(x), normalize(y)
    return float((np.linalg.norm(x - y, axis=1) ** alpha).mean())


def uniformity(x: np.ndarray, t: float = 2.0, chunk: int = 1024) -> float:
    """log of the mean of exp(-t ||x_i - x_j||^2) over all pairs i < j (normalised rows).

    Computed in chunks (memory O(chunk * N)) with the log-sum-exp trick, in float64.
    """
    x = normalize(x)
    n = len(x)
    if n < 2:
        raise RaysentError("uniformity needs at least two distinct sentences")
    sq = (x * x).sum(1)
    logs: list[float] = []
    for start in range(0, n, chunk):
        block = x[start: start + chunk]
        d2 = np.maximum(sq[start: start + chunk, None] + sq[None, :] - 2.0 * block @ x.T, 0.0)
        rows = np.arange(start, start + len(block))
        mask = np.arange(n)[None, :] > rows[:, None]  # j > i only
        vals = -t * d2[mask]
        if vals.size:
            m = vals.max()
            logs.append(m + np.log(np.exp(vals - m).sum()))
    log_arr = np.asarray(logs)
    m = log_arr.max()
    total = m + np.log(np.exp(log_arr - m).sum())
    return float(total - np.log(n * (n - 1) / 2))


def spectrum(x: np.ndarray) -> dict:
    """Singular values of the normalised embedding matrix: normalised by the largest, and summaries."""
    s = np.linalg.svd(normalize(x), compute_uv=False)
    p = s / s.sum()
    p = p[p > 0]
    energy = s ** 2 / (s ** 2).sum()
    return {"singular_values": (s / s[0]).tolist(), "effective_rank": float(np.exp(-(p * np.log(p)).sum())),
            "top1_energy": float(energy[0]), "dim": int(x.shape[1]), "n": int(x.shape[0])}


def positive_pairs(data: ScoredPairs, min_score: float) -> tuple[list[str], list[str]]:
    keep = data.scores >= min_score
    return ([a for a, k in zip(data.sentence1, keep) if k], [b for b, k in zip(data.sentence2, keep) if k])


def evaluate_geometry(
    encode: Callable[[Sequence[str]], np.ndarray],
    data: str = "stsb:test",
    min_score: float = 4.0,
    max_samples: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> GeometryResult:
    """Alignment (pairs with gold >= ``min_score``), uniformity and spectrum (all distinct sentences).

    ``data`` is any scored-pairs spec (``stsb:test``, ``stsb:dev``, ``sickr:test``, ``path:FILE``);
    ``max_samples`` keeps only its first N pairs (a quick check, noted).
    """
    t0 = time.perf_counter()
    pairs = load(data, "scored_pairs")
    notes = list(pairs.notes)
    if max_samples is not None and len(pairs) > max_samples:
        notes.append(f"geometry: only the first {max_samples:,} of {len(pairs):,} pairs of {data} (max_samples)")
        pairs = ScoredPairs(name=pairs.name, source=pairs.source, sentence1=pairs.sentence1[:max_samples],
                            sentence2=pairs.sentence2[:max_samples], scores=pairs.scores[:max_samples],
                            subsets=pairs.subsets[:max_samples], notes=notes)
    pos1, pos2 = positive_pairs(pairs, min_score)
    if not pos1:
        raise RaysentError(f"geometry: no pair of {data} has a gold score >= {min_score}; lower min_score")
    sentences = list(dict.fromkeys(pairs.sentences()))
    if progress:
        progress(f"geometry: embedding {len(sentences):,} distinct sentences of {data}")
    vectors = dict(zip(sentences, encode(sentences)))
    all_vecs = np.stack([vectors[s] for s in sentences])
    spec = spectrum(all_vecs)
    return GeometryResult(
        alignment=alignment(np.stack([vectors[s] for s in pos1]), np.stack([vectors[s] for s in pos2])),
        uniformity=uniformity(all_vecs), effective_rank=spec["effective_rank"], top1_energy=spec["top1_energy"],
        singular_values=spec["singular_values"], positive_pairs=len(pos1), sentences=len(sentences), data=data,
        source=pairs.source, min_score=min_score, notes=notes, seconds=time.perf_counter() - t0)
