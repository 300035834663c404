"""The contrastive losses the methods share, each with the paper and equation it implements. Rows are
this worker's; columns may be gathered from every worker (``gather``), with ``offset`` where this
worker's rows start among them (global negatives, :mod:`raysent.train.gather`)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F


def at_least_float32(x: torch.Tensor) -> torch.Tensor:
    """``x`` promoted to float32 if it is narrower (bf16, fp16), unchanged if it is float32 or float64: an upcast
    never downcasts (``.float()`` would turn a float64 check of an equation into float32; sg-opt's 4096-wide
    head then differed from its float64 equation by 3.3e-5 on a loss of 73)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def column_mask(index: torch.Tensor, columns: int) -> torch.Tensor:
    """[len(index), columns] booleans, True at column ``index[i]`` of row i: ``one_hot(index, columns).bool()``
    without its range check, which on a CPU reads the index's minimum back as a number (a host sync)."""
    return torch.arange(columns, device=index.device)[None, :] == index[:, None]


def dot_matrix(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """[n, m] dot products between the rows of a [n, d] and b [m, d], in at least float32 under autocast too.

    The losses divide similarities by τ (0.01-0.1): bf16 (8 significant bits) would round a logit near 20 to
    steps of 0.125, near 100 to steps of 0.5; in bf16 a step's loss moved by up to 6.5e-3 of itself and a
    gradient by up to 13 %, against 1.2e-3 and 1 % with these in float32 (docs/performance.md, "bf16 without a
    GPU"). SimCSE's own ``nn.CosineSimilarity`` runs in float32 under CUDA autocast too; the matrix is b x B,
    small beside the encoder."""
    with torch.autocast(a.device.type, enabled=False):
        return at_least_float32(a) @ at_least_float32(b).T


def cosine_matrix(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """[n, m] cosine similarities between the rows of a [n, d] and b [m, d] (at least float32, as
    :func:`dot_matrix`)."""
    with torch.autocast(a.device.type, enabled=False):
        return dot_matrix(nn.functional.normalize(at_least_float32(a), dim=-1),
                          nn.functional.normalize(at_least_float32(b), dim=-1))


def nt_xent(a: torch.Tensor, b: torch.Tensor, temperature: float, gather=None, offset: int = 0) -> torch.Tensor:
    """NT-Xent (Chen et al. 2020, SimCLR) over the 2N vectors of two views, averaged over the 2N.

    For each x_m of {a_i} ∪ {b_i} the positive is its counterpart (a_i ↔ b_i) and the denominator
    runs over the other 2N − 1 vectors (x_m itself excluded). ``a``, ``b`` [n, d] are this worker's
    rows (cosine similarity); the 2N columns are gathered from every worker; ``offset`` is where
    this worker's rows start. Used by SG's L^base (Kim et al. 2021) and ConSERT's Eq. 1.
    """
    gather = gather or (lambda x: x)
    n = a.shape[0]
    all_a, all_b = gather(a), gather(b)
    big_n = all_a.shape[0]
    logits = cosine_matrix(torch.cat([a, b]), torch.cat([all_a, all_b])) / temperature
    local = torch.arange(n, device=a.device) + offset
    self_cols = torch.cat([local, local + big_n])
    pos_cols = torch.cat([local + big_n, local])
    logits = logits.masked_fill(column_mask(self_cols, 2 * big_n), float("-inf"))
    return nn.functional.cross_entropy(logits, pos_cols)


def info_nce(
    anchors: torch.Tensor,
    candidates: torch.Tensor,
    temperature: float,
    gather: Callable[[torch.Tensor], torch.Tensor] | None = None,
    offset: int = 0,
    extra_logits: torch.Tensor | None = None,
) -> torch.Tensor:
    """SimCSE Eq. 1: cross-entropy of each anchor against all (gathered) candidates.

    ``anchors`` [n, d] are this worker's rows; ``candidates`` [n, d] their positives, in the same
    order. The positive of anchor i is candidate ``offset + i`` of the gathered [N, d] candidates.
    ``extra_logits`` [n, k] are appended as further negatives (already divided by τ).
    """
    cols = gather(candidates) if gather is not None else candidates
    logits = cosine_matrix(anchors, cols) / temperature
    if extra_logits is not None:
        logits = torch.cat([logits, extra_logits], dim=1)
    labels = torch.arange(anchors.shape[0], device=anchors.device) + offset
    return F.cross_entropy(logits, labels)


def hard_negative_loss(anchors, positives, hard_negatives, temperature: float, hard_negative_weight: float = 0.0,
                       gather=None, offset: int = 0) -> torch.Tensor:
    """SimCSE Eq. 5 with the hard-negative weight; rows local, columns gathered.

    Logits of anchor i: [sim(h_i, H^+)/τ | sim(h_i, H^-)/τ + w at column offset+i of the second block].
    """
    negs = gather(hard_negatives) if gather is not None else hard_negatives
    hn_logits = cosine_matrix(anchors, negs) / temperature
    if hard_negative_weight:
        # w at column offset+i of row i (a mask product, not an indexed assignment of a host value)
        rows = torch.arange(anchors.shape[0], device=anchors.device)
        weights = column_mask(rows + offset, hn_logits.shape[1]).to(hn_logits.dtype) * hard_negative_weight
        hn_logits = hn_logits + weights
    return info_nce(anchors, positives, temperature, gather=gather, offset=offset, extra_logits=hn_logits)
