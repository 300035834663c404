"""Every model folder raysent saves is a sentence-transformers model: ``SentenceTransformer(path)`` loads it with
nothing missing and nothing created, and ``.encode()`` returns what ``raysent eval`` embeds (``raysent.load``)
for every inference pooling, to 1e-5 cosine."""

from __future__ import annotations

import contextlib
import io
import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch

import raysent
from raysent.errors import ModelError
from raysent.models.encoder import Encoder
from raysent.models.heads import LayerAttentionPooler, MLPHead

from conftest import RAW_BERT, cli_in_process, run_cli

SENTENCES = ["a man is playing a guitar.", "the cat sat on the mat", "hello",
             "a much longer sentence, with many more words in it than the others, so the batch is padded",
             "a man is playing a guitar."]
POOLINGS = ["cls", "cls_before_pooler", "mean", "mean_no_cls", "max", "first_last_avg", "last2_avg",
            "layer0_mean", "layer1_cls", "layer2_max", "layeratt"]
NEEDS_RAYSENT = {"mean_no_cls", "layeratt"}
WARNINGS = ("missing", "newly initialized", "creating a new one", "no sentence-transformers model found",
            "were not used", "unexpected")


def loaded_quietly(path: str, trust: bool):
    """SentenceTransformer(path) and everything it printed, logged or warned while loading."""
    import warnings

    from sentence_transformers import SentenceTransformer

    out = io.StringIO()
    handler = logging.StreamHandler(out)
    root = logging.getLogger()
    root.addHandler(handler)
    level = root.level
    root.setLevel(logging.DEBUG)
    try:
        with contextlib.redirect_stderr(out), contextlib.redirect_stdout(out), \
                warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model = SentenceTransformer(path, trust_remote_code=trust, device="cpu")
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    return model, out.getvalue() + "\n".join(str(w.message) for w in caught)


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def save_with(model_dir: str, pooling: str, out) -> None:
    encoder = Encoder.load(model_dir)
    torch.manual_seed(1)
    head = {"cls": lambda: MLPHead(encoder.hidden_size),
            "layeratt": lambda: LayerAttentionPooler(encoder.hidden_size)}.get(pooling, lambda: None)()
    if head is not None:  # weights far from their initialisation, as after training
        for p in head.parameters():
            torch.nn.init.normal_(p, std=0.3)
    encoder.save(out, pooling, mlp=head, extra={"method": "test"}, max_length=48)


@pytest.mark.parametrize("pooling", POOLINGS)
def test_every_pooling_loads_in_sentence_transformers_and_encodes_as_raysent_eval(tiny_bert, tmp_path, pooling):
    out = tmp_path / pooling
    save_with(tiny_bert, pooling, out)
    model, said = loaded_quietly(str(out), trust=pooling in NEEDS_RAYSENT)
    assert not [w for w in WARNINGS if w in said.lower()], said
    got = model.encode(SENTENCES, batch_size=2)  # other batches, other padding than raysent's
    want = raysent.load(out).encode(SENTENCES)
    assert got.shape == want.shape == (len(SENTENCES), 32)
    assert cosines(got, want).min() > 1 - 1e-5
    assert np.abs(got - want).max() < 1e-4
    assert model.max_seq_length == 48  # what raysent eval reads (eval.max_length when trained)
    meta = json.loads((out / "raysent.json").read_text())
    assert meta["pooling"] == pooling and meta["sentence_transformers"]["needs_raysent"] == (pooling in NEEDS_RAYSENT)


def test_a_raysent_module_is_refused_without_trust_remote_code(tiny_bert, tmp_path):
    from sentence_transformers import SentenceTransformer

    save_with(tiny_bert, "mean_no_cls", tmp_path / "m")
    with pytest.raises(ValueError, match="trust_remote_code=True"):
        SentenceTransformer(str(tmp_path / "m"), device="cpu")


@pytest.mark.shared
def test_an_untrained_pooler_stays_out_of_both_models(tmp_path):
    """mean pooling of raw-bert-mini-mlm, whose checkpoint has no pooler (MLM only): no pooler weights saved, and
    sentence-transformers builds none (what it printed before: `pooler.dense.weight | MISSING`)."""
    save_with(RAW_BERT, "mean", tmp_path / "m")
    model, _ = loaded_quietly(str(tmp_path / "m"), trust=False)
    assert getattr(model[0].model, "pooler", None) is None
    from safetensors import safe_open

    with safe_open(str(tmp_path / "m" / "model.safetensors"), "pt") as f:
        assert not [k for k in f.keys() if k.startswith("pooler.")]  # noqa: SIM118 (safe_open is no dict)


@pytest.mark.shared
def test_a_pooling_that_cannot_be_written_is_a_clear_error(tmp_path):
    # cls reads [CLS] through a trained dense+tanh; raw-bert-mini-mlm has no trained pooler and none is given
    with pytest.raises(ModelError, match="cls_before_pooler"):
        Encoder.load(RAW_BERT).save(tmp_path / "m", "cls")


@pytest.mark.shared
def test_raysent_export_rewrites_a_model_for_sentence_transformers(tiny_bert, tmp_path):
    out = tmp_path / "exported"
    cli_in_process("export", tiny_bert, str(out), "--pooling", "last2_avg")
    model, said = loaded_quietly(str(out), trust=False)
    # the export's manifest of its files (raysent/cli/export.py) is in no loader's way
    assert (out / ".raysent-export.json").is_file() and not [w for w in WARNINGS if w in said.lower()], said
    want = raysent.load(out).encode(SENTENCES)
    assert cosines(model.encode(SENTENCES), want).min() > 1 - 1e-5
    assert (out / "README.md").is_file() and "last2_avg" in (out / "README.md").read_text()
    bad = run_cli("export", RAW_BERT, str(tmp_path / "bad"), "--pooling", "cls", check=False)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "cls_before_pooler" in bad.stderr and bad.stderr.count("\n") == 1


@pytest.mark.slow
@pytest.mark.shared
def test_a_trained_mini_suite_model_scores_the_same_in_sentence_transformers_as_in_raysent_eval(tmp_path):
    """The mini suite's searched layer-wise attention pooler (results/mini-layeratt-searched/best.yaml: eq8,
    its lr and temperature), trained 6 steps from raw-bert-mini-mlm with real weights: `raysent eval`'s STS-B
    test Spearman equals scipy's on sentence-transformers' vectors of the same folder, to 0.001."""
    import json as jsonlib

    from scipy import stats

    from raysent.data import load

    from conftest import REPO

    summary = raysent.fit(REPO / "results" / "mini-layeratt-searched" / "best.yaml",
                          {"max_steps": 6, "eval_every": 3, "data.max_train_samples": 192, "seed": 1},
                          output_dir=tmp_path / "run")
    best = summary.best_model_dir
    assert summary.best_step > 0  # trained weights, not the untouched encoder
    out = cli_in_process("eval", "--model", best, "--tasks-sts", "stsb", "--format", "json")
    ours = jsonlib.loads(out.stdout)["tasks"]["stsb"]["spearman"]
    model, said = loaded_quietly(best, trust=True)
    assert not [w for w in WARNINGS if w in said.lower()], said
    pairs = load("stsb:test", "scored_pairs")
    a, b = model.encode(pairs.sentence1, batch_size=64), model.encode(pairs.sentence2, batch_size=64)
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    # the same to the third decimal: vectors equal to ~1e-7 reorder a few near-tied cosines, no more
    assert 100 * stats.spearmanr(cos, pairs.scores).statistic == pytest.approx(ours, abs=1e-3)
    want = raysent.load(best).encode(pairs.sentence1[:200])
    assert cosines(model.encode(pairs.sentence1[:200]), want).min() > 1 - 1e-5
    card = (Path(best) / "README.md").read_text()
    assert "Oh et al. 2022" in card and "trust_remote_code=True" in card and "`temperature` | 0.01839" in card
