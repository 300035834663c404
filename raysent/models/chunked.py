"""One batch through a transformer in several pieces, with the result of one piece.

Two speedups of the training forward pass, both exact (the same hidden states, loss and gradients
as one forward of the whole batch, up to float rounding; dropout draws its masks piece by piece):

* **Length buckets** (``train.length_buckets``): the rows of a batch are sorted by length and cut
  into k buckets, each padded only to its own longest row. A batch keeps its sentences (the
  negatives of a contrastive loss do not change, unlike bucketing *across* batches), only the
  padding shrinks: with SimCSE's wiki1m sentences at max length 32, a batch of 64 is 68 % real
  tokens padded to its longest row and 88 % in 4 buckets. Hidden states come back padded to the
  batch width with zeros at padded positions, which no pooling reads (padding is never pooled).
* **Gradient caching** (``train.grad_cache_rows``; Gao, Zhang, Han, Callan 2021. Scaling Deep
  Contrastive Learning Batch Size under Memory Limited Setup, §3: GradCache; sentence-transformers'
  ``CachedMultipleNegativesRankingLoss``): a contrastive batch larger than the accelerator's memory.
  Pass 1 runs the encoder over chunks of ``rows`` rows without a graph and hands the method detached
  hidden states; the method's loss (heads, pooling, negatives across the whole batch) is built and
  back-propagated to those states (the cached gradients); pass 2 runs each chunk again with a graph,
  with the random state of pass 1 (the same dropout masks), and back-propagates the cached
  gradients into the encoder. Memory: one chunk's activations plus the batch's hidden states.

Torch only (no Ray): :class:`raysent.models.encoder.Encoder` calls these.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

MIN_BUCKET_ROWS = 8  # smaller buckets cost more in per-call overhead than they save in padding
MIN_SAVING = 0.10  # bucket only when it removes at least this share of the padded tokens


def _forward(model: nn.Module, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
    mask = inputs.get("attention_mask")
    if mask is not None and mask.dim() == 2 and getattr(getattr(model, "config", None), "_attn_implementation",
                                                        None) == "sdpa":
        # transformers' SDPA path asks ``mask.all()`` at every forward (to drop a mask that hides nothing), which
        # makes the host wait on a CUDA device; a prepared 4D mask (True: attend) is taken as it is. The same hidden
        # states and gradients, bit for bit, on CPU (tests/models/test_pooling.py)
        inputs = {**inputs, "attention_mask": mask.bool()[:, None, None, :]}
    return tuple(model(**inputs, output_hidden_states=True, return_dict=True).hidden_states)


def _pad_cat(outs: list[tuple[torch.Tensor, ...]], width: int) -> tuple[torch.Tensor, ...]:
    """Per layer, the pieces' states padded back to ``width`` and stacked along the rows."""
    return tuple(torch.cat([F.pad(o[layer], (0, 0, 0, width - o[layer].shape[1])) for o in outs])
                 for layer in range(len(outs[0])))


def row_widths(mask: torch.Tensor) -> torch.Tensor:
    """Per row, the position after its last real token (right padding; holes inside are kept)."""
    pos = torch.arange(1, mask.shape[1] + 1, device=mask.device)
    return (mask.bool() * pos).amax(dim=1).clamp(min=1)


def forward_pieces(model: nn.Module, inputs: dict[str, torch.Tensor],
                   pieces: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """Hidden states of every layer for ``inputs`` ([B, T] tensors), computed one piece of rows at a time.

    Each piece (row indices) is trimmed to its own widest row; the states are padded back to T with
    zeros and put back in row order.
    """
    mask = inputs["attention_mask"]
    width = mask.shape[1]
    widths = row_widths(mask)
    get_table = getattr(model, "get_input_embeddings", None)  # a Hugging Face model's (not nn.Module's)
    table = get_table() if get_table is not None else None
    if table is not None and "input_ids" in inputs and torch.is_grad_enabled():
        # the token embeddings of the whole batch in one lookup: one backward into the (large) embedding
        # table instead of one dense gradient per piece; the model adds positions and types per piece
        inputs = {("inputs_embeds" if k == "input_ids" else k): (table(v) if k == "input_ids" else v)
                  for k, v in inputs.items()}
    outs = []
    for idx in pieces:
        w = int(widths[idx].max())
        outs.append(_forward(model, {k: v[idx, :w] for k, v in inputs.items()}))
    order = torch.cat(list(pieces))
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel(), device=order.device)
    return tuple(h[inverse] for h in _pad_cat(outs, width))


def length_buckets(mask: torch.Tensor, buckets: int) -> list[torch.Tensor] | None:
    """Row indices of up to ``buckets`` length buckets, or None when bucketing would not pay."""
    rows, width = mask.shape
    k = min(buckets, rows // MIN_BUCKET_ROWS)
    if k <= 1:
        return None
    widths = row_widths(mask)
    order = torch.argsort(widths, stable=True)
    pieces = list(order.tensor_split(k))
    padded = sum(len(p) * int(widths[p].max()) for p in pieces)
    if padded > (1.0 - MIN_SAVING) * rows * width:
        return None
    return pieces


def hidden_states(model: nn.Module, inputs: dict[str, torch.Tensor], buckets: int = 1) -> tuple[torch.Tensor, ...]:
    """Every layer's hidden states of ``model`` (an HF encoder) for one batch, in length buckets."""
    pieces = length_buckets(inputs["attention_mask"], buckets) if buckets > 1 else None
    if pieces is None:
        return _forward(model, inputs)
    return forward_pieces(model, inputs, pieces)


def _rng_state() -> tuple:
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    return torch.get_rng_state(), cuda


def _set_rng_state(state: tuple) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state_all(state[1])


class GradCache:
    """Gradient caching over every encoder call of one training step (see the module docstring).

    Used by the training loop as::

        with encoder.grad_cache(rows) as cache:
            loss = method(batch).loss     # pass 1: the encoder answers with detached states
            loss.backward()               # the method's own parameters, and the cached gradients
            cache.backward()              # pass 2: chunk by chunk into the encoder
    """

    def __init__(self, rows: int, buckets: int = 1):
        if rows < 1:
            raise ValueError(f"grad cache chunk must hold at least one row, got {rows}")
        self.rows = rows
        self.buckets = buckets
        self.calls: list[tuple] = []

    def forward(self, model: nn.Module, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        n = inputs["attention_mask"].shape[0]
        chunks = list(torch.arange(n, device=inputs["attention_mask"].device).split(self.rows))
        states, outs = [], []
        with torch.no_grad():
            for idx in chunks:
                states.append(_rng_state())
                part = {k: v[idx] for k, v in inputs.items()}
                outs.append(self._chunk(model, part))
        width = inputs["attention_mask"].shape[1]
        leaves = tuple(h.detach().requires_grad_(True) for h in _pad_cat(outs, width))
        self.calls.append((model, inputs, chunks, states, leaves))
        return leaves

    def _chunk(self, model: nn.Module, part: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        w = int(row_widths(part["attention_mask"]).max())
        return hidden_states(model, {k: v[:, :w] for k, v in part.items()}, self.buckets)

    def backward(self, autocast=contextlib.nullcontext) -> None:
        """Pass 2: each chunk again (its forward inside ``autocast()``), with pass 1's random state,
        back-propagating the cached gradients."""
        after = _rng_state()
        try:
            for model, inputs, chunks, states, leaves in self.calls:
                used = [i for i, leaf in enumerate(leaves) if leaf.grad is not None]
                if not used:
                    continue
                for idx, state in zip(chunks, states):
                    _set_rng_state(state)
                    part = {k: v[idx] for k, v in inputs.items()}
                    with autocast():
                        hs = self._chunk(model, part)
                    w = hs[0].shape[1]
                    torch.autograd.backward([hs[i] for i in used], [leaves[i].grad[idx, :w] for i in used])
        finally:
            _set_rng_state(after)
            self.calls.clear()
