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

from raysent.errors import ModelError, RaysentError, advice
from raysent.models.embedder import Embedder
from raysent.models.encoder import Encoder
from raysent.models.locate import no_layeratt_pooler, no_trained_pooler
from raysent.models.pooling import check_pooling, describe_allowed, uses_mlp

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


def check_reads(encoder: Encoder, pooling: str, max_length: int) -> None:
    """That ``encoder`` has what ``pooling`` reads and room for ``max_length`` tokens, before anything is embedded
    or written: ``cls`` its trained dense+tanh pooler, ``layeratt`` the trained pooler the layeratt method saves;
    a sentence longer than its position embeddings cannot be read."""
    if uses_mlp(pooling, training=False):
        if pooling == "layeratt" and encoder.head is None:
            raise no_layeratt_pooler(encoder.source)
        if pooling != "layeratt" and encoder.pooler_mlp() is None:
            raise no_trained_pooler(pooling, encoder.source)
    if max_length < 2 or max_length > encoder.max_positions:
        raise ModelError(f"max_length {max_length}: {encoder.source} reads at most {encoder.max_positions} tokens per "
                         f"sentence (its position embeddings); allowed: 2..{encoder.max_positions}")


class SentenceEncoder:
    """An :class:`~raysent.models.encoder.Encoder` and the pooling it is read with; ``encode`` embeds sentences
    as ``raysent eval`` does (each distinct sentence once, length-sorted batches, no gradients)."""

    def __init__(self, encoder: Encoder, pooling: str, max_length: int = DEFAULT_MAX_LENGTH, batch_size: int = 128):
        check_pooling(pooling, "pooling", error=RaysentError)
        check_reads(encoder, pooling, max_length)
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
    check_pooling(pooling, "pooling", error=RaysentError)  # before the model loads (seconds)
    encoder = Encoder.load(str(model))
    pooling = pooling or encoder.meta.pooling or sentence_transformers_pooling(encoder.source)
    if pooling is None:
        give = advice("--pooling POOLING", 'pooling="mean"')
        raise RaysentError(f"a pooling is needed ({give}): {model} does not say how its sentence vectors are read "
                           f"(no raysent.json, no sentence-transformers pooling config); allowed: {describe_allowed()}")
    if max_length is None:  # what it was saved with, else the default as far as the model's positions go
        st = (encoder.meta.extra or {}).get("sentence_transformers") or {}
        max_length = int(st.get("max_length", min(DEFAULT_MAX_LENGTH, encoder.max_positions)))
    return SentenceEncoder(encoder, pooling, max_length=max_length, batch_size=batch_size)
