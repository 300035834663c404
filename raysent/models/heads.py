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
    labels; the same head is ConSERT's Eq. 2 and the CE part of SupCon (Liao 2021, Eq. 1)."""

    def __init__(self, hidden: int, num_labels: int = 3):
        super().__init__()
        self.linear = nn.Linear(3 * hidden, num_labels)

    @staticmethod
    def features(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.cat([u, v, (u - v).abs()], dim=-1)

    def forward(self, u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.linear(self.features(u, v))
