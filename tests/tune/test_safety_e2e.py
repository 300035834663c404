"""Issue 60's battery, the searches themselves: a disk that fills in the middle of a search (a 60 MB tmpfs in a
mount namespace of the test's own) ends in one error and `--resume` then finishes it; a second search of an
experiment that is running is refused, and the first goes on; the warm-start arm failing on every final seed
leaves the searched arm's summary. tests/tune/test_safety.py tests the parts without a search."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from raysent.config import load_config
from raysent.report.summary import format_summary
from raysent.tune.trial import GATE_VAR

from conftest import REPO, cli_in_process
from conftest import tiny_experiment as experiment

pytestmark = [pytest.mark.slow, pytest.mark.shared]

GRID = """\
  algorithm: grid
  warm_start: none
  space:
    lr: {type: choice, values: [1.0e-4, 3.0e-5]}
"""


def unshare_works() -> bool:
    probe = subprocess.run(["unshare", "--mount", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"],
                           capture_output=True)
    return probe.returncode == 0


@pytest.mark.skipif(not unshare_works(), reason="needs `unshare --mount` (a small tmpfs of the test's own)")
def test_a_disk_that_fills_mid_search_is_one_error_and_resume_finishes_it(tmp_path):
    """raw-bert-mini-mlm's weights are 22 MB; a trial's first checkpoint (its best model, then the weights and
    AdamW's moments) does not fit in what a 60 MB disk has left. Both trials fail for lack of space: once ("EOFError:
    Ran out of input" after 7 tracebacks) that was a traceback, and `--resume` failed the same way every time. The
    disk then grows to 700 MB (a remount, as a user frees space) and `--resume` retries the two trials."""
    disk = tmp_path / "disk"
    disk.mkdir()
    path = experiment(tmp_path, "full", GRID, "[1]", sts_sets="[stsb]")
    Path(path).write_text(Path(path).read_text().replace(str(tmp_path / "results"), str(disk / "results")))
    raysent = f"'{sys.executable}' -m raysent.cli tune '{path}' --quiet"
    script = (f"mount -t tmpfs -o size=60m tmpfs '{disk}' && "
              f"{raysent} > '{tmp_path}/first.out' 2> '{tmp_path}/first.err'; echo $? > '{tmp_path}/first.rc'; "
              f"ls -A '{disk}/results/full/runs' > '{tmp_path}/runs.ls' 2>&1; "
              f"mount -o remount,size=700m '{disk}' && "
              f"{raysent.replace(' --quiet', '')} --resume > '{tmp_path}/second.out' 2> '{tmp_path}/second.err'; "
              f"echo $? > '{tmp_path}/second.rc'; "
              f"cat '{disk}/results/full/summary.json' > '{tmp_path}/summary.json'; "
              f"ls '{disk}/results/full/runs' > '{tmp_path}/records.ls'")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # its own Ray, inside the namespace
    subprocess.run(["unshare", "--mount", "sh", "-c", script], cwd=REPO, env=env, timeout=600, check=True)

    first = (tmp_path / "first.err").read_text()
    assert (tmp_path / "first.rc").read_text().strip() == "2", first[-3000:]
    last = first.strip().splitlines()[-1]
    assert last.startswith(f"raysent: error: the disk of {disk / 'results' / 'full'} ran out of space (") and \
        "MB free now; the search needs about " in last and f"`raysent tune {path} --resume`" in last, first[-3000:]
    # Tune logs each failed trial's traceback (the disk's error, as the trial met it: a trial on an OMP-limited
    # test worker can fail inside torch.save or MLflow instead of safetensors); none comes from the search itself
    assert "EOFError" not in first and "raysent/tune/driver.py" not in first, first[-3000:]
    assert "No space left on device" in first
    assert not [n for n in (tmp_path / "runs.ls").read_text().split() if n.startswith(".")]  # no temporary file

    second = (tmp_path / "second.err").read_text()
    assert (tmp_path / "second.rc").read_text().strip() == "0", second[-3000:]
    assert "--resume: 2 trial(s) failed for lack of space; they run again" in second
    records = (tmp_path / "records.ls").read_text().split()
    assert len([r for r in records if r.startswith("search-")]) == 2, records  # each configuration once
    assert len([r for r in records if r.startswith("final-")]) == 1, records
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["best"]["finished_runs"] == 2 and summary["final"]["seeds"] == [1]


def test_a_second_search_of_a_running_experiment_is_refused_and_the_first_goes_on(ray_cluster, tiny_bert, tmp_path):
    """The first search's trials wait at a gate (raysent.tune.trial.wait_at_gate) while the second `raysent tune` of
    the same file starts: it is refused, naming the first's search id and process, and writes nothing; the gate
    opens and the first search finishes, its state and summary its own."""
    path = experiment(tmp_path, "twice", GRID, "[1]", sts_sets="[stsb]", model=tiny_bert)
    gate = tmp_path / "gate"
    gate.mkdir()
    env = {**os.environ, "RAY_ADDRESS": ray_cluster, GATE_VAR: str(gate)}
    first = subprocess.Popen([sys.executable, "-m", "raysent.cli", "tune", path, "--quiet"], env=env, cwd=REPO,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lock = tmp_path / "results" / "twice" / ".search.lock"
        deadline = time.time() + 180
        while time.time() < deadline and not (gate / "arrived-1").exists():
            assert first.poll() is None, first.communicate()
            time.sleep(0.2)
        held = json.loads(lock.read_text())
        assert held["pid"] == first.pid and held["search"]
        before = sorted(p.name for p in (tmp_path / "results" / "twice").iterdir())
        second = cli_in_process("tune", path, "--quiet", check=False)
        assert second.returncode == 2, second.stderr
        assert f"another search of this experiment is running (search {held['search']}, process {first.pid} on " \
            in second.stderr and "Traceback" not in second.stderr
        assert sorted(p.name for p in (tmp_path / "results" / "twice").iterdir()) == before
    finally:
        (gate / "allow").write_text("99")
    _, err = first.communicate(timeout=300)
    assert first.returncode == 0, err[-3000:]
    state = json.loads((tmp_path / "results" / "twice" / "state.json").read_text())
    assert state["run"] == held["search"] and state["phase"] == "done"


WARM_NAN = """\
  algorithm: grid
  space:
    temperature: {type: choice, values: [0.05, 1.0e-45]}   # 1e-45: cos/τ overflows, the loss is NaN
"""


def test_a_warm_start_arm_that_fails_on_every_seed_leaves_the_searched_arms_summary(ray_cluster, tiny_bert, tmp_path):
    """The file's temperature (1e-45) is the warm-start configuration: it fails in the search (a NaN loss) and
    again on every final seed. The final phase used to end with "no run finished" and no summary; now the searched
    arm's scores come out, the failed arm is reported, and the search finishes."""
    from raysent.tune.driver import tune_experiment

    path = experiment(tmp_path, "arm", WARM_NAN, "[7]", sts_sets="[stsb]", model=tiny_bert)
    Path(path).write_text(Path(path).read_text().replace("params: {pooling: mean}",
                                                         "params: {pooling: mean, temperature: 1.0e-45}"))
    summary = tune_experiment(load_config(path), quiet=True)
    assert summary.best.hp == {"temperature": 0.05}
    assert summary.final.seeds == [7] and "sts/stsb" in summary.final.scores
    assert summary.paper.seeds == [] and summary.paper.missing_seeds == [7]
    assert "loss became nan" in summary.paper.errors[0].lower() and summary.vs_paper is None
    assert "FAILED: no seed of the file arm finished (1 failed): " in format_summary(summary)
    assert json.loads((tmp_path / "results" / "arm" / "state.json").read_text())["phase"] == "done"
