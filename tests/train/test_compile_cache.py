"""One compile per search (raysent.train.compile_cache): the trials of a search point torch's compiler caches at the
experiment's folder, and a process that compiles the encoder after another finds every graph there. The slow test
compiles for real in two processes, as two trials do; what it asserts are the compiler's own cache counters, never
a time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from raysent.config import parse_config
from raysent.train import compile_cache
from raysent.train.compile_cache import INDUCTOR_VAR, TRITON_VAR, VARS

from conftest import RAW_BERT


@pytest.fixture
def clean_env(monkeypatch):
    for var in VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(compile_cache, "_ours", {})
    return monkeypatch


def test_a_search_points_the_compiler_caches_at_its_experiment_folder(clean_env, tmp_path):
    cfg = parse_config({"name": "exp", "method": "simcse-unsup", "model": {"name": RAW_BERT},
                        "tracking": {"results_dir": str(tmp_path / "results")}})
    assert compile_cache.folder(cfg) == tmp_path / "results" / "exp" / "compile-cache"
    env = compile_cache.use_for(cfg)  # train.compile auto (the default): its runs may compile
    folder = str(tmp_path / "results" / "exp" / "compile-cache")
    assert env == {INDUCTOR_VAR: folder, TRITON_VAR: folder + "/triton"} and os.environ[INDUCTOR_VAR] == folder
    # the next experiment of this process (a suite) takes the folders raysent set
    other = compile_cache.use(tmp_path / "other")
    assert other[INDUCTOR_VAR] == str(tmp_path / "other")
    # a run that never compiles touches nothing
    assert compile_cache.use_for(parse_config({"name": "x", "method": "simcse-unsup", "model": {"name": RAW_BERT},
                                               "train": {"compile": False}})) is None
    assert os.environ[INDUCTOR_VAR] == str(tmp_path / "other")


def test_an_exported_cache_folder_wins_and_torchs_own_default_does_not(clean_env, tmp_path):
    clean_env.setenv(INDUCTOR_VAR, str(tmp_path / "mine"))
    assert compile_cache.use(tmp_path / "exp")[INDUCTOR_VAR] == str(tmp_path / "mine")
    assert os.environ[TRITON_VAR] == str(tmp_path / "exp" / "triton")  # not exported: the experiment's
    # torch writes its default folder into the variable when it compiles with none set: that is not a choice
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    clean_env.setenv(INDUCTOR_VAR, os.path.abspath(default_cache_dir()))
    assert compile_cache.use(tmp_path / "exp")[INDUCTOR_VAR] == str(tmp_path / "exp")


def test_trials_and_workers_take_the_drivers_folder_where_their_node_sees_it(clean_env, tmp_path):
    from raysent.train.ray_train import FORWARDED_ENV

    assert set(VARS) <= set(FORWARDED_ENV)  # Ray Train workers (and Tune trials, TrialContext.env) are given them
    exp = tmp_path / "exp"
    sent = {INDUCTOR_VAR: str(exp / "compile-cache"), TRITON_VAR: str(exp / "compile-cache" / "triton")}
    compile_cache.take(sent)  # a node without the experiment's folder keeps its own
    assert not any(var in os.environ for var in VARS)
    exp.mkdir()
    compile_cache.take(sent)  # the folder above the cache is there: torch creates the cache in it
    assert {var: os.environ[var] for var in VARS} == sent


# one "trial": the encoder compiled for training (as the loop does: Encoder.compile_for_training), a forward and
# backward at a fixed shape, then torch's compile counters; the seed and the inputs differ between trials, as
# between a search's configurations, and dropout is on
TRIAL = """
import json, sys
import torch
from torch._dynamo.utils import counters
from raysent.models.encoder import Encoder
from raysent.train import compile_cache

compile_cache.use(sys.argv[2])
seed = int(sys.argv[3])
torch.manual_seed(seed)
enc = Encoder.load(sys.argv[1], dropout=0.1)
enc.compile_for_training("default")
enc.train()
ids = torch.randint(5, 40, (8, 16), generator=torch.Generator().manual_seed(seed))
mask = torch.ones(8, 16, dtype=torch.long)
first = enc(ids, mask)[-1]
second = enc(ids, mask)[-1]
(first.sum() + second.sum()).backward()
print("COUNTERS " + json.dumps({"inductor": dict(counters["inductor"]), "aot_autograd": dict(counters["aot_autograd"]),
                                "dropout_differs": bool((first != second).any()),
                                "grads": sum(p.grad is not None for p in enc.model.parameters())}))
"""


def _trial(model: str, cache: Path, seed: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in VARS}
    proc = subprocess.run([sys.executable, "-c", TRIAL, model, str(cache), str(seed)], capture_output=True, text=True,
                          env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("COUNTERS "))
    return json.loads(line[len("COUNTERS "):])


@pytest.mark.slow  # compiles the tiny random BERT in two processes (the first about a minute on 2 busy cores)
def test_a_second_process_finds_every_graph_in_the_shared_cache(tiny_bert, tmp_path):
    cache = tmp_path / "results" / "exp" / "compile-cache"
    first = _trial(tiny_bert, cache, seed=1)
    assert first["inductor"].get("fxgraph_cache_miss", 0) >= 2, first  # the forward and the backward, compiled
    assert first["inductor"].get("fxgraph_cache_hit", 0) == 0, first
    assert first["aot_autograd"].get("autograd_cache_miss", 0) >= 1, first
    assert first["dropout_differs"] and first["grads"] > 20, first  # compiled dropout draws new masks per call
    assert any((cache / "fxgraph").iterdir()) and (cache / "aotautograd").is_dir()  # in the folder given
    second = _trial(tiny_bert, cache, seed=2)
    assert second["inductor"].get("fxgraph_cache_miss", 0) == 0, second  # nothing compiled again
    assert second["inductor"].get("fxgraph_cache_hit", 0) >= 2, second
    assert second["aot_autograd"].get("autograd_cache_hit", 0) >= 1, second
    assert second["dropout_differs"] and second["grads"] == first["grads"], second
