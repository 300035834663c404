"""Contrastive learning with layer-wise attention pooling (Oh, Kim, Lee, Huang, Lim 2022. Don't Judge
a Language Model by Its Last Layer; arXiv:2209.05972, §2; code nlpods/LayerAttPooler).

The sentence vector h is read off *every* layer by the attention pooler of Eq. 1-5
(raysent.models.heads.LayerAttentionPooler: per-layer [CLS] as queries, per-layer means as keys
and values, averaged, concatenated with the last layer's [CLS], then an MLP back to hidden size).
It is trained with one of three contrastive objectives (§2.2):

* ``eq6`` — pairs (x_i, x_i^+) with in-batch negatives:
  l_i = −log e^{sim(h_i,h_i^+)/τ} / Σ_{j=1..M} e^{sim(h_i,h_j^+)/τ}                           (Eq. 6)
* ``eq7`` — unsupervised, two dropout views of each sentence (SimCSE-unsup with this pooler) (Eq. 7)
* ``eq8`` — NLI triplets, contradictions as hard negatives:
  l_i = −log e^{sim(h_i,h_i^+)/τ} / Σ_j (e^{sim(h_i,h_j^+)/τ} + e^{sim(h_i,h_j^−)/τ})           (Eq. 8)

Eq. 6 and 8 train on NLI triplets (Eq. 6 uses (sent0, sent1) and ignores hard_neg). At inference
the pooler is kept (``inference: pooler``, the STS setting of Table 1; saved with the model) or
dropped for the plain last-layer [CLS] (``inference: cls``, the semantic-search setting of
Table 3). Defaults (Table 4, BERT-base): eq7 batch 64, lr 3e-5; eq6 batch 256, lr 1e-5; eq8 batch
256, lr 2e-5; τ 0.05 as SimCSE, whose setup the paper follows. Max length, epochs and the dev cadence
are not in the paper: eq6/eq8 take the authors' supervised script's (64, 3 epochs, every 100 steps;
raysent used SimCSE's 32, 1, 125 before 0.2), eq7 SimCSE's unsupervised ones (32, 1, 125).
"""

from __future__ import annotations

from typing import Any

import torch

from raysent.methods.base import LossOutput, Method
from raysent.methods.losses import hard_negative_loss, info_nce
from raysent.methods.spec import LayerAttParams, LayerAttSpec
from raysent.models.heads import LayerAttentionPooler


class LayerAtt(LayerAttSpec, Method):
    params: LayerAttParams

    def __init__(self, encoder, params: LayerAttParams):
        super().__init__(encoder, params)
        self.pooler = LayerAttentionPooler(encoder.hidden_size)

    def fields(self, data):
        if self.params.objective == "eq7":
            return super().fields(data)
        if self.params.objective == "eq6":
            return {"sent0": data.sent0, "sent1": data.sent1}, {}
        return {"sent0": data.sent0, "sent1": data.sent1, "hard_neg": data.hard_neg}, {}

    def pooled(self, tok: dict) -> torch.Tensor:
        return self.pooler(self.encoder(**tok), tok["attention_mask"])

    def inference_pooling(self) -> str:
        return "layeratt" if self.params.inference == "pooler" else "cls_before_pooler"

    def embed(self, tok: dict) -> torch.Tensor:
        if self.params.inference == "pooler":
            return self.pooled(tok)
        return self.encoder.embed(tok, "cls_before_pooler")

    def embeds_with(self) -> tuple[dict[str, Any], list[dict[str, torch.Tensor]]]:
        pooling = self.inference_pooling()
        if pooling == "layeratt":
            return {"pooling": pooling}, [self.encoder.weights_read(pooling, self.pooler), self.pooler.state_dict()]
        return {"pooling": pooling}, [self.encoder.weights_read(pooling)]

    def inference_head(self):
        return self.pooler

    def forward(self, batch: dict) -> LossOutput:
        g, tau = self.gatherer, self.params.temperature
        if self.params.objective == "eq7":
            tok = batch["text"]
            n = tok["input_ids"].shape[0]
            h1, h2 = self.encode_parts([tok, tok], self.pooler)
            return LossOutput(info_nce(h1, h2, tau, gather=g, offset=g.offset(n)))
        n = batch["sent0"]["input_ids"].shape[0]
        if self.params.objective == "eq6":
            h1, h2 = self.encode_parts([batch["sent0"], batch["sent1"]], self.pooler)
            return LossOutput(info_nce(h1, h2, tau, gather=g, offset=g.offset(n)))
        h1, h2, h3 = self.encode_parts([batch["sent0"], batch["sent1"], batch["hard_neg"]], self.pooler)
        return LossOutput(hard_negative_loss(h1, h2, h3, tau, gather=g, offset=g.offset(n)))
