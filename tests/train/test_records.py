"""The run record's schema (raysent.train.records): what tune writes is what report reads, and an old,
foreign or damaged record is refused with an error that names the file and the field."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from raysent.cli import main
from raysent.errors import RaysentError
from raysent.report.runs import read_run
from raysent.train.records import (
    SCHEMA_VERSION,
    CurvePoint,
    RunRecord,
    TrainSummary,
    diverged,
    learned,
    migrate,
    read_record,
    read_summary,
    validate_record,
)

from conftest import REPO

# a record the mini suite wrote (results/ is part of the repository)
COMMITTED = sorted((REPO / "results" / "mini-supcon-searched" / "runs").glob("final-*.json"))


def _committed() -> dict:
    assert COMMITTED, "results/mini-supcon-searched/runs holds the suite's records"
    return json.loads(COMMITTED[0].read_text())


def test_every_committed_record_reads_as_the_current_schema():
    paths = sorted(REPO.glob("results/*/runs/*.json")) + sorted(REPO.glob("results/*/stopped/*.json"))
    assert len(paths) > 100
    for p in paths:
        rec = read_record(p)
        assert rec.schema_version == SCHEMA_VERSION and rec.phase in ("search", "final")


def test_a_record_round_trips_unchanged():
    data = json.loads(json.dumps(validate_record(_committed(), "x.json").to_json()))  # as this version writes it
    rec = validate_record(data, "x.json")
    assert json.loads(json.dumps(rec.model_dump(exclude_unset=True))) == data
    assert rec.scores["sts/avg"] == data["scores"]["sts/avg"] and rec.dev_curve[0].step == 0


def test_a_version_2_record_reads_as_version_3_with_the_same_scores():
    """Version 2's ``eval`` ({metrics, details}) is typed in version 3: each task's result by its name, whose
    metrics() are what version 2 stored as metrics; the record answers score() by task, aggregation and
    correlation, as the tables read it."""
    data = _committed()
    assert data["schema_version"] == 2
    rec = validate_record(data, "x.json")
    assert rec.schema_version == 3 and rec.eval is not None and rec.eval.tasks == ["sts"]
    assert rec.eval.metrics() == data["eval"]["metrics"] == rec.scores
    assert rec.eval.primary_metric == "sts/avg"
    sts12 = data["eval"]["details"]["sts"]["tasks"]["sts12"]
    assert rec.score("sts12") == sts12["spearman_all"] and rec.score("sts12", "wmean") == sts12["spearman_wmean"]
    assert rec.score("sts12", "mean", "pearson") == sts12["pearson_mean"]
    assert rec.score("avg") == pytest.approx(data["scores"]["sts/avg"], abs=1e-12)
    assert rec.score("dev") == data["best_dev_spearman"]
    assert read_run(COMMITTED[0]).score("sts12", "wmean") == rec.score("sts12", "wmean")
    assert migrate(data, "x.json")["schema_version"] == 3 and "details" not in migrate(data, "x.json")["eval"]


def test_diverged_reads_one_curve_type():
    curve = [CurvePoint(step=0, dev_spearman=60.0), CurvePoint(step=10, dev_spearman=45.0)]
    assert diverged({"dev_spearman": 60.0}, curve) is True
    assert diverged({"dev_spearman": 60.0}, curve[:1]) is False
    assert diverged(None, curve) is None
    assert diverged({"dev_spearman": 60.0}, [CurvePoint(step=5, dev_spearman=math.nan)]) is True
    assert TrainSummary.model_validate(_summary(dev_curve=[{"step": 0, "dev_spearman": 60.0, "dev/stsb:dev": 60.0}])
                                       ).dev_curve[0].scores() == {"dev_spearman": 60.0, "dev/stsb:dev": 60.0}


def test_nan_scores_stay_nan_when_written():
    rec = validate_record({**_committed(), "best_dev_spearman": math.nan}, "x.json")
    assert math.isnan(json.loads(json.dumps(rec.to_json()))["best_dev_spearman"])


def _write(tmp_path: Path, data) -> Path:
    p = tmp_path / "exp" / "runs" / "final-1-abc-seed1.json"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(data))
    return p


def _with_sources(data: dict, sources: dict) -> dict:
    """``data``'s evaluation (version 2's shape) with other STS sources."""
    sts = data["eval"]["details"]["sts"]
    return {**data["eval"], "details": {"sts": {**sts, "sources": sources}}}


def test_an_old_record_is_migrated_when_read(tmp_path):
    """Version 0 (no schema_version), 1 (absolute paths of the machine that wrote it) and 2 read as version 3:
    the run's folders where the experiment's folder is now, data files as $RAYSENT_DATA_DIR/<path>, the
    evaluation typed; written again, the paths are relative to the experiment's folder."""
    data = _committed()
    data_dir = Path(os.environ["RAYSENT_DATA_DIR"])
    v1 = {**data, "schema_version": 1,
          "best_model_dir": "/elsewhere/results/exp/final/s1/seed1/best",
          "config": {**data["config"], "train": {**data["config"]["train"],
                                                 "output_dir": "/elsewhere/results/exp/final/s1/seed1"}},
          "eval": _with_sources(data, {"stsb": f"{data_dir}/sts/STSB/test.tsv"})}
    for old in (v1, {k: v for k, v in v1.items() if k != "schema_version"}):
        p = _write(tmp_path, old)
        rec = read_record(p)
        assert rec.schema_version == SCHEMA_VERSION == 3
        assert rec.best_model_dir == str(tmp_path.resolve() / "exp" / "final" / "s1" / "seed1" / "best")
        assert rec.config["train"]["output_dir"] == str(tmp_path.resolve() / "exp" / "final" / "s1" / "seed1")
        assert rec.eval is not None and rec.eval.sts is not None
        assert rec.eval.sts.sources["stsb"] == "$RAYSENT_DATA_DIR/sts/STSB/test.tsv"
        rec.to_disk(p)
        on_disk = json.loads(p.read_text())
        assert on_disk["best_model_dir"] == "final/s1/seed1/best" and on_disk["schema_version"] == 3
        assert on_disk["eval"]["tasks"] == ["sts"] and "details" not in on_disk["eval"]
        assert read_record(p).best_model_dir == rec.best_model_dir  # and back
        assert read_run(p).hp == data["hp"]


def test_a_data_file_written_through_a_link_is_migrated_as_data(tmp_path, monkeypatch):
    """A version-1 record that named its data files through a symbolic link to the data folder (a clone whose
    ../shared is a link, say) reads them as $RAYSENT_DATA_DIR/<path> too, however RAYSENT_DATA_DIR names it."""
    data_dir, link = tmp_path / "data", tmp_path / "link"
    (data_dir / "sts").mkdir(parents=True)
    link.symlink_to(data_dir)
    old = {**_committed(), "schema_version": 1,
           "eval": _with_sources(_committed(), {"stsb": f"{link}/sts/test.tsv + {data_dir}/sts/dev.tsv",
                                                "other": "/elsewhere/sts/test.tsv"})}
    for named in (data_dir, link):
        monkeypatch.setenv("RAYSENT_DATA_DIR", str(named))
        evaluation = read_record(_write(tmp_path, old)).eval
        assert evaluation is not None and evaluation.sts is not None
        sources = evaluation.sts.sources
        assert sources == {"stsb": "$RAYSENT_DATA_DIR/sts/test.tsv + $RAYSENT_DATA_DIR/sts/dev.tsv",
                           "other": "/elsewhere/sts/test.tsv"}


def test_a_foreign_or_newer_record_is_refused(tmp_path):
    with pytest.raises(RaysentError, match="not a raysent run record"):
        read_record(_write(tmp_path, {"run": 1, "accuracy": 0.5}))
    with pytest.raises(RaysentError, match="schema_version 4; this raysent reads versions up to 3"):
        read_record(_write(tmp_path, {**_committed(), "schema_version": 4}))
    with pytest.raises(RaysentError, match="expected a JSON object, found list"):
        read_record(_write(tmp_path, [1, 2]))


def test_a_damaged_field_is_named(tmp_path):
    with pytest.raises(RaysentError, match=r"field 'seed': .*integer.*\(found 'one'\)"):
        read_record(_write(tmp_path, {**_committed(), "seed": "one"}))
    with pytest.raises(RaysentError, match=r"field 'phase': .*'final' or 'search'"):
        read_record(_write(tmp_path, {**_committed(), "phase": "test"}))
    with pytest.raises(RaysentError, match=r"field 'best_dev_spearman': Field required"):
        read_record(_write(tmp_path, {k: v for k, v in _committed().items() if k != "best_dev_spearman"}))
    with pytest.raises(RaysentError, match=r"field 'colour': Extra inputs are not permitted"):
        read_record(_write(tmp_path, {**_committed(), "colour": "blue"}))


def test_raysent_table_exits_2_on_a_bad_record(tmp_path, capsys):
    p = _write(tmp_path, {**_committed(), "colour": "blue"})
    assert main(["table", "exp", "--results-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert str(p) in err and "field 'colour'" in err and "Delete each broken file" in err


def test_no_committed_result_names_a_machine():
    """Every file under results/ in the repository holds paths relative to its results folder or the data
    folder, never the absolute paths of the machine that wrote it."""
    import re
    import subprocess

    pattern = re.compile(r'(?<![\w:.~$-])/(?:work|home|root|tmp|usr|mnt|Users|var|opt|srv|data)/[^\s"\'`)]*')
    files = subprocess.run(["git", "ls-files", "results"], capture_output=True, text=True, cwd=REPO).stdout.split()
    assert len(files) > 250
    found = {f: pattern.findall((REPO / f).read_text(errors="ignore"))[:2] for f in files if not f.endswith(".png")}
    assert not {f: m for f, m in found.items() if m}


def test_learned_is_step_zero_or_not():
    assert learned("supcon", 0) is False and learned("supcon", 20) is True
    assert learned("baseline", 0) is None and learned("supcon", None) is None
    assert RunRecord.model_fields["schema_version"].default == SCHEMA_VERSION


def _summary(**more) -> dict:
    return {"method": "simcse-unsup", "best_dev_spearman": 71.5, "best_step": 20, "final_step": 30,
            "total_steps": 30, "train_seconds": 12.0, "workers": 1, "device": "cpu", "torch_threads": 2,
            "precision": "fp32", **more}


def test_a_training_summary_round_trips_and_refuses_unknown_fields(tmp_path):
    s = TrainSummary.model_validate(_summary(dev_curve=[{"step": 0, "dev_spearman": 60.0}]))
    (tmp_path / "result.json").write_text(json.dumps(s.to_json()))
    assert read_summary(tmp_path / "result.json") == s
    # a field the loop or the driver added without the schema knowing it is an error, not a silent extra key
    (tmp_path / "result.json").write_text(json.dumps(_summary(best_dev=1.0)))
    with pytest.raises(RaysentError, match=r"result.json: not a valid training summary: field 'best_dev'"):
        read_summary(tmp_path / "result.json")
    (tmp_path / "result.json").write_text(json.dumps({k: v for k, v in _summary().items() if k != "best_step"}))
    with pytest.raises(RaysentError, match="field 'best_step': Field required"):
        read_summary(tmp_path / "result.json")
