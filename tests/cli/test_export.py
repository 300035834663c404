"""`raysent export` writes all or nothing: the folder is written beside OUTPUT and renamed to it at the end, so an
export that fails (a pooling the model cannot read, an error while writing) leaves nothing that
``SentenceTransformer(OUTPUT)`` would load half-built; an earlier export is replaced whole; a folder of other
files is never replaced. (tests/models/test_st_export.py checks what a successful export encodes.)"""

from __future__ import annotations

import json

import pytest

from raysent.cli import main

from conftest import RAW_BERT


def leftovers(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


@pytest.mark.shared
@pytest.mark.parametrize("pooling,said", [
    ("cls", "has no trained pooler weights; use 'cls_before_pooler'"),
    ("layeratt", "needs the trained layer-wise attention pooler that the layeratt method saves"),
])
def test_a_pooling_the_model_cannot_read_leaves_nothing(tmp_path, capsys, pooling, said):
    """raw-bert-mini-mlm is MLM-only: no trained [CLS] pooler, no layer-wise attention pooler. Before, --pooling
    cls left a 44 MB folder that SentenceTransformer() loaded silently with mean pooling, and layeratt an empty
    one."""
    assert main(["export", RAW_BERT, str(tmp_path / "out"), "--pooling", pooling]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("raysent: error: ") and said in err, err
    assert leftovers(tmp_path) == []


@pytest.mark.shared
def test_max_length_beyond_the_positions_is_refused_with_the_limit(tmp_path, capsys):
    assert main(["export", RAW_BERT, str(tmp_path / "out"), "--pooling", "mean", "--max-length", "100000"]) == 2
    err = capsys.readouterr().err
    assert "max_length 100000" in err and "at most 512 tokens" in err and "allowed: 2..512" in err, err
    assert leftovers(tmp_path) == []


def test_an_error_while_writing_leaves_the_earlier_export_as_it_was(tiny_bert, tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    assert main(["export", tiny_bert, str(out), "--pooling", "mean"]) == 0
    before = {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file()}

    import raysent.methods.card as card

    def full_disk(folder, results=None):
        raise OSError(28, "No space left on device", str(folder))

    monkeypatch.setattr(card, "write_card", full_disk)
    assert main(["export", tiny_bert, str(out), "--pooling", "last2_avg"]) == 2
    assert "No space left on device" in capsys.readouterr().err
    assert leftovers(tmp_path) == ["out"]  # no partial folder beside it
    assert {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_an_earlier_export_is_replaced_whole_and_other_folders_are_refused(tiny_bert, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["export", tiny_bert, str(out), "--pooling", "last2_avg"]) == 0
    assert (out / "1_WeightedLayerPooling").is_dir()
    assert main(["export", tiny_bert, str(out), "--pooling", "mean"]) == 0
    assert not (out / "1_WeightedLayerPooling").exists() and (out / "1_Pooling").is_dir()
    assert json.loads((out / "raysent.json").read_text())["pooling"] == "mean"
    assert leftovers(tmp_path) == ["out"]
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    capsys.readouterr()
    assert main(["export", tiny_bert, str(mine), "--pooling", "mean"]) == 2
    assert "is not a model raysent saved" in capsys.readouterr().err
    assert leftovers(mine) == ["notes.txt"]


def test_help_lists_the_poolings(capsys):
    with pytest.raises(SystemExit):
        main(["export", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for name in ("cls,", "cls_before_pooler", "mean,", "mean_no_cls", "max,", "first_last_avg", "last2_avg",
                 "layer<K>_<cls|mean|max>", "layeratt"):
        assert name in text, name
