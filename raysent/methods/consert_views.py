"""ConSERT's views (Yan et al. 2021. ConSERT; arXiv:2105.11741, §3.2, Figure 3).

Views are made at the token-embedding layer: on the output of the encoder's embedding module
(word + position + type embeddings after LayerNorm), as the official code (yym6472/ConSERT,
``_replace_embedding_output``) does, except ``shuffle``, which changes the position ids.

* ``none``: the embeddings as they are.
* ``shuffle``: the position ids of the real tokens ([CLS] and [SEP] included, as the code) are
  permuted; token ids are unchanged and padding keeps its positions (§3.2, "Token Shuffling").
* ``token_cutoff``: ⌊n·rate⌋ of a sentence's n real tokens are zeroed (whole rows; rate 0.15).
* ``feature_cutoff``: ⌊d·rate⌋ of the d hidden dimensions are zeroed at every position (rate 0.2).
* ``dropout``: ⌊n·d·rate⌋ elements of the real-token rows are zeroed, no rescaling (rate 0.2).
* ``adversarial``: FGV (Rozsa et al. 2016): e + ε·g/‖g‖₂ with g the gradient of the supervised loss
  with respect to the embedding output, normalised per token (only with supervision).

Each function draws from torch's global RNG, so views are seeded with the run. Every row's random choice is drawn
at once, on the device (random keys ranked per row): no loop over rows and no host sync in a step (before
2026-11-27 a loop drew ``randperm`` per row: the same distributions, other draws).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import torch
from torch import nn

from raysent.methods.spec import AUGMENTATIONS


def _ranks(keys: torch.Tensor) -> torch.Tensor:
    """The rank of each key in its row (0: the smallest): with uniform random keys, each row's ranks are a uniform
    random permutation, drawn for every row at once on the device (no loop over rows, no host sync)."""
    order = keys.argsort(dim=1)
    ranks = torch.empty_like(order)
    return ranks.scatter_(1, order, torch.arange(keys.shape[1], device=keys.device).expand_as(order))


def _floor_count(real: torch.Tensor, rate: float) -> torch.Tensor:
    """⌊real·rate⌋ per row, computed in float64 as Python's ``int(n * rate)`` is."""
    return (real.to(torch.float64) * rate).floor().to(torch.long)


def shuffle_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """[B, T] position ids: a random permutation of 0..n-1 over each row's n real tokens (padding last, in order)."""
    keys = torch.rand(attention_mask.shape, device=attention_mask.device).masked_fill(attention_mask == 0, 2.0)
    return keys.argsort(dim=1, stable=True)  # the real tokens (keys < 1) first, in random order


def token_cutoff(emb: torch.Tensor, attention_mask: torch.Tensor, rate: float) -> torch.Tensor:
    """Zero ⌊n·rate⌋ randomly chosen real-token rows of each sentence (attention mask unchanged)."""
    keys = torch.rand(emb.shape[:2], device=emb.device).masked_fill(attention_mask == 0, 2.0)  # padding ranks last
    cut = _ranks(keys) < _floor_count(attention_mask.sum(1), rate)[:, None]
    return emb * (~cut).to(emb.dtype)[:, :, None]


def feature_cutoff(emb: torch.Tensor, rate: float) -> torch.Tensor:
    """Zero ⌊d·rate⌋ randomly chosen hidden dimensions of each sentence, at every position."""
    b, _, d = emb.shape
    cut = _ranks(torch.rand((b, d), device=emb.device)) < int(d * rate)
    return emb * (~cut).to(emb.dtype)[:, None, :]


def embedding_dropout(emb: torch.Tensor, attention_mask: torch.Tensor, rate: float) -> torch.Tensor:
    """Zero ⌊n·d·rate⌋ randomly chosen elements among each sentence's real-token rows (no rescaling)."""
    b, t, d = emb.shape
    padding = (attention_mask == 0)[:, :, None].expand(b, t, d).reshape(b, t * d)
    keys = torch.rand((b, t * d), device=emb.device).masked_fill(padding, 2.0)
    cut = _ranks(keys) < _floor_count(attention_mask.sum(1) * d, rate)[:, None]
    return emb * (~cut).to(emb.dtype).view(b, t, d)


def view_runs(row_views: Sequence[str]) -> list[tuple[int, int, str]]:
    """``row_views`` as runs of equal views, ``(start, stop, view)``: a batch's views come in blocks (the first
    view's rows, then the second's), so each block is augmented as one slice."""
    runs: list[tuple[int, int, str]] = []
    for i, v in enumerate(row_views):
        if runs and runs[-1][2] == v:
            runs[-1] = (runs[-1][0], i + 1, v)
        else:
            runs.append((i, i + 1, v))
    return runs


def fgv_noise(grad: torch.Tensor, epsilon: float) -> torch.Tensor:
    """ε·g/‖g‖₂ per token (ConSERT's FGV; ``noise_norm`` in its code)."""
    return epsilon * grad / (grad.norm(p=2, dim=-1, keepdim=True) + 1e-10)


@contextlib.contextmanager
def embedding_views(embeddings: nn.Module, row_views: Sequence[str], attention_mask: torch.Tensor,
                    rates: dict[str, float], noise: torch.Tensor | None = None, capture: list | None = None):
    """Apply per-row views to the output of ``embeddings`` for the forwards inside the block.

    ``row_views[i]`` is the view of row i (``shuffle`` is handled by the caller via position ids).
    ``noise`` [B, T, d] is added to the ``adversarial`` rows. ``capture`` receives the (augmented)
    embedding output, e.g. to take the gradient of a loss with respect to it.
    """
    runs = view_runs(row_views)
    for _, _, name in runs:
        if name not in AUGMENTATIONS:
            raise ValueError(f"unknown augmentation {name!r}; allowed: {', '.join(AUGMENTATIONS)}")
        if name == "adversarial" and noise is None:
            raise ValueError("the adversarial view needs the supervised loss's gradient")

    def hook(module, args, output):
        parts = []
        for start, stop, name in runs:  # slices of the batch: no index tensor built on the host
            part, mask = output[start:stop], attention_mask[start:stop]
            if name == "token_cutoff":
                part = token_cutoff(part, mask, rates["token_cutoff"])
            elif name == "feature_cutoff":
                part = feature_cutoff(part, rates["feature_cutoff"])
            elif name == "dropout":
                part = embedding_dropout(part, mask, rates["dropout"])
            elif name == "adversarial":
                assert noise is not None
                part = part + noise[start:stop].detach()
            parts.append(part)  # none, shuffle (the caller's position ids): as it is
        out = parts[0] if len(parts) == 1 else torch.cat(parts)
        if capture is not None:
            capture.append(out)
        return out

    handle = embeddings.register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()
