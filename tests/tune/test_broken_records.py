"""A broken run record is found before anything trains: `--resume` and `raysent table` read every record of the
experiment first and name each broken file with what to do; after deleting them, `--resume` writes them again
from the results Tune kept, training nothing."""

from __future__ import annotations

import json

import pytest

from raysent.config import load_config

from conftest import cli_in_process
from conftest import tiny_experiment as experiment

pytestmark = [pytest.mark.slow, pytest.mark.shared]

ONE_POINT = """\
  algorithm: grid
  warm_start: none
  seeds: 1
  space:
    lr: {type: choice, values: [1.0e-4]}
"""


def test_broken_records_are_named_first_and_resume_rewrites_them_from_tune(ray_cluster, tiny_bert, tmp_path):
    from raysent.tune.driver import tune_experiment

    path = experiment(tmp_path, "cut", ONE_POINT, "[1]", sts_sets="[stsb]", tracking=", log_model: none",
                      model=tiny_bert)
    tune_experiment(load_config(path), quiet=True)
    runs = tmp_path / "results" / "cut" / "runs"
    files = sorted(runs.glob("*.json"))
    assert [f.name.split("-")[0] for f in files] == ["final", "search"]
    original = {f.name: json.loads(f.read_text()) for f in files}
    for f in files:  # each cut to half its size, as a full disk or a killed copy leaves it
        f.write_text(f.read_text()[: f.stat().st_size // 2])

    for args in (("table", "cut", "--results-dir", str(tmp_path / "results")), ("tune", path, "--resume")):
        proc = cli_in_process(*args, check=False)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
        assert "2 of the 2 run records" in proc.stderr and "Trial status" not in proc.stdout + proc.stderr
        for f in files:
            assert f"{f}: not a valid run file (JSON error at line" in proc.stderr
        assert "Delete each broken file" in proc.stderr and "--resume" in proc.stderr

    for f in files:
        f.unlink()
    done = cli_in_process("tune", path, "--resume")
    assert "2 run record(s) written again from the results Tune kept" in done.stderr
    assert "Trial status" not in done.stdout + done.stderr  # nothing trained
    assert {f.name: json.loads(f.read_text()) for f in sorted(runs.glob("*.json"))} == original
    cli_in_process("table", "cut", "--results-dir", str(tmp_path / "results"), "--no-write")
