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

Each function draws from torch's global RNG, so views are seeded with the run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import torch
from torch import nn

AUGMENTATIONS = ("none", "shuffle", "token_cutoff", "feature_cutoff", "dropout", "adversarial")


def shuffle_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """[B, T] position ids: a random permutation of 0..n-1 over each row's n real tokens."""
    b, t = attention_mask.shape
    pos = torch.arange(t, device=attention_mask.device).repeat(b, 1)
    for i, n in enumerate(attention_mask.sum(1).tolist()):
        pos[i, :n] = torch.randperm(n, device=attention_mask.device)
    return pos


def token_cutoff(emb: torch.Tensor, attention_mask: torch.Tensor, rate: float) -> torch.Tensor:
    """Zero ⌊n·rate⌋ randomly chosen real-token rows of each sentence (attention mask unchanged)."""
    keep = torch.ones(emb.shape[:2], dtype=emb.dtype, device=emb.device)
    for i, n in enumerate(attention_mask.sum(1).tolist()):
        k = int(n * rate)
        if k:
            keep[i, torch.randperm(n, device=emb.device)[:k]] = 0
    return emb * keep[:, :, None]


def feature_cutoff(emb: torch.Tensor, rate: float) -> torch.Tensor:
    """Zero ⌊d·rate⌋ randomly chosen hidden dimensions of each sentence, at every position."""
    b, _, d = emb.shape
    k = int(d * rate)
    keep = torch.ones((b, d), dtype=emb.dtype, device=emb.device)
    for i in range(b):
        if k:
            keep[i, torch.randperm(d, device=emb.device)[:k]] = 0
    return emb * keep[:, None, :]


def embedding_dropout(emb: torch.Tensor, attention_mask: torch.Tensor, rate: float) -> torch.Tensor:
    """Zero ⌊n·d·rate⌋ randomly chosen elements among each sentence's real-token rows (no rescaling)."""
    _, t, d = emb.shape
    keep = torch.ones(emb.shape, dtype=emb.dtype, device=emb.device)
    for i, n in enumerate(attention_mask.sum(1).tolist()):
        k = int(n * d * rate)
        if k:
            flat = torch.randperm(n * d, device=emb.device)[:k]
            keep[i].view(-1)[flat] = 0  # the first n rows are the real tokens (right padding)
    return emb * keep


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
    views = list(row_views)

    def hook(module, args, output):
        out = output
        for name in set(views):
            rows = torch.tensor([i for i, v in enumerate(views) if v == name], device=out.device)
            if name in ("none", "shuffle"):
                continue
            part, mask = out[rows], attention_mask[rows]
            if name == "token_cutoff":
                part = token_cutoff(part, mask, rates["token_cutoff"])
            elif name == "feature_cutoff":
                part = feature_cutoff(part, rates["feature_cutoff"])
            elif name == "dropout":
                part = embedding_dropout(part, mask, rates["dropout"])
            elif name == "adversarial":
                if noise is None:
                    raise ValueError("the adversarial view needs the supervised loss's gradient")
                part = part + noise[rows].detach()
            else:
                raise ValueError(f"unknown augmentation {name!r}; allowed: {', '.join(AUGMENTATIONS)}")
            out = out.index_copy(0, rows, part)
        if capture is not None:
            capture.append(out)
        return out

    handle = embeddings.register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()
