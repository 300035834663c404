"""One-worker training end to end on a raw encoder: improves STS-B dev, checkpoints, reloads,
resumes exactly, and is seeded end to end."""

from __future__ import annotations

import json

import pytest

from raysent.config import load_config, with_overrides
from raysent.train.loop import Stepper
from raysent.train.run import train_in_process

from conftest import RAW_BERT, cli_in_process, run_cli

pytestmark = pytest.mark.shared  # real data and models from ../shared

CONFIG = f"""\
name: simcse-raw
method: simcse-unsup
model:
  name: {RAW_BERT}
data:
  train: sts-unlabeled
  max_train_samples: 1920
train:
  batch_size: 64
  lr: 1.0e-4
  max_steps: 30
  eval_every: 15
  log_every: 10
params:
  pooling: mean
  temperature: 0.05
"""


@pytest.mark.slow
def test_raysent_train_improves_checkpoints_and_reloads(tmp_path):
    cfg_path = tmp_path / "exp.yaml"
    cfg_path.write_text(CONFIG)
    out = tmp_path / "run"
    proc = cli_in_process("train", str(cfg_path), "--output-dir", str(out), "--format", "json")
    summary = json.loads(proc.stdout)
    untuned = summary["initial_dev"]["dev_spearman"]
    best = summary["best_dev_spearman"]
    # the raw MLM-only encoder starts near 48 on STS-B dev with mean pooling; SimCSE lifts it clearly
    assert 45 < untuned < 51
    assert best > untuned + 3
    assert summary["final_step"] == 30 and summary["transductive"] is True
    assert [p["step"] for p in summary["dev_curve"]] == [0, 15, 30]
    assert (out / "checkpoint" / "state.pt").is_file() and (out / "checkpoint" / "best" / "config.json").is_file()
    saved = json.loads((out / "best" / "raysent.json").read_text())
    assert saved["pooling"] == "mean" and saved["method"] == "simcse-unsup"
    # the saved best model, reloaded by `raysent eval`, scores exactly the best dev score
    ev = json.loads(cli_in_process("eval", "--model", str(out / "best"), "--split", "dev", "--format", "json").stdout)
    assert ev["pooling"] == "mean"
    assert ev["dev_spearman"] == pytest.approx(best, abs=1e-6)
    # and any HF tool loads it
    from transformers import AutoModel

    AutoModel.from_pretrained(out / "best")


def _small(tmp_path, name, model, **over):
    cfg_path = tmp_path / "small.yaml"
    cfg_path.write_text(CONFIG)
    cfg = load_config(cfg_path)
    return with_overrides(cfg, {"batch_size": 32, "max_steps": 12, "eval_every": 4, "log_every": 2,
                                "eval_at_start": False, "train.output_dir": str(tmp_path / name),
                                "data.dev": ["sickr:dev"], "data.max_train_samples": 2000, "model.name": model, **over})


def dies_at(step: int):
    """Stepper.step that raises before optimizer step ``step`` (counted from 0), as a crash there would."""
    original = Stepper.step

    def step_or_die(self, batch, at):
        if at == step:
            raise RuntimeError(f"injected failure at step {at} (test of recovery)")
        return original(self, batch, at)
    return step_or_die


@pytest.mark.slow
def test_seeded_and_resumes_exactly_after_a_crash(tiny_bert, tmp_path, monkeypatch):
    # exactness, not learning: the tiny random BERT
    ref = train_in_process(_small(tmp_path, "ref", tiny_bert), quiet=True)
    again = train_in_process(_small(tmp_path, "again", tiny_bert), quiet=True)
    assert again.loss_curve == ref.loss_curve  # same seed, same loss curve
    crashed = _small(tmp_path, "crash", tiny_bert)
    with monkeypatch.context() as m, pytest.raises(RuntimeError, match="injected failure at step 6"):
        m.setattr(Stepper, "step", dies_at(6))
        train_in_process(crashed, quiet=True)
    resumed = train_in_process(crashed, resume=True, quiet=True)
    assert resumed.final_step == 12
    assert resumed.resumed_from == str(crashed.output_dir() / "checkpoint") and ref.resumed_from is None
    assert [c.dev_spearman for c in resumed.dev_curve] == [c.dev_spearman for c in ref.dev_curve]
    assert resumed.best_dev_spearman == ref.best_dev_spearman
    assert resumed.loss_curve == ref.loss_curve
    other_seed = train_in_process(_small(tmp_path, "seed7", tiny_bert, seed=7), quiet=True)
    assert other_seed.loss_curve != ref.loss_curve


def test_a_nan_dev_spearman_before_any_best_is_an_error_naming_the_dev_set(tmp_path, capsys):
    """Issue 60: a NaN dev Spearman never beat -inf, so no checkpoint was ever best: the search reported `dev -inf`
    and the final phase failed on a missing best/ folder. Before any best it is an error naming the dev set and its
    file; after one, the collapse is said and the best kept. (The loop's evaluation step, on an encoder whose every
    vector is the same: nothing trains.)"""
    import math
    from types import SimpleNamespace

    import numpy as np

    from raysent.config import parse_config
    from raysent.data import load
    from raysent.train.loop import NaNDevScoreError, TrainHooks, TrainState, evaluate_and_save, nan_dev_score

    cfg = parse_config({"name": "nan", "method": "baseline", "model": {"name": RAW_BERT},
                        "data": {"dev": "sickr:dev"}, "params": {"pooling": "mean"}})
    run = SimpleNamespace(cfg=cfg, hooks=TrainHooks(tmp_path, quiet=False), dev_sets={"sickr:dev": load("sickr:dev")},
                          embedder=lambda s: np.ones((len(s), 8), dtype=np.float32), phases={"eval_seconds": 0.0})
    state = TrainState(step=4)
    with pytest.warns(Warning), pytest.raises(NaNDevScoreError) as err:
        evaluate_and_save(run, state, None)
    said = str(err.value)
    assert said.startswith("the dev Spearman on sickr:dev ($RAYSENT_DATA_DIR/sts/SICK-R/dev.tsv) is NaN at step 4: "
                           "the model gives every pair of it the same cosine"), said
    assert "no checkpoint can be chosen as the best" in said and "Fix: another pooling" in said
    assert state.dev_curve == [] and not (tmp_path / "best").exists()
    later = TrainState(step=8, best_score=51.0, best_step=4)
    nan_dev_score(run, later, {"dev/sickr:dev": math.nan, "dev_spearman": math.nan})
    assert "WARNING: the dev Spearman on sickr:dev" in capsys.readouterr().err


@pytest.mark.slow
def test_a_pooling_that_reads_one_vector_for_every_sentence_stops_the_run_with_the_reason(tmp_path):
    """layer0_cls (the baseline's grid has it) reads the embedding layer's [CLS]: the same vector for every sentence,
    every cosine 1, the dev Spearman NaN at step 0. The run stops there, naming the dev set."""
    from raysent.config import parse_config
    from raysent.train.loop import NaNDevScoreError

    cfg = parse_config({"name": "layer0", "method": "baseline", "model": {"name": RAW_BERT},
                        "data": {"train": "sickr:dev", "dev": "sickr:dev"}, "params": {"pooling": "layer0_cls"},
                        "train": {"output_dir": str(tmp_path / "run")}, "tracking": {"results_dir": str(tmp_path)}})
    with pytest.raises(NaNDevScoreError, match=r"the dev Spearman on sickr:dev \(.*SICK-R/dev.tsv\) is NaN at step 0"):
        train_in_process(cfg, quiet=True)
    assert not (tmp_path / "run" / "best").exists()


def test_help_of_every_command():
    for args in (["--help"], ["train", "--help"], ["eval", "--help"], ["methods", "--help"], ["data", "--help"]):
        out = run_cli(*args).stdout
        assert "usage: raysent" in out
    assert "RAYSENT_DATA_DIR" in run_cli("--help").stdout


def test_methods_lists_every_registered_method_with_defaults():
    from raysent.methods import METHODS

    rows = json.loads(run_cli("methods", "--format", "json").stdout)
    assert [r["method"] for r in rows] == list(METHODS)
    simcse = next(r for r in rows if r["method"] == "simcse-unsup")
    assert simcse["params"]["temperature"] == 0.05 and simcse["train"]["batch_size"] == 64
    assert "Gao" in simcse["paper"]
