"""`raysent export` writes all or nothing and never removes a file it did not write: the files are written beside
OUTPUT and moved in at the end, so an export that fails (a pooling the model cannot read, an error while writing or
moving) leaves OUTPUT as it was; a folder that holds files is refused without --overwrite, and with it only the
earlier export's files (its manifest) are replaced or removed; a model is never exported onto its own folder.
(tests/models/test_st_export.py checks what a successful export encodes.)"""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import pytest

import raysent.cli.export as export
from raysent.cli import main

from conftest import RAW_BERT


def leftovers(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def tree(folder: Path) -> dict[str, bytes | None]:
    """Every file under ``folder`` (hidden ones too) with its bytes, and every folder (None)."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() if p.is_file() else None
            for p in sorted(folder.rglob("*"))}


@pytest.fixture(scope="module")
def mean_export(tmp_path_factory) -> Path:
    """raw-bert-mini-mlm exported once with mean pooling; a test copies it (:func:`copied`) before it changes it."""
    out = tmp_path_factory.mktemp("export") / "mean"
    assert main(["export", RAW_BERT, str(out), "--pooling", "mean"]) == 0
    return out


def copied(mean_export: Path, tmp_path: Path, with_user_files: bool = True) -> Path:
    out = tmp_path / "out"
    shutil.copytree(mean_export, out)
    if with_user_files:
        (out / "my-results.csv").write_text("task,spearman\nstsb,81.2\n")
        (out / "notes").mkdir()
        (out / "notes" / "todo.md").write_text("try last2_avg")
        (out / "1_Pooling" / "mine.txt").write_text("in a folder the export wrote")
    return out


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


@pytest.mark.shared
def test_an_export_writes_a_manifest_of_exactly_its_files(mean_export):
    manifest = json.loads((mean_export / export.MANIFEST).read_text())
    files = sorted(k for k, v in tree(mean_export).items() if v is not None and k != export.MANIFEST)
    assert manifest["written_by"] == "raysent export" and manifest["files"] == files
    assert {"model.safetensors", "raysent.json", "modules.json", "1_Pooling/config.json", "README.md"} <= set(files)


@pytest.mark.shared
def test_a_second_export_is_refused_without_overwrite_and_keeps_the_users_files_with_it(mean_export, tmp_path,
                                                                                         capsys):
    """Issue 60: a second export onto an export folder deleted the my-results.csv and notes/ added to it."""
    out = copied(mean_export, tmp_path)
    before = tree(out)
    capsys.readouterr()
    assert main(["export", RAW_BERT, str(out), "--pooling", "last2_avg"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{out} holds an earlier export and files that it did not write" in err, err
    assert "1_Pooling/mine.txt, my-results.csv, notes/todo.md" in err and "--overwrite" in err, err
    assert tree(out) == before and leftovers(tmp_path) == ["out"]

    assert main(["export", RAW_BERT, str(out), "--pooling", "last2_avg", "--overwrite"]) == 0
    after = tree(out)
    assert json.loads((out / "raysent.json").read_text())["pooling"] == "last2_avg"
    assert "last2_avg" in (out / "README.md").read_text()
    assert [m["type"].rsplit(".", 1)[-1] for m in json.loads((out / "modules.json").read_text())] == [
        "Transformer", "WeightedLayerPooling", "Pooling"]
    # the user's files as they were; of the earlier export's, 1_Pooling/config.json is gone (its folder stays: it
    # holds a file of the user's), and the manifest lists the new export's files
    for name in ("my-results.csv", "notes/todo.md", "1_Pooling/mine.txt"):
        assert after[name] == before[name], name
    assert "1_Pooling/config.json" not in after and "2_Pooling/config.json" in after
    assert json.loads(after[export.MANIFEST])["files"] == sorted(
        k for k, v in after.items() if v is not None and k not in (export.MANIFEST, "my-results.csv", "notes/todo.md",
                                                                   "1_Pooling/mine.txt"))
    assert leftovers(tmp_path) == ["out"]  # nothing left beside it

    # and back: 1_WeightedLayerPooling/ held only the export's files, so it goes with them
    assert main(["export", RAW_BERT, str(out), "--pooling", "mean", "--overwrite"]) == 0
    assert not (out / "1_WeightedLayerPooling").exists() and not (out / "2_Pooling").exists()
    assert (out / "1_Pooling" / "config.json").is_file() and (out / "1_Pooling" / "mine.txt").is_file()
    assert json.loads((out / "raysent.json").read_text())["pooling"] == "mean"


@pytest.mark.shared
def test_overwrite_never_writes_over_a_file_no_export_wrote(mean_export, tmp_path, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "README.md").write_text("my own notes")
    (mine / "data.csv").write_text("a,b")
    before = tree(mine)
    capsys.readouterr()
    assert main(["export", RAW_BERT, str(mine), "--pooling", "mean"]) == 2
    err = capsys.readouterr().err
    assert f"{mine} holds files that no earlier export wrote (README.md, data.csv)" in err, err
    assert main(["export", RAW_BERT, str(mine), "--pooling", "mean", "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert f"{mine}: the export would write over files that no earlier export there wrote (README.md)" in err, err
    assert tree(mine) == before and leftovers(tmp_path) == ["mine"]


@pytest.mark.shared
def test_overwrite_of_an_export_without_a_manifest_replaces_only_what_it_writes(mean_export, tmp_path, capsys):
    """A model folder written before exports kept a manifest: the files the new export writes are replaced (they
    are the earlier model's), every other file stays, the earlier layout's module folder included."""
    out = copied(mean_export, tmp_path)
    (out / export.MANIFEST).unlink()
    before = tree(out)
    capsys.readouterr()
    assert main(["export", RAW_BERT, str(out), "--pooling", "last2_avg"]) == 2
    err = capsys.readouterr().err
    assert f"{out} holds a model raysent saved, with no {export.MANIFEST}" in err and "--overwrite" in err, err
    assert tree(out) == before
    assert main(["export", RAW_BERT, str(out), "--pooling", "last2_avg", "--overwrite"]) == 0
    after = tree(out)
    assert json.loads((out / "raysent.json").read_text())["pooling"] == "last2_avg"
    for name in ("my-results.csv", "notes/todo.md", "1_Pooling/mine.txt", "1_Pooling/config.json"):
        assert after[name] == before[name], name
    assert "1_Pooling/config.json" not in json.loads(after[export.MANIFEST])["files"]


@pytest.mark.shared
def test_a_model_is_never_exported_onto_its_own_folder(mean_export, tmp_path, capsys, monkeypatch):
    import raysent.models.sentence_encoder as sentence_encoder

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded: the refusal comes before torch loads")

    monkeypatch.setattr(sentence_encoder, "load", no_load)
    model = copied(mean_export, tmp_path)
    before = tree(model)
    for output, said in [(model, f"the model's folder and OUTPUT are the same folder ({model.resolve()})"),
                         (tmp_path / "out" / "notes" / ".." / ".", "the same folder"),
                         (model / "exported", f"OUTPUT ({(model / 'exported').resolve()}) is inside the model's "
                                              f"folder ({model.resolve()})"),
                         (model / "notes", "is inside the model's folder"),
                         (tmp_path, f"the model's folder ({model.resolve()}) is inside OUTPUT ({tmp_path.resolve()})")]:
        capsys.readouterr()
        assert main(["export", str(model), str(output), "--pooling", "last2_avg", "--overwrite"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"export {model} to {output}: " in err and said in err, (output, err)
        assert "give an OUTPUT outside the model's folder" in err
    assert tree(model) == before and leftovers(tmp_path) == ["out"]


@pytest.mark.shared
def test_an_error_while_writing_leaves_the_earlier_export_and_the_users_files_as_they_were(mean_export, tmp_path,
                                                                                           capsys, monkeypatch):
    out = copied(mean_export, tmp_path)
    before = tree(out)

    import raysent.methods.card as card

    def full_disk(folder, results=None):
        raise OSError(28, "No space left on device", str(folder))

    monkeypatch.setattr(card, "write_card", full_disk)
    assert main(["export", RAW_BERT, str(out), "--pooling", "last2_avg", "--overwrite"]) == 2
    assert "No space left on device" in capsys.readouterr().err
    assert leftovers(tmp_path) == ["out"]  # no partial folder beside it
    assert tree(out) == before


@pytest.mark.shared
def test_an_error_while_moving_the_files_in_puts_everything_back(mean_export, tmp_path, capsys, monkeypatch):
    """The last step moves file by file: the earlier export's aside, then the new ones in. A failure halfway (the
    5th move into OUTPUT) moves every file back where it was."""
    out = copied(mean_export, tmp_path)
    before = tree(out)
    into = []
    replace = os.replace

    def failing(src, dst):
        if Path(dst).resolve().is_relative_to(out.resolve()) and Path(src).name != "out":
            into.append(dst)
            if len(into) == 5:
                raise OSError(errno.ENOSPC, "No space left on device", str(dst))
        replace(src, dst)

    monkeypatch.setattr(export.os, "replace", failing)
    assert main(["export", RAW_BERT, str(out), "--pooling", "last2_avg", "--overwrite"]) == 2
    assert "No space left on device" in capsys.readouterr().err
    assert len(into) > 5 and tree(out) == before and leftovers(tmp_path) == ["out"]  # > 5: the moves back


def test_help_lists_the_poolings(capsys):
    with pytest.raises(SystemExit):
        main(["export", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for name in ("cls,", "cls_before_pooler", "mean,", "mean_no_cls", "max,", "first_last_avg", "last2_avg",
                 "layer<K>_<cls|mean|max>", "layeratt"):
        assert name in text, name
    assert "--overwrite" in text and "only the files an earlier export wrote there" in text
