"""Unsupervised SimCSE (Gao, Yao, Chen 2021. SimCSE: Simple Contrastive Learning of Sentence
Embeddings; arXiv:2104.08821, §3, and the official code princeton-nlp/SimCSE).

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

from raysent.methods.base import LossOutput, Method
from raysent.methods.losses import info_nce
from raysent.methods.spec import SimCSEUnsupParams, SimCSEUnsupSpec


class SimCSEUnsup(SimCSEUnsupSpec, Method):
    params: SimCSEUnsupParams

    def forward(self, batch: dict) -> LossOutput:
        tok = batch["text"]
        n = tok["input_ids"].shape[0]
        z1, z2 = self.encode_parts([tok, tok])  # two dropout masks (one concatenated forward by default)
        g = self.gatherer
        loss = info_nce(z1, z2, self.params.temperature, gather=g, offset=g.offset(n))
        return LossOutput(loss)
