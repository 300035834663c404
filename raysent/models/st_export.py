"""Every model folder raysent saves is also a sentence-transformers model.

Beside the ``save_pretrained`` files and ``raysent.json``, :func:`write_sentence_transformers` writes the
sentence-transformers (v6) layout: ``modules.json``, the Transformer's ``sentence_bert_config.json``,
``config_sentence_transformers.json`` and one folder per module after the Transformer. Then
``SentenceTransformer(folder)`` loads the model with nothing missing and ``.encode()`` returns what
``raysent eval`` embeds (the same pooling; tests/models/test_st_export.py checks every pooling to 1e-5 cosine).

======================================  ==================================================================
raysent pooling                          sentence-transformers modules
======================================  ==================================================================
``cls_before_pooler``, ``mean``, ``max``  Transformer → Pooling(cls | mean | max)
``cls`` (the trained [CLS] MLP)          Transformer → Pooling(cls) → Dense(d, d, tanh) with the MLP's weights
``first_last_avg``, ``last2_avg``,        Transformer (every hidden state) → WeightedLayerPooling (weight 1 on
``layer<K>_<cls|mean|max>``               the layers read, 0 elsewhere) → Pooling(mean | cls | max)
``mean_no_cls``, ``layeratt``             Transformer (every hidden state) → raysent's own module
                                          (:class:`raysent.models.st_pooling.RaysentPooling`; loading needs
                                          raysent installed and ``trust_remote_code=True``)
======================================  ==================================================================

The files are written here, not by ``SentenceTransformer.save``: a best checkpoint is exported at every new
best dev score, inside training processes that need not import sentence-transformers (2.8 s) nor reload and
rewrite the weights just saved. An untrained pooler, left out of the weights (``Encoder.save``), is left out
of the loaded model too (``model_kwargs: add_pooling_layer: false``), so nothing loads as missing.
Torch only; imports no Ray and no MLflow.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from raysent.errors import ModelError
from raysent.models.locate import no_trained_pooler

# Lazy imports: safetensors, transformers (heavy, and only the functions that need them import them).

MODULES_FILE = "modules.json"
TRANSFORMER_TYPE = "sentence_transformers.base.modules.transformer.Transformer"
POOLING_TYPE = "sentence_transformers.sentence_transformer.modules.pooling.Pooling"
DENSE_TYPE = "sentence_transformers.base.modules.dense.Dense"
LAYERS_TYPE = "sentence_transformers.sentence_transformer.modules.weighted_layer_pooling.WeightedLayerPooling"
RAYSENT_TYPE = "raysent.models.st_pooling.RaysentPooling"
CUSTOM_POOLINGS = ("mean_no_cls", "layeratt")  # no sentence-transformers module computes these
ST_FILES = (MODULES_FILE, "sentence_bert_config.json", "config_sentence_transformers.json")
_LAYER_RE = re.compile(r"^layer(\d+)_(cls|mean|max)$")


@dataclass
class Layout:
    """What :func:`write_sentence_transformers` wrote: the module types in order, and whether loading needs
    raysent's own module (then ``SentenceTransformer(path, trust_remote_code=True)`` with raysent installed)."""

    modules: list[str]
    needs_raysent: bool


def layer_weights(pooling: str, num_layers: int) -> tuple[int, list[float]] | None:
    """(first layer, weight per layer from it to the last) for a pooling that averages chosen hidden states
    (index 0 the embeddings, ``num_layers`` the last layer), else None."""
    weights = [0.0] * (num_layers + 1)
    if pooling == "first_last_avg":  # (layer 1 + layer L) / 2 (SimCSE's avg_first_last)
        weights[1] += 1.0
        weights[num_layers] += 1.0
    elif pooling == "last2_avg":  # (layer L-1 + layer L) / 2 (ConSERT's evaluation pooling)
        weights[num_layers - 1] += 1.0
        weights[num_layers] += 1.0
    elif (m := _LAYER_RE.match(pooling)) is not None:
        k = int(m.group(1))
        if k > num_layers:
            raise ModelError(f"pooling {pooling!r}: the model has layers 0..{num_layers}")
        weights[k] = 1.0
    else:
        return None
    start = next(i for i, w in enumerate(weights) if w)
    return start, weights[start:]


def _pooling_mode(pooling: str) -> str:
    if pooling in ("cls", "cls_before_pooler"):
        return "cls"
    if pooling in ("mean", "max"):
        return pooling
    if pooling in ("first_last_avg", "last2_avg"):
        return "mean"
    m = _LAYER_RE.match(pooling)
    if m is None:
        raise ModelError(f"pooling {pooling!r} cannot be written as a sentence-transformers model; it can write "
                         f"cls, cls_before_pooler, mean, max, first_last_avg, last2_avg, layer<K>_<cls|mean|max>, "
                         f"{', '.join(CUSTOM_POOLINGS)}")
    return m.group(2)


def _write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=4) + "\n")


def _save_weights(folder: Path, tensors: dict[str, torch.Tensor]) -> None:
    from safetensors.torch import save_file

    save_file({k: v.detach().to("cpu", torch.float32).contiguous() for k, v in tensors.items()},
              str(folder / "model.safetensors"))


def write_sentence_transformers(path: str | Path, pooling: str, hidden: int, num_layers: int, max_length: int,
                                drop_pooler: bool, dense: nn.Linear | None = None,
                                head: nn.Module | None = None) -> Layout:
    """Write the sentence-transformers layout of a saved model folder ``path`` for the inference ``pooling``.

    ``dense``: the linear layer of the trained dense+tanh on [CLS] that ``cls`` reads; ``head``: the trained
    layer-wise attention pooler of ``layeratt``; ``drop_pooler``: the model's own pooler was left out of the
    weights; ``max_length``: the tokens per sentence ``raysent eval`` reads (``eval.max_length``). Raises
    :class:`ModelError` naming the pooling when it cannot be written (a ``cls`` without its MLP, say)."""
    path = Path(path)
    for stale in path.glob("[1-9]_*"):  # a folder exported before, with another pooling
        if stale.is_dir():
            for f in stale.iterdir():
                f.unlink()
            stale.rmdir()
    all_layers = pooling in CUSTOM_POOLINGS or layer_weights(pooling, num_layers) is not None
    transformer = {
        "transformer_task": "feature-extraction",
        "modality_config": {"text": {"method": "forward", "method_output_name": "last_hidden_state"}},
        "module_output_name": "token_embeddings",
        # `raysent eval` truncates at eval.max_length; the tokenizer's own limit may differ
        "processor_kwargs": {"model_max_length": int(max_length)},
        **({"model_kwargs": {"add_pooling_layer": False}} if drop_pooler else {}),
        **({"config_kwargs": {"output_hidden_states": True}} if all_layers else {}),
    }
    _write_json(path / "sentence_bert_config.json", transformer)
    modules: list[tuple[str, str, dict, dict[str, torch.Tensor]]] = []  # (folder, type, config, weights)
    if pooling in CUSTOM_POOLINGS:
        weights = {}
        if pooling == "layeratt":
            if head is None:
                raise ModelError("pooling 'layeratt' is written with its trained pooler; none was given")
            weights = dict(head.state_dict())
        modules.append(("1_RaysentPooling", RAYSENT_TYPE,
                        {"pooling": pooling, "embedding_dimension": hidden}, weights))
    else:
        mode = _pooling_mode(pooling)
        picked = layer_weights(pooling, num_layers)
        if picked is not None:
            start, w = picked
            modules.append((f"{len(modules) + 1}_WeightedLayerPooling", LAYERS_TYPE,
                            {"embedding_dimension": hidden, "layer_start": start, "num_hidden_layers": num_layers},
                            {"layer_weights": torch.tensor(w)}))
        modules.append((f"{len(modules) + 1}_Pooling", POOLING_TYPE,
                        {"embedding_dimension": hidden, "pooling_mode": mode, "include_prompt": True}, {}))
        if pooling == "cls":
            if dense is None:
                raise no_trained_pooler(pooling, "this model")
            modules.append((f"{len(modules) + 1}_Dense", DENSE_TYPE,
                            {"in_features": dense.in_features, "out_features": dense.out_features, "bias": True,
                             "activation_function": "torch.nn.modules.activation.Tanh",
                             "module_input_name": "sentence_embedding", "module_output_name": "sentence_embedding"},
                            {"linear.weight": dense.weight, "linear.bias": dense.bias}))
    index = [{"idx": 0, "name": "0", "path": "", "type": TRANSFORMER_TYPE}]
    for i, (folder, kind, config, weights) in enumerate(modules, start=1):
        (path / folder).mkdir(exist_ok=True)
        _write_json(path / folder / "config.json", config)
        if weights:
            _save_weights(path / folder, weights)
        index.append({"idx": i, "name": str(i), "path": folder, "type": kind})
    _write_json(path / MODULES_FILE, index)
    _write_json(path / "config_sentence_transformers.json", {
        "__version__": _versions(), "model_type": "SentenceTransformer", "prompts": {"query": "", "document": ""},
        "default_prompt_name": None, "similarity_fn_name": "cosine"})
    return Layout(modules=[str(m["type"]) for m in index], needs_raysent=pooling in CUSTOM_POOLINGS)


def _versions() -> dict[str, str]:
    import transformers

    out = {"pytorch": torch.__version__, "transformers": transformers.__version__}
    try:
        out["sentence_transformers"] = importlib.metadata.version("sentence-transformers")
    except importlib.metadata.PackageNotFoundError:
        out["sentence_transformers"] = "6.0.0"  # the layout's version (the package itself is not installed here)
    return out
