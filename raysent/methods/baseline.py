"""No tuning: a pre-trained encoder read off with a fixed pooling.

The rows "BERT-base + No tuning CLS / Mean" of SG-BERT's Table 1 (Kim et al. 2021) and of
ConSERT's Table 2 (Yan et al. 2021): every method's starting point. Training a baseline runs no
optimizer step: it evaluates the encoder as it is with ``params.pooling`` (any pooling of
raysent.models.pooling: cls_before_pooler, mean, max, first_last_avg, last2_avg, layer<K>_<...>)
and exports it, so tables carry its row like any other run.
"""

from __future__ import annotations

from raysent.methods.base import LossOutput, Method
from raysent.methods.spec import BaselineSpec


class Baseline(BaselineSpec, Method):
    def forward(self, batch: dict) -> LossOutput:  # pragma: no cover - never trained
        raise RuntimeError("the baseline method does not train")
