"""Unsupervised SimCSE (Gao, Yao, Chen 2021. SimCSE: Simple Contrastive Learning of Sentence
Embeddings; ../shared/papers/001_*.txt, §3, and the official code princeton-nlp/SimCSE).

Each sentence x_i is encoded twice with independent dropout masks z, z' (one concatenated forward
pass of 2N rows), giving h_i^z and h_i^{z'}. With in-batch negatives and temperature τ the loss is
SimCSE's Eq. 1 with x_i^+ = x_i:

    l_i = −log  exp(sim(h_i^{z_i}, h_i^{z'_i}) / τ)  /  Σ_{j=1..N} exp(sim(h_i^{z_i}, h_j^{z'_j}) / τ)

sim is cosine similarity; the loss is the mean of l_i over the batch. On several workers the
columns h_j^{z'} are gathered from every worker (global negatives), the rows stay local.

Pooling: [CLS] with the MLP (dense+tanh) during training only, [CLS] without it at inference
(``cls_mlp_train``, SimCSE's ``--pooler_type cls --mlp_only_train``, §6.3).

Paper defaults (SimCSE's run_unsup_example.sh, BERT-base): wiki1m, 1 epoch, batch 64, lr 3e-5,
max length 32, τ 0.05, STS-B dev every 125 steps, best checkpoint kept.

Example::

    raysent train search_spaces/simcse-unsup.yaml
"""

from __future__ import annotations

from typing import Callable

import torch
from pydantic import Field, field_validator
from torch.nn import functional as F

from raysent.methods.base import LossOutput, Method, MethodParams, cosine_matrix
from raysent.models.pooling import describe_allowed, is_valid_pooling


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


class PoolingParams(MethodParams):
    pooling: str = "cls_mlp_train"

    @field_validator("pooling")
    @classmethod
    def _pooling(cls, v):
        if not is_valid_pooling(v):
            raise ValueError(f"unknown pooling {v!r}; allowed: {describe_allowed()}")
        return v


class SimCSEUnsupParams(PoolingParams):
    temperature: float = Field(0.05, gt=0, description="τ (Gao et al. 2021, §3)")
    pooling: str = Field("cls_mlp_train", description="[CLS]+MLP at train, [CLS] at test (SimCSE §6.3)")


class SimCSEUnsup(Method):
    name = "simcse-unsup"
    paper = "Gao, Yao, Chen 2021. SimCSE: Simple Contrastive Learning of Sentence Embeddings"
    summary = "two dropout views of each sentence, in-batch negatives, InfoNCE (Eq. 1)"
    Params = SimCSEUnsupParams
    kind = "sentences"
    data_defaults = {"train": "wiki1m"}
    train_defaults = {"batch_size": 64, "lr": 3e-5, "max_length": 32, "eval_every": 125, "epochs": 1}

    def forward(self, batch: dict) -> LossOutput:
        tok = batch["text"]
        n = tok["input_ids"].shape[0]
        z1, z2 = self.encode_parts([tok, tok])  # two dropout masks (one concatenated forward by default)
        g = self.gatherer
        loss = info_nce(z1, z2, self.params.temperature, gather=g, offset=g.offset(n))
        return LossOutput(loss)
