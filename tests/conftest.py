"""Shared test setup: real data and models from ../shared (never copied into the repo)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"

os.environ.setdefault("RAYSENT_DATA_DIR", str(SHARED / "data"))
os.environ.setdefault("RAYSENT_MODEL_DIR", str(SHARED / "models"))
# Ray workers do not run in this folder: a relative path (CI passes ../shared/...) must become absolute
# before the session's Ray starts, or workers started by the tests themselves look in the wrong place.
for _var in ("RAYSENT_DATA_DIR", "RAYSENT_MODEL_DIR"):
    os.environ[_var] = str(Path(os.environ[_var]).resolve())
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no hub here: fail fast instead of waiting on the network
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

RAW_BERT = "raw-bert-mini-mlm"  # 4-layer MLM-only BERT: a raw starting point
PARAPHRASE = "paraphrase-MiniLM-L3-v2"


def pytest_configure(config):
    for var in ("RAYSENT_DATA_DIR", "RAYSENT_MODEL_DIR"):
        if not Path(os.environ[var]).is_dir():
            raise pytest.UsageError(f"{var}={os.environ[var]} is not a folder: the tests read real data and "
                                    "models from ../shared (see README, 'Tests')")


@pytest.fixture(scope="session")
def raw_encoder():
    from raysent.models.encoder import Encoder

    return Encoder.load(RAW_BERT)


def run_cli(*args: str, check: bool = True, env: dict | None = None, one_stream: bool = False):
    """Run the installed `raysent` command in a subprocess; returns CompletedProcess (``one_stream``: stderr
    into stdout, in the order a terminal shows them)."""
    import subprocess

    streams = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT} if one_stream else {"capture_output": True}
    proc = subprocess.run([sys.executable, "-m", "raysent.cli", *args], text=True, **streams,
                          env={**os.environ, **(env or {})}, cwd=REPO)
    if check and proc.returncode != 0:
        raise AssertionError(f"raysent {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def json_summary_last(output: str, before: str) -> dict:
    """The JSON summary of `raysent … --format json` run with ``one_stream``: it must come last, after
    ``before`` and every other line Ray forwarded (Ray holds back log lines that repeat across workers until
    the driver disconnects)."""
    import json

    logs, brace, rest = output.rpartition("\n{\n")
    assert brace and before in logs, output[-3000:]
    return json.loads(brace + rest)


@pytest.fixture(scope="session")
def ray_cluster():
    """One local Ray for the whole test session (starting Ray costs seconds and ~2 GB).

    Yields the address, so `raysent` subprocesses join the same Ray through RAY_ADDRESS.
    """
    import ray

    from raysent.config import parse_config
    from raysent.train.ray_train import init_ray

    if not ray.is_initialized():
        # started as `raysent train` / `raysent tune` start a local Ray (LOCAL_RAY_ENV included), a cluster in
        # RAY_ADDRESS joined as it is
        cfg = parse_config({"name": "tests", "method": "simcse-unsup", "model": {"name": RAW_BERT}}, source="<tests>")
        init_ray(cfg, log_to_driver=False, num_cpus=2, include_dashboard=True)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()

