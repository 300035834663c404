"""A model with its inference pooling: ``raysent.load(path).encode(sentences) -> np.ndarray``.

What ``raysent eval`` embeds with: the pooling the model's ``raysent.json`` names (a model raysent trained),
else the one its sentence-transformers config names, else the one given; the tokens per sentence it was
exported with (``eval.max_length``), else 256. Torch only; imports no Ray and no MLflow.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from raysent.errors import RaysentError
from raysent.models.embedder import Embedder
from raysent.models.encoder import Encoder
from raysent.models.pooling import check_pooling, describe_allowed

DEFAULT_MAX_LENGTH = 256  # raysent.config.EvalConfig.max_length


def sentence_transformers_pooling(folder: str | Path) -> str | None:
    """The raysent pooling a plain sentence-transformers folder's ``1_Pooling/config.json`` names (cls, mean or
    max: v6's ``pooling_mode`` or the older ``pooling_mode_*_tokens`` flags), else None."""
    st = Path(folder) / "1_Pooling" / "config.json"
    if not st.is_file():
        return None
    cfg = json.loads(st.read_text())
    names = {"mean": "mean", "cls": "cls_before_pooler", "max": "max"}
    if isinstance(cfg.get("pooling_mode"), str):
        return names.get(cfg["pooling_mode"])
    for key, name in (("pooling_mode_mean_tokens", "mean"), ("pooling_mode_cls_token", "cls_before_pooler"),
                      ("pooling_mode_max_tokens", "max")):
        if cfg.get(key):
            return name
    return None


class SentenceEncoder:
    """An :class:`~raysent.models.encoder.Encoder` and the pooling it is read with; ``encode`` embeds sentences
    as ``raysent eval`` does (each distinct sentence once, length-sorted batches, no gradients)."""

    def __init__(self, encoder: Encoder, pooling: str, max_length: int = DEFAULT_MAX_LENGTH, batch_size: int = 128):
        check_pooling(pooling, "pooling", error=RaysentError)
        self.encoder = encoder.eval()
        self.pooling = pooling
        self.max_length = max_length
        self.batch_size = batch_size
        self.embedder = Embedder(self._embed, encoder.tokenizer, module=encoder, max_length=max_length,
                                 batch_size=batch_size)

    def _embed(self, tok: dict):
        return self.encoder.embed(tok, self.pooling)

    @property
    def path(self) -> str:
        return self.encoder.source

    @property
    def dimension(self) -> int:
        return self.encoder.hidden_size

    def encode(self, sentences: str | Sequence[str]) -> np.ndarray:
        """float32 vectors [N, d] in input order (one sentence: [d])."""
        if isinstance(sentences, str):
            return self.embedder([sentences])[0]
        return self.embedder(list(sentences))

    __call__ = encode

    def __repr__(self) -> str:
        return f"SentenceEncoder({self.path!r}, pooling={self.pooling!r}, max_length={self.max_length})"


def load(model: str | Path, pooling: str | None = None, max_length: int | None = None,
         batch_size: int = 128) -> SentenceEncoder:
    """A saved model (a folder raysent saved, a sentence-transformers folder, a name under RAYSENT_MODEL_DIR or
    a hub id) ready to ``encode``. ``pooling`` overrides the one the model names; a model that names none
    needs it."""
    encoder = Encoder.load(str(model))
    pooling = pooling or encoder.meta.pooling or sentence_transformers_pooling(encoder.source)
    if pooling is None:
        raise RaysentError(f"a pooling is needed: {model} does not say how its sentence vectors are read (no "
                           f"raysent.json, no sentence-transformers pooling config); allowed: {describe_allowed()}")
    if max_length is None:
        st = (encoder.meta.extra or {}).get("sentence_transformers") or {}
        max_length = int(st.get("max_length", DEFAULT_MAX_LENGTH))
    return SentenceEncoder(encoder, pooling, max_length=max_length, batch_size=batch_size)
