"""Trainable heads that sit on top of the encoder during training."""

from __future__ import annotations

import torch
from torch import nn


def init_bert_style(module: nn.Module, std: float = 0.02) -> None:
    """BERT's initialisation (normal(0, 0.02) weights, zero biases), as SimCSE's ``init_weights``."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, mean=0.0, std=std)
            if m.bias is not None:
                nn.init.zeros_(m.bias)


class MLPHead(nn.Module):
    """dense + tanh on [CLS]: SimCSE's ``MLPLayer`` (Gao et al. 2021), the shape of BERT's pooler.

    Named like ``BertPooler`` (``dense``) so its weights can be saved as the model's pooler.
    """

    def __init__(self, hidden: int, in_features: int | None = None):
        super().__init__()
        self.dense = nn.Linear(in_features or hidden, hidden)
        self.activation = nn.Tanh()
        init_bert_style(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.activation(self.dense(x))


class ProjectionHead(nn.Module):
    """SG-BERT's projection head f (Kim et al. 2021, §3.1, footnote 4): two linear layers of width
    4096 (``width``), each followed by GELU."""

    def __init__(self, hidden: int, width: int = 4096):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(hidden, width), nn.GELU(), nn.Linear(width, width), nn.GELU())
        init_bert_style(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class PairClassifier(nn.Module):
    """SBERT's softmax classifier (Reimers & Gurevych 2019, Eq. 1): W·(u, v, |u−v|) + b over 3 NLI
    labels; the same head is ConSERT's Eq. 2 and the CE part of SupCon (Liao 2021, Eq. 1).
    ``max_square`` appends max(u, v)² (element-wise), as ConSERT's official joint script does
    (``--concatenation_sent_max_square``; not in the paper)."""

    def __init__(self, hidden: int, num_labels: int = 3, max_square: bool = False):
        super().__init__()
        self.max_square = max_square
        self.linear = nn.Linear((4 if max_square else 3) * hidden, num_labels)

    def features(self, u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        extra = [torch.maximum(u, v).pow(2)] if self.max_square else []
        return torch.cat([u, v, (u - v).abs(), *extra], dim=-1)

    def forward(self, u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.linear(self.features(u, v))


class LayerAttentionPooler(nn.Module):
    """Layer-wise attention pooling (Oh et al. 2022. Don't Judge a Language Model by Its Last Layer,
    arXiv:2209.05972, §2.1, Eq. 1-5).

    For each layer i of the N hidden states (the embedding layer included, as the official code
    nlpods/LayerAttPooler does), h^c_i is its [CLS] vector and h^a_i the mean of its tokens:

        α_ij  = softmax_j( (W_q h^c_i) · (W_k h^a_j) )          (Eq. 1: the paper writes the
                                                                 normalisation as a ratio; this is
                                                                 Luong's multiplicative attention
                                                                 it cites, and the code's softmax)
        h^l_i = Σ_j α_ij W_v h^a_j                               (Eq. 2)
        h^L   = (1/N) Σ_i h^l_i                                  (Eq. 3)
        h^CL  = [h^c_last ; h^L]                                 (Eq. 4)
        h     = MLP(h^CL) = tanh(W h^CL + b), back to hidden d    (Eq. 5, SimCSE's MLP, Appendix B)

    W_q, W_k, W_v are d×d without bias. (The official code also divides the scores by N and applies
    RReLU after each projection; neither is in the paper, so neither is here.)
    """

    def __init__(self, hidden: int):
        super().__init__()
        self.w_q = nn.Linear(hidden, hidden, bias=False)
        self.w_k = nn.Linear(hidden, hidden, bias=False)
        self.w_v = nn.Linear(hidden, hidden, bias=False)
        self.mlp = MLPHead(hidden, in_features=2 * hidden)
        init_bert_style(self)

    def attention(self, hidden_states, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(α [B, N, N], h^L [B, d]) for all hidden states (Eq. 1-3)."""
        stack = torch.stack(tuple(hidden_states), dim=1)  # [B, N, T, d]
        cls = stack[:, :, 0]  # h^c_i: [B, N, d]
        mask = attention_mask[:, None, :, None].to(stack.dtype)
        avg = (stack * mask).sum(2) / mask.sum(2).clamp(min=1e-9)  # h^a_j: [B, N, d]
        scores = torch.einsum("bid,bjd->bij", self.w_q(cls), self.w_k(avg))
        alpha = scores.softmax(dim=-1)
        h_l = torch.einsum("bij,bjd->bid", alpha, self.w_v(avg))  # Eq. 2
        return alpha, h_l.mean(dim=1)  # Eq. 3

    def forward(self, hidden_states, attention_mask: torch.Tensor) -> torch.Tensor:
        _, h_big_l = self.attention(hidden_states, attention_mask)
        h_cl = torch.cat([hidden_states[-1][:, 0], h_big_l], dim=-1)  # Eq. 4
        return self.mlp(h_cl)  # Eq. 5
