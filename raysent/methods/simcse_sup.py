"""Supervised SimCSE (Gao, Yao, Chen 2021. SimCSE: Simple Contrastive Learning of Sentence
Embeddings; arXiv:2104.08821, §4 and §6.3, and princeton-nlp/SimCSE ``cl_forward``).

Training examples are NLI triplets (x_i, x_i^+, x_i^-): a premise, its entailment and its
contradiction. The three are encoded in one forward pass (h_i, h_i^+, h_i^-). Every anchor sees
every positive of the batch and every contradiction of the batch as negatives (§4, Eq. 5):

    l_i = −log  e^{sim(h_i,h_i^+)/τ} / Σ_{j=1..N} ( e^{sim(h_i,h_j^+)/τ} + e^{sim(h_i,h_j^-)/τ + w·1[i=j]} )

w = ``hard_negative_weight`` is added in log space to each anchor's *own* hard negative only
(SimCSE's "α" of Table 7 is e^w; the paper's best α = 1 is w = 0, the default), after the
division by τ, exactly as ``cl_forward`` adds its weight matrix to ``cos_sim``. On several workers
positives and hard negatives are gathered (global negatives).

Pooling: ``cls`` — [CLS] with the MLP at train *and* test (SimCSE's supervised setting; the MLP is
saved as the model's pooler). Paper defaults (run_sup_example.sh): batch 512 (4 GPUs × 128),
lr 5e-5, 3 epochs, max length 32, τ 0.05, STS-B dev every 125 steps; SNLI+MNLI triplets
(``nli-triplets``).
"""

from __future__ import annotations

from raysent.methods.base import LossOutput, Method
from raysent.methods.losses import hard_negative_loss
from raysent.methods.spec import SimCSESupParams, SimCSESupSpec


class SimCSESup(SimCSESupSpec, Method):
    params: SimCSESupParams

    def fields(self, data):
        return {"sent0": data.sent0, "sent1": data.sent1, "hard_neg": data.hard_neg}, {}

    def forward(self, batch: dict) -> LossOutput:
        n = batch["sent0"]["input_ids"].shape[0]
        z1, z2, z3 = self.encode_parts([batch["sent0"], batch["sent1"], batch["hard_neg"]])  # one forward of 3N rows
        g = self.gatherer
        loss = hard_negative_loss(z1, z2, z3, self.params.temperature, self.params.hard_negative_weight,
                                  gather=g, offset=g.offset(n))
        return LossOutput(loss)
