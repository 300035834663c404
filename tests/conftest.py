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


def run_cli(*args: str, check: bool = True, env: dict | None = None):
    """Run the installed `raysent` command in a subprocess; returns CompletedProcess."""
    import subprocess

    proc = subprocess.run([sys.executable, "-m", "raysent.cli", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, cwd=REPO)
    if check and proc.returncode != 0:
        raise AssertionError(f"raysent {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


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

