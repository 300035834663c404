"""The untuned model's dev scores are reused only where they are the same numbers (raysent.train.initial_dev):
the key follows what a method's ``embed`` reads, and a run that reuses a score trains the same steps."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from raysent.config import parse_config
from raysent.methods import METHODS, Method
from raysent.train import initial_dev
from raysent.train.run import build_method

EMBEDDING = {"max_length": 32, "batch_size": 128, "device": "cpu"}


def _method(model: str, method: str, seed: int = 42, **params) -> Method:
    raw = {"name": "t", "method": method, "model": {"name": model}, "params": params,
           "data": {"train": "stsb-unlabeled"} if method not in ("simcse-sup", "layeratt") else {},
           "train": {"seed": seed}, "tracking": {"enabled": False}}
    return build_method(parse_config(raw)).eval()


def _key(m: Method, dev_sets: dict, **embedding) -> str:
    return initial_dev.key(m.embeds_with(), {**EMBEDDING, **embedding}, dev_sets)


def _owner(cls: type, attr: str) -> type:
    return next(c for c in cls.__mro__ if attr in vars(c))


@pytest.mark.parametrize("name", sorted(METHODS))
def test_a_method_that_overrides_embed_says_what_it_reads(name):
    """``embeds_with`` is the key's account of ``embed``: a method class that (re)defines embed defines it too."""
    cls = METHODS[name]
    assert issubclass(_owner(cls, "embeds_with"), _owner(cls, "embed")), \
        f"{name}: {_owner(cls, 'embed').__name__}.embed without embeds_with"


def _sets() -> dict:
    from raysent.data import load

    return {"stsb:dev": load("stsb:dev", "scored_pairs")}


@pytest.mark.shared
def test_equal_keys_embed_alike_and_a_seeded_head_or_a_setting_makes_a_new_key(tiny_bert, tmp_path):
    """Equal keys: configurations that leave the model as loaded, and methods reading it with the same pooling
    (ConSERT's two supervisions, last2_avg, and the no-tuning baseline), embed alike. A head drawn from the seed
    (SimCSE-sup's [CLS] MLP), another pooling, max_length or dev set: another key."""
    sets = _sets()
    tok_text = ["a man is playing a guitar.", "two dogs run on the beach."]

    def vectors(m: Method) -> torch.Tensor:
        tok = m.encoder.tokenizer(tok_text, padding=True, return_tensors="pt")
        with torch.inference_mode():
            return m.embed(dict(tok))

    same = [_method(tiny_bert, "simcse-unsup", pooling="mean", temperature=0.05),
            _method(tiny_bert, "simcse-unsup", seed=7, pooling="mean", temperature=0.1)]
    assert _key(same[0], sets) == _key(same[1], sets)
    assert torch.equal(vectors(same[0]), vectors(same[1]))
    last2 = [_method(tiny_bert, "consert", supervision="unsup"), _method(tiny_bert, "baseline", pooling="last2_avg")]
    assert _key(last2[0], sets) == _key(last2[1], sets)
    assert torch.equal(vectors(last2[0]), vectors(last2[1]))

    heads = [_method(tiny_bert, "simcse-sup", seed=1), _method(tiny_bert, "simcse-sup", seed=2)]
    assert not torch.equal(vectors(heads[0]), vectors(heads[1]))  # the MLP is read, and drawn from the seed
    assert _key(heads[0], sets) != _key(heads[1], sets)
    # ConSERT selecting on another pooling than the one it saves: the selecting one is what the dev set scores
    select = _method(tiny_bert, "consert", supervision="unsup", select_pooling="mean")
    assert _key(select, sets) == _key(same[0], sets)
    assert torch.equal(vectors(select), vectors(same[0]))
    keys = {_key(same[0], sets), _key(last2[0], sets), _key(same[0], sets, max_length=64),
            _key(same[0], sets, batch_size=64),
            _key(same[0], {"stsb:dev": dataclasses.replace(sets["stsb:dev"], sentence1=sets["stsb:dev"].sentence1[:-1],
                                                           sentence2=sets["stsb:dev"].sentence2[:-1],
                                                           scores=sets["stsb:dev"].scores[:-1])})}
    assert len(keys) == 5


@pytest.mark.shared
def test_a_pooler_the_checkpoint_lacked_is_no_part_of_the_key():
    """raw-bert-mini-mlm (MLM-only) has no pooler weights: each run draws one from its seed, and no pooling but
    ``cls`` with the model's own trained pooler reads it. Two seeds of mean-pooled SimCSE embed alike, so their
    key is one (it was one per seed: a search on 3 seeds scored the same model 3 times at step 0)."""
    from conftest import RAW_BERT

    sets = _sets()
    a, b = (_method(RAW_BERT, "simcse-unsup", seed=s, pooling="mean") for s in (1, 2))
    assert "pooler.dense.weight" in a.encoder.random_init
    assert not torch.equal(a.encoder.state_dict()["model.pooler.dense.weight"],
                           b.encoder.state_dict()["model.pooler.dense.weight"])  # drawn from each seed
    assert _key(a, sets) == _key(b, sets)
    tok = a.encoder.tokenizer(["a man is playing a guitar.", "two dogs run on the beach."], padding=True,
                              return_tensors="pt")
    with torch.inference_mode():
        assert torch.equal(a.embed(dict(tok)), b.embed(dict(tok)))
    assert not any(k.startswith("model.pooler.") for k in a.encoder.weights_read("mean"))


def test_runs_that_start_together_compute_a_key_once(tmp_path, monkeypatch):
    """A second run asking for a key while the first computes it waits for the first's file (the lock is the
    file's), and reads it."""
    import threading

    monkeypatch.setenv("RAYSENT_CACHE_DIR", str(tmp_path / "cache"))
    computing, calls, said = threading.Event(), [], []

    def slow() -> dict:
        calls.append(1)
        computing.set()
        threading.Event().wait(0.5)  # the second run asks meanwhile
        return {"dev_spearman": 40.0}

    first: list[dict] = []
    t = threading.Thread(target=lambda: first.append(initial_dev.scores(slow, "k", said.append)))
    t.start()
    assert computing.wait(10)
    second = initial_dev.scores(slow, "k", said.append)
    t.join()
    assert first == [second] == [{"dev_spearman": 40.0}] and len(calls) == 1
    assert len(said) == 1 and said[0].startswith("step 0: the untuned model's dev scores as an earlier run")


def test_a_stored_score_is_read_and_a_broken_or_unwritable_store_is_computed(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYSENT_CACHE_DIR", str(tmp_path / "cache"))
    calls: list[int] = []
    said: list[str] = []

    def compute() -> dict:
        calls.append(1)
        return {"dev/stsb:dev": 41.5, "dev_spearman": 41.5}

    first = initial_dev.scores(compute, "k1", said.append)
    second = initial_dev.scores(compute, "k1", said.append)
    assert first == second == {"dev/stsb:dev": 41.5, "dev_spearman": 41.5} and len(calls) == 1
    stored = tmp_path / "cache" / initial_dev.SUBDIR / "k1.json"
    assert json.loads(stored.read_text()) == {"scores": first}
    assert said == [f"step 0: the untuned model's dev scores as an earlier run computed them ({stored})"]
    stored.write_text('{"scores": ')  # cut short: computed again, and stored whole
    assert initial_dev.scores(compute, "k1", said.append) == first and len(calls) == 2
    assert json.loads(stored.read_text()) == {"scores": first}
    # a cache folder that cannot be made: the run goes on with its own scores and says how to fix it
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("RAYSENT_CACHE_DIR", str(tmp_path / "file"))
    said.clear()
    assert initial_dev.scores(compute, "k2", said.append) == first and len(calls) == 3
    assert len(said) == 1 and said[0].startswith("NOTE: could not keep") and "RAYSENT_CACHE_DIR" in said[0]


def test_the_source_digest_covers_every_module_of_the_package():
    import raysent

    root = Path(raysent.__file__).parent
    assert len(initial_dev.source_digest()) == 64
    assert (root / "train" / "initial_dev.py").is_file() and (root / "eval" / "sts.py").is_file()


@pytest.mark.slow
@pytest.mark.shared
def test_a_run_that_reuses_the_untuned_scores_trains_the_same_steps(tiny_bert, tmp_path, monkeypatch):
    """Two runs of the same configuration: the second reads the step-0 scores the first stored, which are scipy's
    Spearman of the untuned model on SICK-R dev, and it ends on the same dev curve; with
    ``train.eval_at_start_cache: false`` nothing is read or stored."""
    from scipy import stats

    from raysent.data import load
    from raysent.models.embedder import Embedder
    from raysent.train.run import train_in_process

    monkeypatch.setenv("RAYSENT_CACHE_DIR", str(tmp_path / "cache"))

    def cfg(name: str, **train):
        return parse_config({
            "name": name, "method": "simcse-unsup", "model": {"name": tiny_bert}, "params": {"pooling": "mean"},
            "data": {"train": "stsb-unlabeled", "dev": ["sickr:dev"], "max_train_samples": 32},
            "train": {"batch_size": 16, "max_steps": 2, "eval_every": 2, "max_length": 24, "lr": 1e-3,
                      "output_dir": str(tmp_path / name), **train},
            "eval": {"max_length": 24}, "tracking": {"enabled": False}})

    first = train_in_process(cfg("a"), quiet=True)
    store = tmp_path / "cache" / initial_dev.SUBDIR
    assert len(list(store.glob("*.json"))) == 1
    second = train_in_process(cfg("b"), quiet=True)
    assert second.initial_dev == first.initial_dev is not None
    assert [(p.step, p.dev_spearman) for p in second.dev_curve] == [(p.step, p.dev_spearman) for p in first.dev_curve]
    assert first.dev_curve[-1].dev_spearman != first.initial_dev["dev_spearman"]  # it trained

    # what was stored is the untuned model's score, as scipy computes it
    pairs = load("sickr:dev", "scored_pairs")
    untuned = build_method(cfg("d")).eval()
    embed = Embedder(untuned.embed, untuned.encoder.tokenizer, module=untuned, max_length=24)
    # every sentence in one call, and each vector normalised before the product, as the evaluation does: the random
    # character-level model reads many pairs as the same 24 tokens, whose cosines tie at 1 only when computed alike
    sentences = list(dict.fromkeys(pairs.sentences()))
    vec = dict(zip(sentences, embed(sentences).astype(np.float64)))
    u, v = np.stack([vec[s] for s in pairs.sentence1]), np.stack([vec[s] for s in pairs.sentence2])
    cos = ((u / np.linalg.norm(u, axis=1, keepdims=True)) * (v / np.linalg.norm(v, axis=1, keepdims=True))).sum(1)
    assert first.initial_dev["dev_spearman"] == pytest.approx(100 * stats.spearmanr(cos, pairs.scores).statistic,
                                                              abs=1e-4)
    off = train_in_process(cfg("c", eval_at_start_cache=False), quiet=True)
    assert off.initial_dev == pytest.approx(first.initial_dev) and len(list(store.glob("*.json"))) == 1
