"""Supervised contrastive learning with SBERT (Liao 2021. Sentence Embeddings using Supervised
Contrastive Learning; arXiv:2106.04791, §3; code Danqi7/584-final).

The SBERT network (mean pooling, a softmax classifier over (u, v, |u−v|)) is trained on NLI pairs
with a mix of cross-entropy and a supervised contrastive loss (Eq. 3):

    L = (1 − λ)·L_CE + λ·L_SCL                                           (λ = ``scl_weight``)

L_CE is SBERT's classification loss (Eq. 1). For L_SCL each premise of the batch is one anchor x_i;
its positives are the entailment hypotheses of that premise, its negatives the neutral and
contradiction hypotheses of that premise and every hypothesis of the other premises in the batch
(§3, "Anchor, Positive and Negative Sentence"). With Φ the sentence embedding (Eq. 2):

    L_SCL(x_i) = −(1/N_{i+}) Σ_{j ∈ P(i)} log  e^{Φ(x_i)·Φ(x_j)/τ} / Σ_{k ∈ P(i) ∪ N(i)} e^{Φ(x_i)·Φ(x_k)/τ}

averaged over the anchors that have at least one positive. N+ and N− cap how many positives and
negatives an anchor uses (``pos_cap``/``neg_cap``: ``all`` or a number, drawn at random; §4.4's
"3p3n", "3palln", "allpalln"). Φ·Φ is the dot product as in Eq. 2 and the official code
(``scl_normalize: true`` uses cosine instead). A batch sampler keeps each premise with its
hypotheses (groups of pairs), so anchors have their positives in the batch. On several workers
the hypotheses, their labels and premise ids are gathered: anchors see the global batch.

Defaults (§4.2, best STS model "allpalln-lambda0.3-SCL"): λ 0.3, τ 1.0, N+ = N− = all, batch 64, lr 2e-5,
1 epoch, 10 % warmup; SNLI. Pooling ``mean_no_cls``: the paper pools "the output token embeddings except the
first [CLS] token" (§3), as the authors' ``models.py`` does (it also divides by the padded length, averaging
padding as zeros; raysent keeps the masked mean over the real tokens). Before raysent 0.2 the default was
``mean`` ([CLS] included): the mini suite's supcon rows (results/mini) were trained with it. (The paper
trains BERT 8-layer/512; its numbers are weighted-mean Spearman, the ``wmean`` aggregation.)
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field
from torch.nn import functional as F

from raysent.methods.base import LossOutput
from raysent.methods.losses import cosine_matrix, dot_matrix
from raysent.methods.papers import SUPCON
from raysent.methods.sbert_nli import SBERTNLI, SBERTNLIParams

ENTAILMENT = 0


class SupConParams(SBERTNLIParams):
    pooling: str = Field("mean_no_cls", description="the paper's pooling: the mean of the output tokens except "
                         "[CLS] (§3; mean: SBERT's, [CLS] included)")
    scl_weight: float = Field(0.3, ge=0, le=1, description="λ of (1−λ)·CE + λ·SCL (Eq. 3)")
    temperature: float = Field(1.0, gt=0, description="τ (Table 7: best 1.0)")
    pos_cap: Literal["all"] | int = Field("all", description="N+: positives per anchor (all or a number)")
    neg_cap: Literal["all"] | int = Field("all", description="N−: negatives per anchor (all or a number)")
    scl_normalize: bool = Field(False, description="cosine instead of the paper's dot product")


def scl_loss(anchors: torch.Tensor, anchor_groups: torch.Tensor, cands: torch.Tensor, cand_groups: torch.Tensor,
             cand_labels: torch.Tensor, temperature: float, pos_cap="all", neg_cap="all",
             normalize: bool = False) -> tuple[torch.Tensor, int]:
    """Sum of L_SCL over ``anchors`` [a, d] against the candidates [m, d]; returns (sum, anchors used).

    Candidate k is a positive of anchor i iff ``cand_groups[k] == anchor_groups[i]`` and its label is
    entailment; every other candidate is a negative.
    """
    logits = (cosine_matrix if normalize else dot_matrix)(anchors, cands) / temperature  # [a, m]
    same = anchor_groups[:, None] == cand_groups[None, :]
    pos = same & (cand_labels[None, :] == ENTAILMENT)
    neg = ~pos
    total, used = logits.new_zeros(()), 0
    for i in range(anchors.shape[0]):
        p_idx, n_idx = pos[i].nonzero().flatten(), neg[i].nonzero().flatten()
        if len(p_idx) == 0:
            continue
        if pos_cap != "all" and len(p_idx) > pos_cap:
            p_idx = p_idx[torch.randperm(len(p_idx), device=p_idx.device)[:pos_cap]]
        if neg_cap != "all" and len(n_idx) > neg_cap:
            n_idx = n_idx[torch.randperm(len(n_idx), device=n_idx.device)[:neg_cap]]
        row = logits[i, torch.cat([p_idx, n_idx])]
        log_prob = row - torch.logsumexp(row, dim=0)
        total = total - log_prob[: len(p_idx)].mean()
        used += 1
    return total, used


class SupCon(SBERTNLI):
    name = "supcon"
    paper = "Liao 2021. Sentence Embeddings using Supervised Contrastive Learning"
    arxiv, citation = SUPCON.arxiv, SUPCON.citation
    summary = "(1−λ)·CE over (u, v, |u−v|) + λ·SCL with N+ positives and N− negatives per premise (Eq. 3)"
    Params = SupConParams
    params: SupConParams
    variants = {"pos_cap": ("all", "<n>"), "neg_cap": ("all", "<n>")}
    train_defaults = {"batch_size": 64, "lr": 2e-5, "epochs": 1, "warmup_ratio": 0.1, "max_length": 128,
                      "eval_every": 250}

    def groups(self, data):
        """Each premise's pairs stay together in a batch (the batch sampler of §3)."""
        return self.fields(data)[1]["group"]

    def forward(self, batch: dict) -> LossOutput:
        u, v = self.encode_pairs(batch)
        p = self.params
        ce = F.cross_entropy(self.classifier(u, v), batch["labels"])
        g = self.gatherer
        n = u.shape[0]
        groups, labels = batch["group"], batch["labels"]
        all_groups = g.gather_nograd(groups)
        all_v, all_labels = g(v), g.gather_nograd(labels)
        # one anchor per premise: the first row of its group in the global batch
        off = g.offset(n)
        first = torch.ones_like(all_groups, dtype=torch.bool)
        first[1:] = all_groups[1:] != all_groups[:-1]
        seen = set()
        for k, grp in enumerate(all_groups.tolist()):  # groups may also be split across a batch edge
            if grp in seen:
                first[k] = False
            seen.add(grp)
        mine = first[off: off + n]
        has_pos = torch.tensor([bool(((all_groups == grp) & (all_labels == ENTAILMENT)).any())
                                for grp in all_groups.tolist()], device=u.device)
        total_anchors = int((first & has_pos).sum())
        scl_sum, used = scl_loss(u[mine], groups[mine], all_v, all_groups, all_labels, p.temperature,
                                 p.pos_cap, p.neg_cap, p.scl_normalize)
        # the global mean over anchors: each worker's sum over the total, times the workers (DDP averages)
        scl = scl_sum * g.world_size / max(total_anchors, 1)
        loss = (1 - p.scl_weight) * ce + p.scl_weight * scl
        return LossOutput(loss, {"loss_ce": float(ce.detach()), "loss_scl": float(scl.detach()), "anchors": used})
