"""Poolings: how a sentence vector is read off an encoder's hidden states.

Every pooling respects the attention mask: padding never enters a mean or a max.
``hidden_states`` is the tuple an encoder returns with ``output_hidden_states=True``: index 0 is
the embedding layer (layer 0 of SG-BERT, Kim et al. 2021), index L the last transformer layer.

=====================  =========================================================================
name                   vector
=====================  =========================================================================
``cls``                last-layer [CLS] through a dense+tanh MLP: the model's pooler at
                       inference, SimCSE's MLP (Gao et al. 2021, §6.3) during training
``cls_before_pooler``  last-layer [CLS] as it is
``cls_mlp_train``      ``cls`` while training, ``cls_before_pooler`` at inference (SimCSE's
                       unsupervised setting, ``--mlp_only_train``)
``mean``               mean of the last layer's tokens
``mean_no_cls``        mean of the last layer's tokens except [CLS] (Liao 2021, §3: "pool the output
                       token embeddings except the first [CLS] token"; the authors' code also
                       averages the padding as zeros, dividing by the padded length: raysent
                       keeps the masked mean)
``max``                element-wise max of the last layer's tokens
``first_last_avg``     mean over tokens of (layer 1 + layer L) / 2 (SimCSE's ``avg_first_last``)
``last2_avg``          mean over tokens of (layer L-1 + layer L) / 2 (ConSERT's evaluation pooling,
                       Yan et al. 2021, §4.1)
``layer<K>_<cls|mean|max>``  one layer K (0 = embeddings) with cls, mean or max, e.g. ``layer2_mean``
``layeratt``           the trained layer-wise attention pooler of Oh et al. 2022 (Eq. 1-5), only
                       for models trained with the ``layeratt`` method (the head is saved with them)
=====================  =========================================================================
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# Lazy imports: torch (the names and checks of the poolings are read by commands before torch loads: a bad
# --pooling is refused at once).

BASE_POOLINGS = ("cls", "cls_before_pooler", "cls_mlp_train", "mean", "mean_no_cls", "max", "first_last_avg",
                 "last2_avg")
HEAD_POOLINGS = ("layeratt",)  # need a trained head that travels with the model
_LAYER_RE = re.compile(r"^layer(\d+)_(cls|mean|max)$")


def is_valid_pooling(name: str) -> bool:
    return name in BASE_POOLINGS or name in HEAD_POOLINGS or bool(_LAYER_RE.match(str(name)))


def describe_allowed() -> str:
    return (", ".join(BASE_POOLINGS) + ", layer<K>_<cls|mean|max> (K = 0 for the embeddings .. L), or layeratt (a "
            "model the layeratt method trained)")


def check_pooling(value, field: str, also: tuple[str, ...] = (), error: type[Exception] = ValueError):
    """``value`` if it names a pooling (or one of ``also``, or is None), else ``error`` (ValueError for pydantic
    validators, RaysentError for a command-line option) naming ``field`` and what is allowed: the one check every
    config field and option that takes a pooling goes through."""
    if value is None or value in also or is_valid_pooling(value):
        return value
    extra = "".join(f", {a}" for a in also)
    raise error(f"unknown {field} {value!r}; allowed: {describe_allowed()}{extra}")


def inference_pooling(name: str) -> str:
    """The pooling used at inference for a training pooling (only ``cls_mlp_train`` differs)."""
    return "cls_before_pooler" if name == "cls_mlp_train" else name


def uses_mlp(name: str, training: bool) -> bool:
    """Whether the pooling needs a head: the dense+tanh [CLS] MLP, or a trained pooler (layeratt)."""
    return name in ("cls", "layeratt") or (name == "cls_mlp_train" and training)


def masked_mean(tokens: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Mean over the real tokens of ``tokens`` [B, T, d] (mask [B, T])."""
    mask = attention_mask.unsqueeze(-1).to(tokens.dtype)
    return (tokens * mask).sum(1) / mask.sum(1).clamp(min=1e-9)


def masked_max(tokens: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Element-wise max over the real tokens of ``tokens`` [B, T, d]."""
    import torch

    mask = attention_mask.unsqueeze(-1).bool()
    return tokens.masked_fill(~mask, torch.finfo(tokens.dtype).min).max(dim=1).values


def pool(
    name: str,
    hidden_states: Sequence[torch.Tensor],
    attention_mask: torch.Tensor,
    mlp: torch.nn.Module | None = None,
    training: bool = False,
) -> torch.Tensor:
    """Sentence vectors [B, d] for the pooling ``name`` (see the module docstring).

    ``mlp`` is the head: the dense+tanh applied to [CLS] for ``cls`` (and ``cls_mlp_train`` while
    training), or the layer-wise attention pooler for ``layeratt``; required for those, ignored
    otherwise.
    """
    last = hidden_states[-1]
    if name == "layeratt":
        if mlp is None:
            raise ValueError("pooling 'layeratt' needs the trained layer-wise attention pooler")
        return mlp(hidden_states, attention_mask)
    if name in ("cls", "cls_before_pooler", "cls_mlp_train"):
        vec = last[:, 0]
        if uses_mlp(name, training):
            if mlp is None:
                raise ValueError(f"pooling {name!r} needs the [CLS] MLP (a pooler), and none was given")
            vec = mlp(vec)
        return vec
    if name == "mean":
        return masked_mean(last, attention_mask)
    if name == "mean_no_cls":
        return masked_mean(last[:, 1:], attention_mask[:, 1:])
    if name == "max":
        return masked_max(last, attention_mask)
    if name == "first_last_avg":
        return masked_mean((hidden_states[1] + last) / 2.0, attention_mask)
    if name == "last2_avg":
        return masked_mean((hidden_states[-2] + last) / 2.0, attention_mask)
    m = _LAYER_RE.match(str(name))
    if m:
        k, how = int(m.group(1)), m.group(2)
        if k >= len(hidden_states):
            raise ValueError(f"pooling {name!r}: the model has layers 0..{len(hidden_states) - 1}")
        h = hidden_states[k]
        if how == "cls":
            return h[:, 0]
        return masked_mean(h, attention_mask) if how == "mean" else masked_max(h, attention_mask)
    raise ValueError(f"unknown pooling {name!r}; allowed: {describe_allowed()}")

