"""A process that trains one run after another (a Tune trial process that Tune reuses for the next trial) reads the
model from disk and the training data once, and tokenizes the data once (raysent.train.run.reuse_across_runs,
raysent.models.cache): each run still gets exactly what it would get alone (the same weights, heads, random state
and tokens), and its own copy of the weights."""

from __future__ import annotations

import os
import random
import shutil
import sys
from collections import Counter

import numpy as np
import pytest
import torch

from raysent.config import parse_config
from raysent.models.encoder import Encoder
from raysent.train import run
from raysent.train.run import build_method, prepare_data, reuse_across_runs

from conftest import RAW_BERT, SHARED

pytestmark = pytest.mark.shared  # real data and models from ../shared

METHODS = [("simcse-unsup", {"pooling": "cls"}, "sts-unlabeled"),  # SimCSE's MLP head, sentences
           ("sbert-nli", {}, "snli:dev+test")]  # the NLI classifier, labelled pairs with extras


def config(method: str, params: dict, data: str, seed: int, model: str = RAW_BERT, **train):
    return parse_config({"name": "reuse", "method": method, "model": {"name": model}, "params": params,
                         "data": {"train": data, "max_train_samples": 200},
                         "train": {"seed": seed, "max_length": 32, "huge_pages": False, **train}})


def built(cfg) -> tuple[dict, torch.nn.Module]:
    """What a run starts from: the method's weights (encoder and heads), the random state after building it, its
    tokenized data."""
    method = build_method(cfg)
    tok, groups, info = prepare_data(cfg, method)
    state = {"weights": {k: v.detach().clone() for k, v in method.state_dict().items()},
             "torch": torch.random.get_rng_state(), "numpy": np.random.get_state()[1].copy(),
             "python": random.getstate(), "ids": tok.ids, "extras": tok.extras, "groups": groups, "info": info}
    return state, method


def assert_same(got: dict, want: dict) -> None:
    assert got["weights"].keys() == want["weights"].keys()
    differ = [k for k, v in got["weights"].items() if not torch.equal(v, want["weights"][k])]
    assert not differ, f"weights differ: {differ[:5]}"
    assert torch.equal(got["torch"], want["torch"]) and np.array_equal(got["numpy"], want["numpy"])
    assert got["python"] == want["python"] and got["ids"] == want["ids"] and got["info"] == want["info"]
    assert got["extras"].keys() == want["extras"].keys()
    assert all(np.array_equal(v, want["extras"][k]) for k, v in got["extras"].items())
    assert (got["groups"] is None) == (want["groups"] is None)
    if got["groups"] is not None:
        assert np.array_equal(got["groups"], want["groups"])


@pytest.fixture
def counts(monkeypatch):
    """Reads of a model from disk, reads of a data set, tokenizations, counted; reuse off again afterwards."""
    seen: Counter = Counter()
    load_model, load_data = Encoder.load, run.load

    def model(cls, *args, **kwargs):
        seen["model"] += 1
        return load_model(*args, **kwargs)

    def data(*args, **kwargs):
        seen["data"] += 1
        return load_data(*args, **kwargs)

    class Tokenized(run.TokenizedData):
        def __init__(self, *args, **kwargs):
            seen["tokenize"] += 1
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(Encoder, "load", classmethod(model))
    monkeypatch.setattr(run, "load", data)
    monkeypatch.setattr(run, "TokenizedData", Tokenized)
    reuse_across_runs(False)
    yield seen
    reuse_across_runs(False)


@pytest.mark.parametrize(("method", "params", "data"), METHODS, ids=[m[0] for m in METHODS])
def test_runs_of_a_reused_process_start_from_what_they_would_alone_and_read_and_tokenize_once(
        method, params, data, counts):
    cfgs = {seed: config(method, params, data, seed) for seed in (1, 2)}
    alone = {seed: built(cfg)[0] for seed, cfg in cfgs.items()}
    assert counts == {"model": 2, "data": 2, "tokenize": 2}  # off: every run reads and tokenizes
    assert not torch.equal(alone[1]["torch"], alone[2]["torch"])  # the seeds draw different heads
    counts.clear()
    reuse_across_runs()
    for seed in (1, 2, 1, 2):
        got, method_ = built(cfgs[seed])
        assert_same(got, alone[seed])
    # the model is read once per seed (loading draws the weights the checkpoint lacks, BERT's pooler here, from the
    # seeded generator: a seed not seen yet is a real load), the data read and tokenized once
    assert counts == {"model": 2, "data": 1, "tokenize": 1}
    # each run has its own copy: one that trained (here: changed in place) leaves the next run's start as it was
    with torch.no_grad():
        for p in method_.parameters():
            p.add_(1.0)
    assert_same(built(cfgs[2])[0], alone[2])
    assert counts["model"] == 2
    # what decides the tokens is in the key: another max length is tokenized again, another subset read again
    built(config(method, params, data, 1, max_length=24))
    assert counts == {"model": 2, "data": 1, "tokenize": 2}
    built(parse_config({**cfgs[1].to_dict(), "data": {**cfgs[1].to_dict()["data"], "max_train_samples": 100}}))
    assert counts == {"model": 2, "data": 2, "tokenize": 3}


def test_a_model_folder_whose_files_changed_is_read_again(tmp_path, counts):
    folder = tmp_path / "model"
    shutil.copytree(SHARED / "models" / RAW_BERT, folder)
    cfg = config("simcse-unsup", {"pooling": "mean"}, "sts-unlabeled", 1, model=str(folder))
    reuse_across_runs()
    built(cfg)
    built(cfg)
    assert counts["model"] == 1 and counts["tokenize"] == 1
    (folder / "config.json").write_text((folder / "config.json").read_text() + "\n")  # rewritten
    built(cfg)
    assert counts["model"] == 2
    assert counts["tokenize"] == 2  # its tokenizer is another one's now (the folder's files changed)


def test_a_trial_process_keeps_them_and_claims_its_devices(monkeypatch, counts):
    from raysent.tune.protocol import TrialContext
    from raysent.tune.trial import prepare_process

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)  # prepare_process sets its own
    prepare_process(TrialContext(config={}, source="<test>", phase="search", run="r", exp_dir="/nonexistent",
                                 metric="best_dev_spearman"))
    assert os.environ["CUDA_VISIBLE_DEVICES"] == ""  # given no GPU (outside Ray), it sees none
    cfg = config("simcse-unsup", {"pooling": "mean"}, "sts-unlabeled", 1)
    built(cfg)
    built(cfg)
    assert counts == {"model": 1, "data": 1, "tokenize": 1}


@pytest.mark.slow  # trains 3 runs of 6 steps on the tiny BERT
def test_a_run_that_reused_everything_trains_as_the_run_alone(tiny_bert, tmp_path, counts):
    """What the runs share (the tokenized data, the tokenizer, the model read from disk) comes out of a run as it went
    in: the third run of a reused process, with everything from its caches, trains exactly as the run alone."""
    from raysent.train.run import train_in_process

    def train(seed: int, folder: str):
        cfg = parse_config({"name": "reuse", "method": "simcse-unsup", "model": {"name": tiny_bert},
                            "params": {"pooling": "mean"},
                            "data": {"train": "sts-unlabeled", "dev": ["sickr:dev"], "max_train_samples": 96},
                            "train": {"seed": seed, "batch_size": 16, "max_steps": 6, "eval_every": 2,
                                      "max_length": 24, "huge_pages": False, "output_dir": str(tmp_path / folder)}})
        return train_in_process(cfg, quiet=True)

    alone = train(3, "alone")
    reuse_across_runs()
    train(3, "first")
    train(5, "other")  # another seed in between
    again = train(3, "again")
    # the tiny BERT's checkpoint has every weight (loading draws nothing): read once alone and once for every seed
    # of the reused process; the data tokenized once alone and once kept
    assert counts["model"] == 2 and counts["tokenize"] == 2
    assert again.dev_curve == alone.dev_curve and again.best_dev_spearman == alone.best_dev_spearman
    assert again.loss_curve == alone.loss_curve
