"""raysent.models.locate reads what a model folder holds without torch: whether its checkpoint has a trained
pooler must be what loading it finds (``Encoder.has_trained_pooler``), so `raysent export` can refuse ``cls``
before loading and never refuse a model that has one."""

from __future__ import annotations

import json
import struct

import pytest

from raysent.models.encoder import Encoder
from raysent.models.locate import checkpoint_has_pooler, resolve_model

from conftest import PARAPHRASE, RAW_BERT


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
