"""docs/python-api.md's example, run as shown: search, load, evaluate and fit from Python, and what they return
against what the command line and sentence-transformers give for the same model."""

from __future__ import annotations

import re

import numpy as np
import pytest

import raysent

from conftest import REPO

pytestmark = [pytest.mark.slow, pytest.mark.shared]


def example() -> str:
    text = (REPO / "docs" / "python-api.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, "docs/python-api.md has no python example"
    return blocks[0]


def test_the_documented_example_runs_as_shown(ray_cluster, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # its results/ go here
    namespace: dict = {}
    exec(compile(example(), "docs/python-api.md", "exec"), namespace)
    result, model, scores, one = (namespace[k] for k in ("result", "model", "scores", "one"))
    printed = capsys.readouterr().out
    assert str(result.best_hp) in printed and "(2, 256)" in printed
    # quiet (the default) is quiet: no Tune status tables, no progress; the one line it prints says per arm how
    # many runs learned nothing, as the page's comment quotes it, and the example's runs learn
    assert len(printed.splitlines()) < 40, printed
    assert printed.splitlines()[0] == result.learning
    assert f"# \"{result.learning}\"" in example()
    assert all(k == 0 for k, _ in result.not_learned.values()), result.learning
    for column in ("stsb_mean", "stsb_std", "sts16_mean", "sts16_std"):  # the selection printed whole
        assert column in printed

    from raysent.train.records import RunRecord

    # the result: the winner, its table, every record typed, MLflow's parent run and registered model
    assert result.best_hp["lr"] in (1e-4, 3e-4)
    assert all(isinstance(r, RunRecord) for r in result.records)
    assert sorted((r.phase, r.seed) for r in result.records if r.config_id == result.summary.best.config_id) \
        == [("final", 1), ("final", 2), ("search", 1)]
    # the search trained the winner on seed 1 as the final phase would: that run is evaluated, not trained again
    by = {(r.phase, r.seed): r for r in result.records if r.config_id == result.summary.best.config_id}
    assert by[("final", 1)].trained_in == by[("search", 1)].filename and by[("final", 2)].trained_in is None
    assert by[("final", 1)].dev_curve == by[("search", 1)].dev_curve and by[("final", 1)].scores
    winner = result.table[result.table["row"].str.contains("searched best")]
    assert len(winner) == 1
    assert winner["stsb_mean"].iloc[0] == pytest.approx(result.summary.final.scores["sts/stsb"].mean)
    assert result.mlflow_run_id and result.registered_model == "models:/notebook-demo/1"
    assert result.best_model_path.is_dir() and (result.best_model_path / "README.md").is_file()

    # load: the vectors `raysent eval` scores with, and sentence-transformers' and MLflow's for the same model
    import mlflow
    from scipy import stats
    from sentence_transformers import SentenceTransformer

    from raysent.data import load as load_data

    pairs = load_data("stsb:test", "scored_pairs")
    a, b = model.encode(pairs.sentence1), model.encode(pairs.sentence2)
    ours = stats.spearmanr((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1), pairs.scores)
    assert scores.metrics["sts/stsb"] == pytest.approx(100 * ours.statistic, abs=1e-3)  # other batches: ~1e-7
    st = SentenceTransformer(str(result.best_model_path), device="cpu")
    sentences = list(pairs.sentence1[:64])
    from raysent.tracking import fluent

    with fluent(f"sqlite:///{result.results_dir.parent / 'mlflow.db'}"):
        logged = mlflow.sentence_transformers.load_model(result.registered_model)
    for other in (st, logged):
        got, want = other.encode(sentences), model.encode(sentences)
        assert ((got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)).min() > 1 - 1e-5

    # fit: one run where it was told, its best model loadable the same way
    assert one.seed == 3 and one.best_model_dir.endswith("one-run/best")
    assert raysent.load(one.best_model_dir).encode("a sentence").shape == (256,)
