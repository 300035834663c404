"""The per-layer × pooling score grid of an encoder (``raysent eval --layers``).

The seed papers' Figure 1 (SG-BERT, Kim et al. 2021, Fig. 1; the same analysis motivates
LayerAttPooler, Oh et al. 2022): how well each layer's vectors, read with [CLS], mean or max
pooling, already score on STS. Layer 0 is the embedding layer, layer L the last transformer
layer; ``cls`` is the raw [CLS] vector of that layer (no pooler). The score is Spearman ×100 of
the cosine similarity against the gold scores of each set (STS-B dev by default), and the
mean over the sets.

One forward pass per batch gives every layer: each sentence is embedded once and every
(layer, pooling) vector is read off the same hidden states. Imports no Ray.
"""

from __future__ import annotations

import dataclasses
import math
import time
import warnings
from collections.abc import Callable, Sequence

import numpy as np
import torch

from raysent.data import ScoredPairs, load
from raysent.errors import RaysentError
from raysent.eval.sts import score_pairs
from raysent.models.embedder import Embedder
from raysent.models.pooling import pool

LAYER_POOLINGS = ("cls", "mean", "max")


def layer_grid(
    encoder,
    specs: Sequence[str] = ("stsb:dev",),
    poolings: Sequence[str] = LAYER_POOLINGS,
    max_pairs: int | None = None,
    max_length: int = 256,
    batch_size: int = 128,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """Spearman ×100 of every (layer, pooling) of ``encoder`` (a :class:`raysent.models.encoder.Encoder`).

    ``max_pairs`` keeps the first N pairs of each set (a quick check; noted in the result).
    Returns ``{"layers": [0..L], "poolings", "sets", "n_pairs", "grid": {pooling: [score per layer]}
    (mean over the sets), "per_set": {set: {pooling: [...]}}, "best": {layer, pooling, score}, "notes"}``.
    """
    bad = [p for p in poolings if p not in LAYER_POOLINGS]
    if bad or not poolings:
        raise RaysentError(f"--layer-poolings {' '.join(bad) or '(none)'}: allowed: {', '.join(LAYER_POOLINGS)}")
    if max_pairs is not None and max_pairs < 2:
        raise RaysentError(f"--max-samples {max_pairs}: a correlation needs at least 2 pairs")
    t0 = time.perf_counter()
    notes: list[str] = []
    sets: dict[str, ScoredPairs] = {}
    for spec in specs:
        data = load(spec, "scored_pairs")
        if max_pairs is not None and len(data) > max_pairs:
            data = dataclasses.replace(data, sentence1=data.sentence1[:max_pairs], sentence2=data.sentence2[:max_pairs],
                                       scores=np.asarray(data.scores)[:max_pairs],
                                       subsets=list(data.subsets)[:max_pairs], notes=list(data.notes))
            notes.append(f"{spec}: the first {max_pairs} pairs only (--max-samples; not the full set)")
        notes += data.notes
        sets[spec] = data
    layers = list(range(encoder.num_layers + 1))
    combos = [(k, p) for k in layers for p in poolings]

    def embed(tok: dict) -> torch.Tensor:
        hs = encoder(tok["input_ids"], tok["attention_mask"])
        return torch.cat([pool(f"layer{k}_{p}", hs, tok["attention_mask"]) for k, p in combos], dim=1)

    sentences = list(dict.fromkeys(s for d in sets.values() for s in d.sentences()))
    if progress:
        progress(f"embedding {len(sentences):,} distinct sentences: {len(layers)} layers × {len(poolings)} poolings")
    vecs = Embedder(embed, encoder.tokenizer, module=encoder, max_length=max_length, batch_size=batch_size)(sentences)
    d = encoder.hidden_size
    per_set: dict[str, dict[str, list[float | None]]] = {s: {p: [] for p in poolings} for s in sets}
    for i, (k, p) in enumerate(combos):
        block = dict(zip(sentences, vecs[:, i * d:(i + 1) * d]))
        for spec, data in sets.items():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # scipy's ConstantInputWarning: reported below instead
                rho = score_pairs(block, data).spearman_all
            if not math.isfinite(rho):
                notes.append(f"layer {k} {p} on {spec}: every pair has the same cosine (the vector does not depend "
                             "on the sentence, e.g. layer 0's [CLS]), so the correlation is undefined (null)")
            per_set[spec][p].append(rho if math.isfinite(rho) else None)
    grid = {p: [None if any(per_set[s][p][k] is None for s in sets)
                else float(np.mean([per_set[s][p][k] for s in sets])) for k in layers] for p in poolings}
    best = max(((grid[p][k], k, p) for p in poolings for k in layers if grid[p][k] is not None),
               default=(None, None, None))
    return {"model": encoder.source, "layers": layers, "poolings": list(poolings), "sets": list(sets),
            "n_pairs": {s: len(d) for s, d in sets.items()}, "grid": grid, "per_set": per_set,
            "best": {"layer": best[1], "pooling": best[2], "score": best[0]},
            "notes": notes, "seconds": time.perf_counter() - t0}


def format_grid(result: dict, title: str = "") -> str:
    """Layers as rows, poolings as columns; the best cell marked with *."""
    pools = result["poolings"]
    lines = [title] if title else []
    lines.append("layer  " + "  ".join(f"{p:>8s}" for p in pools))
    b = result["best"]
    for k in result["layers"]:
        cells = []
        for p in pools:
            v = result["grid"][p][k]
            mark = "*" if (k, p) == (b["layer"], b["pooling"]) else " "
            cells.append(("    n/a" if v is None else f"{v:7.2f}") + mark)
        lines.append((f"{k:5d}  " + "  ".join(cells)).rstrip())
    sets = ", ".join(f"{s} ({n} pairs)" for s, n in result["n_pairs"].items())
    best = f"layer {b['layer']} {b['pooling']} {b['score']:.2f}" if b["score"] is not None else "none"
    lines.append(f"(Spearman x100 of cosine on {sets}; layer 0 = embeddings; cls = raw [CLS] of the layer; "
                 f"* best: {best})")
    lines += [f"note: {n}" for n in result.get("notes", [])]
    return "\n".join(lines)
