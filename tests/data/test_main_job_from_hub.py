"""The README's main job for a user without ../shared, as the README gives it: every data set and the encoder from
the Hugging Face hub, here from a cache laid out as the hub has them (tests/hub_standins.py), offline, in a Ray of
its own that sees no RAYSENT_DATA_DIR or RAYSENT_MODEL_DIR. Shortened (one learning rate on 1 seed, 4 steps of
256 sentences, SICK-R's test set), not otherwise changed."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import hub_standins
from conftest import REPO, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.shared]

DATA = Path(os.environ["RAYSENT_DATA_DIR"])
MODELS = Path(os.environ["RAYSENT_MODEL_DIR"])


def readme_hub_command() -> list[str]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    (line,) = [m for m in re.findall(r"^raysent tune .*$", text, flags=re.M) if "quick-hub" in m]
    return shlex.split(line)[1:]


def test_the_readme_s_hub_command_runs_from_the_hub_cache_alone(tmp_path):
    cache = hub_standins.hub_cache(tmp_path, DATA, MODELS)
    env = {k: v for k, v in os.environ.items() if k not in ("RAYSENT_DATA_DIR", "RAYSENT_MODEL_DIR", "RAY_ADDRESS")}
    env.update(HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(cache), HF_DATASETS_CACHE=str(tmp_path / "datasets"))
    results = tmp_path / "results"
    args = readme_hub_command()
    assert args[:2] == ["tune", "search_spaces/quick.yaml"] and f"model.revision={hub_standins.BERT_MINI[1]}" in args
    short = ["--set", "seeds=[1]", "--set", "search.seeds=1", "--set", "train.max_steps=4",
             "--set", "train.eval_every=2", "--set", "search.space={lr: {type: choice, values: [1.0e-4]}}",
             "--set", "data.max_train_samples=256", "--set", "eval.sts_sets=[sickr]",
             "--set", "tracking.enabled=false", "--set", f"tracking.results_dir={results}"]
    done = subprocess_run(args + short, env)
    exp = results / "quick-hub"
    records = [json.loads(p.read_text()) for p in sorted((exp / "runs").glob("*.json"))]
    assert records and {r["phase"] for r in records} == {"search", "final"}, done.stderr[-3000:]
    model, simcse = hub_standins.BERT_MINI, hub_standins.SIMCSE
    for r in records:
        assert r["sources"]["model"] == f"hf://{model[0]}@{model[1]}"
        assert r["sources"]["dev stsb:dev"] == f"hf://datasets/{simcse[0]}@{simcse[1]}/senteval.tar/" \
                                                 "STS/STSBenchmark/sts-dev.csv"
        assert r["sources"]["train"].startswith(f"hf://datasets/{simcse[0]}@{simcse[1]}/senteval.tar/")
    final = [r for r in records if r["phase"] == "final"]
    assert final[0]["eval"]["sts"]["sources"]["sickr"].endswith("senteval.tar/SICK/SICK_test_annotated.txt")
    table = run_cli("table", "quick-hub", "--results-dir", str(results), "--no-write", env=env).stdout.replace("\\_", "_")
    assert f"read from the Hugging Face hub: hf://datasets/{simcse[0]}@{simcse[1]} (" in table
    assert f"hf://{model[0]}@{model[1]} (model)" in table


def subprocess_run(args: list[str], env: dict):
    """`raysent ARGS` in a fresh process with exactly ``env`` (run_cli adds the tests' own environment, whose
    RAYSENT_DATA_DIR this run must not see)."""
    proc = subprocess.run([sys.executable, "-m", "raysent.cli", *args], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-5000:]
    return proc
