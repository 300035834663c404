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

import torch
from torch.nn import functional as F

from raysent.methods.base import LossOutput
from raysent.methods.losses import cosine_matrix, dot_matrix
from raysent.methods.sbert_nli import SBERTNLI
from raysent.methods.spec import SupConParams, SupConSpec

ENTAILMENT = 0


def random_subset(members: torch.Tensor, cap: int) -> torch.Tensor:
    """Per row of the boolean ``members`` [a, m], a uniform random subset of at most ``cap`` of its True entries
    (all of them where there are no more than ``cap``): random keys ranked within the row, drawn for every row
    at once on the device."""
    keys = torch.rand(members.shape, device=members.device).masked_fill(~members, 2.0)  # non-members rank last
    order = keys.argsort(dim=1)
    ranks = torch.empty_like(order).scatter_(1, order, torch.arange(members.shape[1], device=members.device)
                                             .expand_as(order))
    return members & (ranks < cap)


def scl_loss(anchors: torch.Tensor, anchor_groups: torch.Tensor, cands: torch.Tensor, cand_groups: torch.Tensor,
             cand_labels: torch.Tensor, temperature: float, pos_cap="all", neg_cap="all",
             normalize: bool = False, anchor_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum of L_SCL over ``anchors`` [a, d] against the candidates [m, d]; returns (sum, anchors used), both
    tensors on the device (every anchor at once: no loop over rows, no host sync).

    Candidate k is a positive of anchor i iff ``cand_groups[k] == anchor_groups[i]`` and its label is
    entailment; every other candidate is a negative. An anchor without a positive, or outside ``anchor_mask``
    (when given), adds nothing.
    """
    logits = (cosine_matrix if normalize else dot_matrix)(anchors, cands) / temperature  # [a, m]
    same = anchor_groups[:, None] == cand_groups[None, :]
    pos = same & (cand_labels[None, :] == ENTAILMENT)
    neg = ~pos
    if pos_cap != "all":
        pos = random_subset(pos, int(pos_cap))
    if neg_cap != "all":
        neg = random_subset(neg, int(neg_cap))
    # log e^{s_ij} / Σ_{k ∈ P(i) ∪ N(i)} e^{s_ik}, then the mean over j ∈ P(i)
    log_prob = logits - torch.logsumexp(logits.masked_fill(~(pos | neg), float("-inf")), dim=1, keepdim=True)
    n_pos = pos.sum(dim=1)
    per_anchor = -log_prob.masked_fill(~pos, 0.0).sum(dim=1) / n_pos.clamp(min=1)
    used = n_pos > 0
    if anchor_mask is not None:
        used = used & anchor_mask
    return torch.where(used, per_anchor, 0.0).sum(), used.sum()


class SupCon(SupConSpec, SBERTNLI):
    params: SupConParams

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
        # one anchor per premise: the first row of its group in the global batch (groups may also be split across
        # a batch edge); every row at once, on the device
        off, m = g.offset(n), all_groups.shape[0]
        same = all_groups[:, None] == all_groups[None, :]
        earlier = torch.ones((m, m), dtype=torch.bool, device=all_groups.device).tril(-1)
        first = ~(same & earlier).any(dim=1)
        has_pos = (same & (all_labels == ENTAILMENT)[None, :]).any(dim=1)
        total_anchors = (first & has_pos).sum()
        scl_sum, used = scl_loss(u, groups, all_v, all_groups, all_labels, p.temperature, p.pos_cap, p.neg_cap,
                                 p.scl_normalize, anchor_mask=first[off: off + n])
        # the global mean over anchors: each worker's sum over the total, times the workers (DDP averages)
        scl = scl_sum * g.world_size / total_anchors.clamp(min=1)
        loss = (1 - p.scl_weight) * ce + p.scl_weight * scl
        return LossOutput(loss, {"loss_ce": ce.detach(), "loss_scl": scl.detach(), "anchors": used})
