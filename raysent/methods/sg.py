"""Self-guided contrastive learning, SG and SG-OPT (Kim, Yoo, Lee 2021. Self-Guided Contrastive
Learning for BERT Sentence Representations; arXiv:2106.07345, §3; code galsang/SG-BERT).

BERT is cloned into BERT_F (fixed: it only provides views) and BERT_T (tuned). For a batch of b
sentences, BERT_F gives the hidden states of every layer k = 0..l (0: the embedding layer), and a
pooling p turns each into a view (§3.1):

    h_{i,k} = p(H_{i,k})            (p: max pooling by default, mean selectable; padding excluded)
    h_i     = σ({h_{i,k}})          (σ: a uniform sampler over the layers, one draw per sentence)
    c_i     = BERT_T(s_i)_[CLS]     (the last layer's [CLS]: the sentence vector after training)

φ(u, v) = exp(g(f(u), f(v)) / τ) with g the cosine and f the projection head (two linear layers of
width 4096, each followed by GELU; footnote 4), applied to c and h alike. The loss variants:

* ``base`` (L^base, §3.1): NT-Xent over the 2b vectors X = {c_i} ∪ {h_i}; x_m's positive is its
  match μ(x_m) (c_i ↔ h_i) and Z = Σ_{n≠m} φ(x_m, x_n); L = (1/2b) Σ_m −log(φ(x_m, μ(x_m)) / Z).
* ``opt1`` (L^opt1, §3.2): only c_i as anchors; Ẑ = Σ_{j≠i} φ(c_i, c_j) + Σ_j φ(c_i, h_j).
* ``opt2`` (L^opt2): only the c–h terms; Z = Σ_j φ(c_i, h_j).
* ``opt3`` (L^opt3 and L^opt, the final SG-OPT loss): every layer's view guides c_i,
  L_{i,k} = −log φ(c_i,h_{i,k}) / (φ(c_i,h_{i,k}) + Σ_{m≠i} Σ_{n=0..l} φ(c_i,h_{m,n})),
  averaged over the b(l+1) pairs (i, k).

Every variant adds λ·L^reg with L^reg = ‖BERT_F − BERT_T‖²₂, the sum of squared differences of all
parameters (footnote 5; ``reg_lambda``). Layer 0 (the embeddings) of BERT_T is frozen (Figure 2).
After training only BERT_T is kept and c_i is used as it is (plain [CLS], no head, no pooling).

On several workers BERT_F lives on each worker outside DDP, and f(c), f(h) are gathered so every
worker's anchors see the global batch's views as negatives.

Defaults (Table 8): τ 0.01, λ 0.1, batch 16, lr 5e-5, AdamW β = (0.9, 0.9), 1 epoch, STS-B dev every
50 steps, early-stopping endurance 10, seeds 1, 2, 3, 4, 1234, 2345, 3456, 7890; data: the
sentences of STS-B train+dev+test (§4.2, ``stsb-unlabeled``); max length 128 and 10 % linear
warmup come from the official code (the paper does not state them). Notes on the official code:
it runs BERT_F with dropout on and pools views with mean by default; the paper says fixed and max,
which is what is done here (``view_pooling: mean`` and ``frozen_dropout: true`` reproduce the code).
"""

from __future__ import annotations

import copy
import time

import numpy as np
import torch
from torch.nn import functional as F

from raysent.methods.base import LossOutput, Method
from raysent.methods.losses import column_mask, cosine_matrix, nt_xent
from raysent.methods.spec import SelfGuidedOptSpec, SelfGuidedSpec, SGOptParams, SGParams
from raysent.models.chunked import hidden_states
from raysent.models.heads import ProjectionHead
from raysent.models.pooling import masked_max, masked_mean

VIEW_CACHE_MAX_BYTES = 8 * 2**30  # larger caches are not built (the views are computed at every step)
VIEW_CACHE_BATCH = 128

# --------------------------------------------------------------------------- the losses
def loss_base(fc: torch.Tensor, fh: torch.Tensor, temperature: float, gather=None, offset: int = 0) -> torch.Tensor:
    """L^base: NT-Xent over the 2b vectors {c} ∪ {h} (one sampled view per sentence), μ(c_i) = h_i.

    ``fc``, ``fh`` [n, w] are this worker's projected c_i and h_i; rows are local, columns global.
    """
    return nt_xent(fc, fh, temperature, gather=gather, offset=offset)


def loss_opt1(fc, fh, temperature: float, gather=None, offset: int = 0) -> torch.Tensor:
    """L^opt1: anchors c_i only; negatives c_j (j≠i) and every h_j; positive h_i."""
    gather = gather or (lambda x: x)
    n = fc.shape[0]
    all_c, all_h = gather(fc), gather(fh)
    big_b = all_c.shape[0]
    logits = cosine_matrix(fc, torch.cat([all_c, all_h], dim=0)) / temperature
    local = torch.arange(n, device=fc.device) + offset
    logits = logits.masked_fill(column_mask(local, 2 * big_b), float("-inf"))  # no φ(c_i, c_i)
    return F.cross_entropy(logits, local + big_b)


def loss_opt2(fc, fh, temperature: float, gather=None, offset: int = 0) -> torch.Tensor:
    """L^opt2: anchors c_i; only the views h_j in Z."""
    gather = gather or (lambda x: x)
    logits = cosine_matrix(fc, gather(fh)) / temperature
    return F.cross_entropy(logits, torch.arange(fc.shape[0], device=fc.device) + offset)


def loss_opt3(fc: torch.Tensor, fh_layers: torch.Tensor, temperature: float, gather=None,
              offset: int = 0) -> torch.Tensor:
    """L^opt3 averaged over b(l+1): ``fh_layers`` [n, l+1, w] are every layer's projected view."""
    gather = gather or (lambda x: x)
    n, n_layers, w = fh_layers.shape
    all_h = gather(fh_layers)  # [B, l+1, w]
    big_b = all_h.shape[0]
    s = (cosine_matrix(fc, all_h.reshape(big_b * n_layers, w)) / temperature).view(n, big_b, n_layers)
    own = torch.arange(n, device=fc.device) + offset
    pos = s[torch.arange(n, device=fc.device), own]  # [n, l+1]: φ(c_i, h_{i,k})
    others = s.masked_fill(column_mask(own, big_b)[:, :, None], float("-inf")).reshape(n, -1)
    neg_lse = torch.logsumexp(others, dim=1, keepdim=True)  # log Σ_{m≠i} Σ_n φ(c_i, h_{m,n})
    return (torch.logaddexp(pos, neg_lse) - pos).mean()


LOSSES = {"base": loss_base, "opt1": loss_opt1, "opt2": loss_opt2}


def lookup_rows(cache: torch.Tensor, index: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``cache[index]`` (a host tensor, host positions) on ``device``: through pinned memory and a non-blocking copy
    on CUDA, so the host does not wait for the device to finish the steps before."""
    rows = cache[index if index.device.type == "cpu" else index.to("cpu")]
    if device.type == "cuda":
        return rows.pin_memory().to(device, non_blocking=True)
    return rows.to(device)


def l2_regularizer(tuned: torch.nn.Module, frozen: torch.nn.Module) -> torch.Tensor:
    """L^reg = ‖θ_F − θ_T‖²₂ summed over every parameter of the encoder (footnote 5).

    A parameter BERT_T does not tune (layer 0) equals BERT_F's for ever and adds exactly 0: it is
    skipped (the word embeddings are most of a small model's parameters).
    """
    frozen_params = dict(frozen.named_parameters())
    total: torch.Tensor | None = None
    for name, p in tuned.named_parameters():
        if not p.requires_grad:
            continue
        d = ((p - frozen_params[name].detach()) ** 2).sum()
        total = d if total is None else total + d
    assert total is not None, "the tuned encoder has no trainable parameter"
    return total


# --------------------------------------------------------------------------- the method
class SelfGuided(SelfGuidedSpec, Method):
    params: SGParams

    def __init__(self, encoder, params: SGParams):
        super().__init__(encoder, params)
        # BERT_F: a frozen clone, out of the optimizer and (raysent.train.ray_train) out of DDP
        self.frozen = copy.deepcopy(encoder.model)
        for p in self.frozen.parameters():
            p.requires_grad_(False)
        self.frozen.eval()
        for p in encoder.embeddings.parameters():  # layer 0 of BERT_T is frozen (Figure 2)
            p.requires_grad_(False)
        self.head = ProjectionHead(encoder.hidden_size, params.head_width)
        n_states = encoder.num_layers + 1
        lo, hi = params.layers if params.layers is not None else (0, n_states - 1)
        if hi >= n_states:
            raise ValueError(f"layers {[lo, hi]}: the model has layers 0..{n_states - 1}")
        self.layer_range = (lo, hi)
        self._view_cache: torch.Tensor | None = None  # BERT_F's views per training sentence (prepare)

    def ddp_ignored(self) -> list[str]:
        """Parameter/buffer names DDP must leave alone (BERT_F stays local to each worker)."""
        return [f"frozen.{n}" for n, _ in self.frozen.named_parameters()] + \
               [f"frozen.{n}" for n, _ in self.frozen.named_buffers()]

    def train(self, mode: bool = True):
        super().train(mode)
        self.frozen.train(mode and self.params.frozen_dropout)
        return self

    def inference_pooling(self) -> str:
        return "cls_before_pooler"  # "we simply use c_i as the final sentence representation"

    def views(self, tok: dict) -> torch.Tensor:
        """h_{i,k} = p(H_{i,k}) for the chosen layers of BERT_F: [b, layers, d] (no gradient)."""
        with torch.no_grad():
            states = hidden_states(self.frozen,
                                   {"input_ids": tok["input_ids"], "attention_mask": tok["attention_mask"]},
                                   self.encoder.length_buckets if self.training else 1)
        lo, hi = self.layer_range
        pool = masked_max if self.params.view_pooling == "max" else masked_mean
        return torch.stack([pool(h, tok["attention_mask"]) for h in states[lo: hi + 1]], dim=1)

    def prepare(self, data, device, log=None) -> dict:
        """BERT_F never changes: with ``speedups.cache_views`` its views of every training sentence are
        computed once here (length-sorted batches, no gradient) and each step looks them up by index.

        Memory: sentences × layers × hidden × 4 bytes, kept in CPU memory (e.g. STS-B's 17,256
        sentences × 13 × 768 for BERT-base: 0.69 GB; wiki1m's 1M: 40 GB, so not cached there).
        Each worker computes the views of all sentences. With ``frozen_dropout`` the views are random,
        so nothing is cached.
        """
        self._view_cache = None
        log = log or (lambda m: None)
        if not self.speedups.cache_views:
            return {}
        if self.params.frozen_dropout:
            log("NOTE: sg: BERT_F runs with dropout (frozen_dropout), so its views differ at every step and are "
                "not cached (train.cache_views has no effect)")
            return {"view_cache": "off (frozen_dropout)"}
        ids = data.ids["text"]
        lo, hi = self.layer_range
        size = len(ids) * (hi - lo + 1) * self.encoder.hidden_size * 4
        if size > VIEW_CACHE_MAX_BYTES:
            log(f"NOTE: sg: BERT_F's views of {len(ids):,} sentences would take {size / 2**30:.1f} GiB (more than "
                f"{VIEW_CACHE_MAX_BYTES / 2**30:.0f} GiB): computed at every step instead")
            return {"view_cache": f"off ({size / 2**30:.1f} GiB needed)"}
        started = time.perf_counter()
        cache = torch.empty(len(ids), hi - lo + 1, self.encoder.hidden_size)
        order = np.argsort([len(x) for x in ids], kind="stable")
        was_training = self.frozen.training
        self.frozen.eval()
        try:
            for start in range(0, len(order), VIEW_CACHE_BATCH):
                chunk = order[start: start + VIEW_CACHE_BATCH]
                tok = {k: v.to(device) for k, v in data.pad([ids[i] for i in chunk]).items()}
                cache[torch.as_tensor(chunk)] = self.views(tok).float().cpu()
        finally:
            self.frozen.train(was_training)
        self._view_cache = cache
        seconds = time.perf_counter() - started
        log(f"sg: cached BERT_F's views of {len(ids):,} sentences ({size / 2**20:.1f} MiB, {seconds:.1f} s)")
        return {"view_cache_mib": size / 2**20, "view_cache_seconds": seconds}

    def forward(self, batch: dict) -> LossOutput:
        tok = batch["text"]
        n = tok["input_ids"].shape[0]
        if self._view_cache is not None and "index" in batch:
            # [n, l+1, d], computed once (prepare) and kept in host memory; the batch's positions stay on the host
            # (raysent.train.loop.HOST_FIELDS), so the lookup never waits on the device, and the rows go to it
            # from pinned memory without blocking
            h = lookup_rows(self._view_cache, batch["index"], tok["input_ids"].device)
        else:
            h = self.views(tok)  # [n, l+1, d]
        c = self.encoder(**tok)[-1][:, 0]  # BERT_T's last-layer [CLS]
        fc, fh = self.head(c), self.head(h)
        g, p = self.gatherer, self.params
        if p.loss == "opt3":
            con = loss_opt3(fc, fh, p.temperature, gather=g, offset=g.offset(n))
        else:
            pick = torch.randint(0, fh.shape[1], (n,), device=fh.device)  # σ: uniform, per sentence
            fh1 = fh[torch.arange(n, device=fh.device), pick]
            con = LOSSES[p.loss](fc, fh1, p.temperature, gather=g, offset=g.offset(n))
        reg = l2_regularizer(self.encoder.model, self.frozen)
        return LossOutput(con + p.reg_lambda * reg, {"loss_con": con.detach(), "loss_reg": reg.detach()})


class SelfGuidedOpt(SelfGuidedOptSpec, SelfGuided):
    params: SGOptParams
