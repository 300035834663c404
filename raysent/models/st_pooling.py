"""raysent's sentence-transformers module: the poolings that sentence-transformers' own modules do not compute.

``mean_no_cls`` (Liao 2021, §3: the output tokens except [CLS]) and ``layeratt`` (the trained layer-wise
attention pooler of Oh et al. 2022, Eq. 1-5) are computed here by :func:`raysent.models.pooling.pool`, the
function ``raysent eval`` uses, from every hidden state the Transformer module returns. A model folder that
holds this module loads with raysent installed and ``SentenceTransformer(path, trust_remote_code=True)``
(sentence-transformers >= 6 asks that flag of any module outside its own package).

This file imports sentence-transformers: only sentence-transformers itself (and raysent's tests) import it.
"""

from __future__ import annotations

from typing import Any

from sentence_transformers.base.modules import Module

from raysent.models.heads import LayerAttentionPooler
from raysent.models.pooling import pool

# Lazy imports: safetensors (heavy, and only the functions that need them import them).


class RaysentPooling(Module):
    """Sentence vectors from ``all_layer_embeddings`` and ``attention_mask`` with a raysent pooling."""

    config_keys: list[str] = ["pooling", "embedding_dimension"]

    def __init__(self, pooling: str, embedding_dimension: int):
        super().__init__()
        if pooling not in ("mean_no_cls", "layeratt"):
            raise ValueError(f"RaysentPooling computes mean_no_cls and layeratt, not {pooling!r}")
        self.pooling = pooling
        self.embedding_dimension = embedding_dimension
        self.head = LayerAttentionPooler(embedding_dimension) if pooling == "layeratt" else None

    def forward(self, features: dict[str, Any], **kwargs) -> dict[str, Any]:
        states = features.get("all_layer_embeddings")
        if states is None:
            raise ValueError("RaysentPooling needs every hidden state: the Transformer module must be loaded with "
                             "config_kwargs {'output_hidden_states': True} (sentence_bert_config.json)")
        features["sentence_embedding"] = pool(self.pooling, states, features["attention_mask"], mlp=self.head)
        return features

    def get_embedding_dimension(self) -> int:
        return self.embedding_dimension

    def save(self, output_path: str, *args, safe_serialization: bool = True, **kwargs) -> None:
        self.save_config(output_path)
        if self.head is not None:
            from safetensors.torch import save_file

            save_file({k: v.detach().contiguous().cpu() for k, v in self.head.state_dict().items()},
                      f"{output_path}/model.safetensors")

    @classmethod
    def load(cls, model_name_or_path: str, subfolder: str = "", token: bool | str | None = None,
             cache_folder: str | None = None, revision: str | None = None, local_files_only: bool = False,
             init_defaults: dict[str, Any] | None = None, **kwargs) -> RaysentPooling:
        module = cls(**cls.load_config(model_name_or_path, subfolder=subfolder, token=token, cache_folder=cache_folder,
                                       revision=revision, local_files_only=local_files_only))
        if module.head is not None:
            from safetensors.torch import load_file

            weights = cls.load_file_path(model_name_or_path, "model.safetensors", subfolder=subfolder, token=token,
                                         cache_folder=cache_folder, revision=revision,
                                         local_files_only=local_files_only)
            if weights is None:
                raise FileNotFoundError(f"{model_name_or_path}/{subfolder}: the layeratt pooler's model.safetensors "
                                        "is missing")
            module.head.load_state_dict(load_file(weights))
        return module

    def __repr__(self) -> str:
        return f"RaysentPooling(pooling={self.pooling!r}, embedding_dimension={self.embedding_dimension})"

