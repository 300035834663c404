"""A local Ray that raysent started does not outlive its driver: killed with SIGKILL, the driver leaves Ray's
agents running with parent 1; the next raysent command, whatever it is, stops them and says so."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from conftest import REPO, run_cli
from conftest import tiny_experiment as experiment

pytestmark = [pytest.mark.slow, pytest.mark.shared]

SEARCH = """\
  algorithm: grid
  warm_start: none
  seeds: 1
  space:
    lr: {type: choice, values: [1.0e-4]}
"""


def test_the_next_command_stops_the_ray_a_killed_driver_left(tiny_bert, tmp_path):
    path = experiment(tmp_path, "orphan", SEARCH, "[1]", max_steps=2000, model=tiny_bert)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # its own local Ray, not the tests'
    # its own temporary folder (short: Ray's socket paths must fit), so that no other raysent command, of a test
    # running beside this one, finds the killed driver's Ray first (raysent.orphans.MARKERS lies under it)
    env["TMPDIR"] = tempfile.mkdtemp(prefix="ro-")
    markers = Path(env["TMPDIR"]) / "raysent-local-ray"
    proc = subprocess.Popen([sys.executable, "-m", "raysent.cli", "tune", path, "--quiet"], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    marker = markers / f"driver-{proc.pid}.json"
    deadline = time.time() + 120
    while time.time() < deadline and not (tmp_path / "results" / "orphan" / "search").exists():
        time.sleep(0.5)  # a trial has started: Ray and its agents are up
    assert marker.is_file(), "the driver did not note the local Ray it started"
    noted = json.loads(marker.read_text())["processes"]
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    time.sleep(5)
    left = [pid for pid, started in noted if psutil.pid_exists(pid)
            and abs(psutil.Process(pid).create_time() - started) < 1]
    assert left, "nothing of the killed driver's Ray was left running: the case this guards against did not arise"
    assert any("ray::" in " ".join(psutil.Process(pid).cmdline()) for pid in left)

    said = run_cli("methods", env=env, timeout=120).stderr
    assert "raysent: stopped " in said and f"(pid {proc.pid})" in said, said
    time.sleep(1)
    assert not [pid for pid in left if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
    assert not marker.exists()
    assert "stopped" not in run_cli("methods", env=env, timeout=120).stderr  # once only
    shutil.rmtree(env["TMPDIR"], ignore_errors=True)
