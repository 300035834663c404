"""SBERT on NLI: the cross-entropy baseline (Reimers & Gurevych 2019, Sentence-BERT, §3; the "SBERT
baseline" of Liao 2021, arXiv:2106.04791, Eq. 1; the first stage of ConSERT's
sup-unsup, Yan et al. 2021 §3.3).

Premise and hypothesis are encoded separately by the shared encoder and mean-pooled (u, v); a
softmax classifier over (u, v, |u − v|) predicts entailment / neutral / contradiction:

    L_CE = −(1/N) Σ_i Σ_c y_{i,c} log softmax(W·[u; v; |u−v|] + b)_c          (Liao 2021, Eq. 1)

The classifier is dropped after training; sentences are embedded by mean pooling. (Liao's code
stacks two linear layers without an activation between them, which is one linear map; SBERT's
single linear layer is used.) Defaults, as Liao's SBERT baseline: batch 64, lr 2e-5, 1 epoch,
10 % warmup, mean pooling, SNLI.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from raysent.methods.base import LossOutput, Method, nli_fields
from raysent.methods.spec import SBERTNLIParams, SBERTNLISpec
from raysent.models.heads import PairClassifier


class SBERTNLI(SBERTNLISpec, Method):
    params: SBERTNLIParams

    def __init__(self, encoder, params):
        super().__init__(encoder, params)
        self.classifier = PairClassifier(encoder.hidden_size)

    def fields(self, data):
        return nli_fields(data)

    def inference_pooling(self) -> str:
        return self.params.eval_pooling or super().inference_pooling()

    def encode_pairs(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """(u, v): premises and hypotheses pooled, in one forward pass."""
        u, v = self.encode_parts([batch["premise"], batch["hypothesis"]])
        return u, v

    def forward(self, batch: dict) -> LossOutput:
        u, v = self.encode_pairs(batch)
        loss = F.cross_entropy(self.classifier(u, v), batch["labels"])
        return LossOutput(loss)
