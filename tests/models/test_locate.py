"""raysent.models.locate reads what a model folder holds without torch: whether its checkpoint has a trained
pooler must be what loading it finds (``Encoder.has_trained_pooler``), so `raysent export` can refuse ``cls``
before loading and never refuse a model that has one."""

from __future__ import annotations

import json
import os
import shutil
import struct

import pytest

from raysent.models.encoder import Encoder
from raysent.models.locate import checkpoint_has_pooler, resolve_model

from conftest import PARAPHRASE, RAW_BERT, SHARED


@pytest.mark.shared
@pytest.mark.parametrize("name", [RAW_BERT, PARAPHRASE, "all-MiniLM-L6-v2", "tiny"])
def test_the_checkpoint_header_says_what_loading_finds(name, tiny_bert):
    name = tiny_bert if name == "tiny" else name  # saved from BertModel: its (random) pooler is in the checkpoint
    where, _ = resolve_model(name)
    assert checkpoint_has_pooler(where) is Encoder.load(name).has_trained_pooler


def test_a_prefixed_pooler_counts_and_a_sharded_index_is_read(tmp_path):
    def safetensors(keys: list[str]) -> bytes:
        header = json.dumps({"__metadata__": {"format": "pt"},
                             **{k: {"dtype": "F32", "shape": [1], "data_offsets": [4 * i, 4 * i + 4]}
                                for i, k in enumerate(keys)}}).encode()
        return struct.pack("<Q", len(header)) + header + bytes(4 * len(keys))

    pretraining = tmp_path / "bert-pretraining"  # BertForPreTraining: AutoModel strips `bert.` and loads the pooler
    pretraining.mkdir()
    (pretraining / "model.safetensors").write_bytes(safetensors(["bert.pooler.dense.weight", "cls.seq.weight"]))
    assert checkpoint_has_pooler(pretraining) is True
    mlm = tmp_path / "mlm"
    mlm.mkdir()
    (mlm / "model.safetensors").write_bytes(safetensors(["bert.encoder.layer.0.weight", "cls.predictions.bias"]))
    assert checkpoint_has_pooler(mlm) is False
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    (sharded / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"pooler.dense.weight": "model-00002.safetensors", "embeddings.x": "model-00001.safetensors"}}))
    assert checkpoint_has_pooler(sharded) is True
    assert checkpoint_has_pooler(tmp_path) is None  # no safetensors: only loading can tell


def _copy_model(tmp_path, name: str = RAW_BERT):
    """A writable copy of a real model folder from ../shared/models (its files are read-only there)."""
    folder = tmp_path / name
    shutil.copytree(SHARED / "models" / name, folder)
    for f in folder.iterdir():
        f.chmod(0o644)
    return folder


@pytest.mark.shared
def test_a_truncated_or_padded_safetensors_is_refused_naming_the_file_and_the_bytes(tmp_path):
    """A copy of raw-bert-mini-mlm cut short passed every check, and each trial then died in safetensors' loader
    with a traceback that never named the file (issue 60): the header's data offsets against the file's size."""
    from raysent.errors import ModelError
    from raysent.models.locate import check_weights, locate_model

    folder = _copy_model(tmp_path)
    weights = folder / "model.safetensors"
    whole = weights.stat().st_size
    assert locate_model(str(folder))[0] == str(folder)  # whole: found, no error
    os.truncate(weights, whole // 2)
    with pytest.raises(ModelError) as err:
        locate_model(str(folder))
    said = str(err.value)
    assert f"the weights file {weights} is truncated or damaged" in said
    assert f"its header describes {whole:,} bytes, the file has {whole // 2:,}" in said
    assert "copy it again" in said and "download it again" in said
    os.truncate(weights, 100)  # inside the header itself
    with pytest.raises(ModelError, match=r"model.safetensors is truncated or damaged: its header alone needs [\d,]+ "
                                         r"bytes \(8 of length, [\d,]+ of JSON\), the file has 100 \(truncated\)"):
        check_weights(folder)
    os.truncate(weights, 3)
    with pytest.raises(ModelError, match="3 byte"):
        check_weights(folder)
    weights.unlink()
    shutil.copyfile(SHARED / "models" / RAW_BERT / weights.name, weights)
    with weights.open("ab") as f:  # more bytes than the tensors: safetensors refuses it too
        f.write(bytes(16))
    with pytest.raises(ModelError, match=f"its header describes {whole:,} bytes, the file has {whole + 16:,} "
                                         r"\(16 bytes more than its tensors\)"):
        check_weights(folder)


def test_sharded_safetensors_name_the_missing_or_truncated_shard(tmp_path):
    from raysent.errors import ModelError
    from raysent.models.locate import check_weights

    def safetensors(keys: list[str]) -> bytes:
        header = json.dumps({k: {"dtype": "F32", "shape": [1], "data_offsets": [4 * i, 4 * i + 4]}
                             for i, k in enumerate(keys)}).encode()
        return struct.pack("<Q", len(header)) + header + bytes(4 * len(keys))

    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors",
                                        "b": "model-00002-of-00002.safetensors"}}))
    (tmp_path / "model-00001-of-00002.safetensors").write_bytes(safetensors(["a"]))
    with pytest.raises(ModelError, match=r"model.safetensors.index.json is truncated or damaged: it names 2 "
                                         r"shard\(s\), and model-00002-of-00002.safetensors is not in"):
        check_weights(tmp_path)
    second = tmp_path / "model-00002-of-00002.safetensors"
    second.write_bytes(safetensors(["b", "c"])[:-3])
    with pytest.raises(ModelError, match=f"{second} is truncated or damaged: .* \\(truncated: 3 bytes missing\\)"):
        check_weights(tmp_path)
    second.write_bytes(safetensors(["b", "c"]))
    check_weights(tmp_path)  # whole
    (tmp_path / "model.safetensors.index.json").write_text('{"weight_map": {"a": ')  # cut short
    with pytest.raises(ModelError, match="the index is not valid JSON"):
        check_weights(tmp_path)


def test_a_pytorch_zip_checkpoint_cut_short_is_refused(tmp_path):
    import zipfile

    from raysent.errors import ModelError
    from raysent.models.locate import check_weights

    with zipfile.ZipFile(tmp_path / "pytorch_model.bin", "w") as z:  # torch >= 1.6 saves a zip archive
        z.writestr("archive/data.pkl", b"x" * 5000)
    check_weights(tmp_path)
    os.truncate(tmp_path / "pytorch_model.bin", 2000)
    with pytest.raises(ModelError, match="pytorch_model.bin is truncated or damaged: 2,000 bytes of a zip archive"):
        check_weights(tmp_path)


@pytest.mark.shared
def test_a_folder_without_config_json_under_the_model_dir_is_named_not_not_found(tmp_path, monkeypatch):
    """Issue 60: `RAYSENT_MODEL_DIR/raw-bert-mini-mlm/` there but without its config.json was "not found", and the
    message never named the file that was missing."""
    from raysent.errors import ModelError

    root = tmp_path / "models"
    root.mkdir()
    folder = _copy_model(root)
    (folder / "config.json").unlink()
    monkeypatch.setenv("RAYSENT_MODEL_DIR", str(root))
    for name in (RAW_BERT, f"google/{RAW_BERT}"):  # the hub id's last part is looked for there too
        with pytest.raises(ModelError) as err:
            resolve_model(name)
        said = str(err.value)
        assert f"found the folder {folder} (under RAYSENT_MODEL_DIR), but it has no config.json" in said, said
        assert "not found" not in said and "model.safetensors" in said and "tokenizer" in said
    with pytest.raises(ModelError, match=f"found the folder {folder}, but it has no config.json"):
        resolve_model(str(folder))  # given as a path
