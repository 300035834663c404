"""ConSERT (Yan, Li, Wang, Zhang, Wu, Xu 2021. ConSERT: A Contrastive Framework for Self-Supervised
Sentence Representation Transfer; arXiv:2105.11741, §3; code yym6472/ConSERT).

Two views of each sentence are made at the token-embedding layer (raysent.methods.consert_views: ``none``,
``shuffle``, ``token_cutoff``, ``feature_cutoff``, ``dropout``, and ``adversarial`` with
supervision), encoded by the shared encoder and mean-pooled (r_i, r_j). The contrastive loss is
NT-Xent over the 2N views of a batch (Eq. 1), averaged over the 2N:

    L_{i,j} = −log  exp(sim(r_i, r_j)/τ) / Σ_{k=1..2N} 1[k≠i] exp(sim(r_i, r_k)/τ)

Supervision (§3.3), with L_ce the softmax classifier over f = (r_1, r_2, |r_1 − r_2|) (Eq. 2):

* ``unsup``: L_con on unlabelled text.
* ``joint``: L_joint = L_ce + α·L_con on NLI (the contrastive views of premises and of hypotheses,
  summed as the official code does); α = ``con_weight``. ``adversarial`` (FGV from the gradient of
  L_ce) is allowed here, as the second view: it is computed from the first view's L_ce.
* ``sup-unsup``: SBERT-NLI (L_ce, stage 1, on ``data.sup``), then ``unsup`` on ``data.train``.
* ``joint-unsup``: ``joint`` (stage 1, on ``data.sup``), then ``unsup`` on ``data.train``.

The two-stage modes run both stages from one config (``stages``): stage 1 uses ``sup_lr``,
``sup_epochs`` and (joint-unsup) ``sup_augmentations``; stage 2 starts from stage 1's best model and
uses ``augmentations`` and the run's own epochs.

Defaults, the paper's where it states one (§4.1): max length 64, the encoder's own dropout off
(``model.dropout: 0``; the official supervised scripts keep it on, ``model.dropout: null`` does that),
token cutoff 0.15, feature cutoff 0.2, dropout 0.2 (the scripts of the supervised modes cut 0.1), τ 0.1,
α 0.15, lr 5e-7, 10 % warmup, batch 96, STS-B dev every 200 steps; mean pooling at train, the average
of the last two layers at evaluation and checkpoint selection (§4.1 "Evaluation"; the scripts select
on last-layer mean pooling: ``select_pooling: mean``); the classifier features of Eq. 2, (r_1, r_2, |r_1 − r_2|)
(``classifier_max_square`` adds the joint script's max(r_1, r_2)²). Where only the official scripts
(yym6472/ConSERT scripts/*-base.sh) say:

* views (``augmentations``; the paper tunes them for ``unsup`` only, Figure 5): ``unsup``
  feature_cutoff + shuffle (Figure 5's best pair, unsup-consert-base.sh); ``joint`` and the joint
  stage of ``joint-unsup`` (``sup_augmentations``) none + token_cutoff (sup-consert-joint-base.sh);
  the unsupervised stage of ``sup-unsup`` none + feature_cutoff (sup-consert-sup-unsup-base.sh) and of
  ``joint-unsup`` none + shuffle (sup-consert-joint-unsup-base.sh);
* epochs: 10 for ``unsup``, 25 for the unsupervised stage of the two-stage modes, patience 10;
  the joint stage's lr 2e-5 and 1 epoch (main.py's defaults), FGV ε 1.0.

Training text: every STS sentence (``sts-unlabeled``, transductive, Table 1).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn import functional as F

from raysent.methods.base import (
    LossOutput,
    Method,
    batch_views,
    concat_batches,
    nli_fields,
)
from raysent.methods.consert_views import embedding_views, fgv_noise, shuffle_positions, view_runs
from raysent.methods.losses import nt_xent
from raysent.methods.spec import ConSERTParams, ConSERTSpec
from raysent.models.heads import PairClassifier


class ConSERT(ConSERTSpec, Method):
    params: ConSERTParams

    def __init__(self, encoder, params: ConSERTParams):
        super().__init__(encoder, params)
        self.classifier = (PairClassifier(encoder.hidden_size, max_square=params.classifier_max_square)
                           if params.supervision == "joint" else None)

    def fields(self, data):
        if self.params.supervision == "joint":
            return nli_fields(data)
        return super().fields(data)

    def inference_pooling(self) -> str:
        return self.params.eval_pooling

    def embed(self, tok: dict) -> torch.Tensor:
        """The dev evaluation's vectors (``select_pooling``; the saved model keeps ``eval_pooling``)."""
        if self.params.select_pooling is None:
            return super().embed(tok)
        return self.encoder.embed(tok, self.params.select_pooling)

    def embeds_with(self) -> tuple[dict[str, Any], list[dict[str, torch.Tensor]]]:
        if self.params.select_pooling is None:
            return super().embeds_with()
        return {"pooling": self.params.select_pooling}, [self.encoder.weights_read(self.params.select_pooling)]

    # ------------------------------------------------------------ views
    def encode_views(self, tok: dict, row_views: list[str], noise=None, capture=None) -> torch.Tensor:
        """Pooled representations of ``tok``'s rows, row i under view ``row_views[i]``."""
        mask = tok["attention_mask"]
        position_ids = None
        if "shuffle" in row_views:
            plain = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
            position_ids = torch.cat([shuffle_positions(mask[a:b]) if v == "shuffle" else plain[a:b]
                                      for a, b, v in view_runs(row_views)])
        # the views act per row inside the encoder: one piece, no length buckets
        with self.encoder.whole_batch(), embedding_views(self.encoder.embeddings, row_views, mask,
                                                         self.params.rates(), noise=noise, capture=capture):
            hs = self.encoder(tok["input_ids"], mask, position_ids=position_ids)
        return self.pool_train(hs, mask)

    def forward(self, batch: dict) -> LossOutput:
        v1, v2 = self.params.augmentations
        g, tau = self.gatherer, self.params.temperature
        if self.params.supervision != "joint":
            tok = batch["text"]
            n = tok["input_ids"].shape[0]
            r = self.encode_views(batch_views(tok, 2), [v1] * n + [v2] * n)  # both views, one forward
            con = nt_xent(r[:n], r[n:], tau, gather=g, offset=g.offset(n))
            return LossOutput(con)
        classifier = self.classifier
        assert classifier is not None  # built in __init__ for supervision 'joint'
        n = batch["premise"]["input_ids"].shape[0]
        tok = concat_batches(batch["premise"], batch["hypothesis"])  # premises, then hypotheses
        if v2 == "adversarial":
            captured: list = []
            r1 = self.encode_views(tok, [v1] * 2 * n, capture=captured)
            ce = F.cross_entropy(classifier(r1[:n], r1[n:]), batch["labels"])
            grad, = torch.autograd.grad(ce, captured[0], retain_graph=True)
            r2 = self.encode_views(tok, ["adversarial"] * 2 * n, noise=fgv_noise(grad, self.params.adv_epsilon))
        else:
            r = self.encode_views(batch_views(tok, 2), [v1] * 2 * n + [v2] * 2 * n)
            r1, r2 = r[: 2 * n], r[2 * n:]
            ce = F.cross_entropy(classifier(r1[:n], r1[n:]), batch["labels"])
        off = g.offset(n)
        con = nt_xent(r1[:n], r2[:n], tau, gather=g, offset=off) + nt_xent(r1[n:], r2[n:], tau, gather=g, offset=off)
        loss = ce + self.params.con_weight * con
        return LossOutput(loss, {"loss_ce": ce.detach(), "loss_con": con.detach()})
