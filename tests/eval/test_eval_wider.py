"""Wider evaluation (SentEval transfer, semantic search, geometry, STS17, the suite and its CLI),
each checked against an independent computation: scikit-learn run directly with SentEval's folds,
brute-force numpy ranking, the formulas of Wang & Isola (2020) written out in torch, and scipy.

Real data (../shared/data) and a real encoder (paraphrase-MiniLM-L3-v2, mean pooling); sizes are
capped where the full task would take minutes on a 2-core CPU.
"""

from __future__ import annotations

import csv
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import f1_score
from sklearn.model_selection import StratifiedKFold

from raysent.errors import ConfigError, DataError, RaysentError

from conftest import PARAPHRASE, run_cli

pytestmark = pytest.mark.shared  # real data and models from ../shared

DATA = Path(os.environ["RAYSENT_DATA_DIR"])


def read_tsv(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as fh:
        return list(csv.DictReader(fh, delimiter="\t", quoting=csv.QUOTE_NONE))


def unit(x) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.fixture(scope="module")
def encode():
    """paraphrase-MiniLM-L3-v2 (mean pooling) behind one cache, shared by every test here.

    One torch thread: on a busy 2-core machine it is several times faster than two.
    """
    from raysent.eval.suite import EmbeddingCache, make_encode
    from raysent.models.encoder import Encoder

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield EmbeddingCache(make_encode(Encoder.load(PARAPHRASE), pooling="mean"))
    finally:
        torch.set_num_threads(before)


# --------------------------------------------------------------------------- SentEval
def senteval_sorted(rows: list[dict], key) -> list[dict]:
    """SentEval's order: the file order, stably sorted by (tokens, label)."""
    return sorted(rows, key=key)


def test_senteval_cr_nested_cv_matches_sklearn_with_senteval_folds(encode):
    from raysent.eval.senteval import evaluate_senteval

    res = evaluate_senteval(encode, ["CR"], kfold=5, max_samples=500)
    cr = res.tasks["CR"]

    # independently: the file, one row in ceil(n / 500), SentEval's sort, SentEval's nested CV
    rows = read_tsv(DATA / "senteval/CR.tsv")
    rows = rows[:: math.ceil(len(rows) / 500)]
    rows = senteval_sorted(rows, key=lambda r: (len(r["sentence"].split()), int(r["label"])))
    X = encode([r["sentence"] for r in rows])
    y = np.array([int(r["label"]) for r in rows])
    Cs = [0.25, 0.5, 1, 2, 4, 8]  # SentEval: [2**t for t in range(-2, 4)]
    devs, tests, chosen = [], [], []
    for tr, te in StratifiedKFold(n_splits=5, shuffle=True, random_state=1111).split(X, y):
        Xtr, ytr = X[tr], y[tr]
        inner = list(StratifiedKFold(n_splits=5, shuffle=True, random_state=1111).split(Xtr, ytr))
        scores = [round(100 * np.mean([LogisticRegression(C=C, random_state=1111).fit(Xtr[a], ytr[a]).score(Xtr[b], ytr[b])
                                       for a, b in inner]), 2) for C in Cs]
        best = int(np.argmax(scores))
        devs.append(scores[best])
        chosen.append(Cs[best])
        clf = LogisticRegression(C=Cs[best], random_state=1111).fit(Xtr, ytr)
        tests.append(round(100 * clf.score(X[te], y[te]), 2))

    assert cr.ntest == len(rows) == 472  # one row in ceil(3771 / 500) = 8
    assert cr.regs == chosen
    assert cr.fold_acc == tests
    assert cr.acc == pytest.approx(round(float(np.mean(tests)), 2), abs=1e-9)
    assert cr.devacc == pytest.approx(round(float(np.mean(devs)), 2), abs=1e-9)
    assert cr.fits == 5 * (6 * 5 + 1)
    assert 65.0 < cr.acc < 95.0  # a paraphrase model separates review polarity well above chance
    assert res.avg == cr.acc and "subset" in " ".join(res.notes)
    assert res.primary_metric == "senteval/avg" and res.primary_score == res.metrics()["senteval/avg"] == cr.acc


def test_senteval_mrpc_kfold_on_pair_features_matches_sklearn(encode):
    from raysent.eval.senteval import evaluate_senteval

    res = evaluate_senteval(encode, ["MRPC"], kfold=5, max_samples=300).tasks["MRPC"]

    def load(split):
        rows = read_tsv(DATA / f"senteval/MRPC/{split}.tsv")
        rows = rows[:: math.ceil(len(rows) / 300)]
        rows = senteval_sorted(rows, key=lambda r: (len(r["sentence1"].split()), len(r["sentence2"].split()),
                                                    int(r["label"])))
        u, v = encode([r["sentence1"] for r in rows]), encode([r["sentence2"] for r in rows])
        return np.c_[np.abs(u - v), u * v], np.array([int(r["label"]) for r in rows])  # SentEval's mrpc.py

    Xtr, ytr = load("train")
    Xte, yte = load("test")
    Cs = [0.5, 1, 2, 4, 8, 16, 32]  # SentEval's KFoldClassifier: [2**t for t in range(-1, 6)]
    folds = list(StratifiedKFold(n_splits=5, shuffle=True, random_state=1111).split(Xtr, ytr))
    scores = [round(100 * np.mean([LogisticRegression(C=C, random_state=1111).fit(Xtr[a], ytr[a]).score(Xtr[b], ytr[b])
                                   for a, b in folds]), 2) for C in Cs]
    best = int(np.argmax(scores))
    clf = LogisticRegression(C=Cs[best], random_state=1111).fit(Xtr, ytr)
    yhat = clf.predict(Xte)

    assert res.features == 2 * 384 and res.mrpc_features == "senteval"
    assert res.reg == Cs[best]
    assert res.scores == scores
    assert res.devacc == pytest.approx(max(scores), abs=1e-9)
    assert res.acc == pytest.approx(round(100 * clf.score(Xte, yte), 2), abs=1e-9)
    assert res.f1 == pytest.approx(round(100 * f1_score(yte, yhat), 2), abs=1e-9)
    assert (res.ndev, res.ntest) == (len(ytr), len(yte))


def test_senteval_mlp_probe_learns_and_is_deterministic(encode):
    from raysent.eval.senteval import ProbeConfig, SentEvalMLP, kfold

    rows = read_tsv(DATA / "senteval/TREC/train.tsv")[::10]
    labels = ("ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM")
    X = encode([r["sentence"] for r in rows])
    y = np.array([labels.index(r["label"]) for r in rows])
    cfg = ProbeConfig(classifier="mlp", nhid=50, kfold=2)
    res = kfold(X[::2], y[::2], X[1::2], y[1::2], cfg, nclasses=6)
    assert res["reg"] in [1e-5, 1e-4, 1e-3, 1e-2]  # SentEval's weight-decay grid for the MLP
    assert res["acc"] > 35.0  # the largest class is 24% of the rows
    fits = [SentEvalMLP(cfg, 384, 6, l2reg=1e-4) for _ in range(2)]
    accs = [f.fit(X[::2], y[::2], validation_data=(X[1::2], y[1::2])) for f in fits]
    assert accs[0] == accs[1] and np.array_equal(fits[0].predict(X), fits[1].predict(X))  # seeded, locally


# --------------------------------------------------------------------------- search
def test_search_mrr_and_recall_match_brute_force_numpy(encode):
    from raysent.eval.retrieval import evaluate_search

    res = evaluate_search(encode, data="stsb:test")

    rows = read_tsv(DATA / "sts/STSB/test.tsv")
    corpus = list(dict.fromkeys(r["sentence2"] for r in rows))
    doc = {s: i for i, s in enumerate(corpus)}
    relevant: dict[str, set[int]] = {}
    for r in rows:
        if float(r["score"]) >= 4.0:
            relevant.setdefault(r["sentence1"], set()).add(doc[r["sentence2"]])
    queries = list(relevant)
    sims = unit(encode(queries)) @ unit(encode(corpus)).T
    for i, q in enumerate(queries):  # the query's own text is no answer unless it is relevant
        if q in doc and doc[q] not in relevant[q]:
            sims[i, doc[q]] = -np.inf
    top = np.argsort(-sims, axis=1, kind="stable")[:, :10]
    mrr = np.mean([next((1 / (r + 1) for r, d in enumerate(row) if d in relevant[q]), 0.0)
                   for row, q in zip(top, queries)])
    recall = {k: np.mean([len(relevant[q] & set(row[:k].tolist())) / len(relevant[q]) for row, q in zip(top, queries)])
              for k in (1, 5, 10)}

    assert (res.queries, res.corpus) == (len(queries), len(corpus)) == (309, 1337)
    assert res.mrr_k == 10 and res.mrr == pytest.approx(mrr, abs=1e-12)
    for k, want in recall.items():
        assert res.recall[k] == pytest.approx(want, abs=1e-12)
    assert res.recall[1] <= res.recall[5] <= res.recall[10] <= 1.0
    assert res.ms_per_query > 0 and res.index_mb == pytest.approx(1337 * 384 * 4 / 2 ** 20, rel=0.01)
    assert res.excluded_self_matches == 12
    assert res.primary_metric == "search/mrr_at_10" and res.metrics()["search/recall_at_5"] == res.recall[5]


def test_rank_metrics_on_a_hand_made_ranking():
    from raysent.eval.retrieval import rank_metrics

    ranked = np.array([[5, 1, 2, -1], [0, 3, 4, 9], [7, 8, 6, 2]])
    relevant = [{1}, {4, 9}, {0}]
    m = rank_metrics(ranked, relevant, ks=(1, 3), mrr_k=4)
    assert m["mrr_at_4"] == pytest.approx((1 / 2 + 1 / 3 + 0) / 3)
    assert m["recall_at_1"] == 0.0
    assert m["recall_at_3"] == pytest.approx((1 + 0.5 + 0) / 3)


# --------------------------------------------------------------------------- geometry
def test_alignment_uniformity_and_spectrum_match_their_formulas():
    from raysent.eval.geometry import alignment, spectrum, uniformity

    g = torch.Generator().manual_seed(0)
    x = torch.randn(9, 5, generator=g, dtype=torch.float64)
    y = x + 0.3 * torch.randn(9, 5, generator=g, dtype=torch.float64)
    xn, yn = torch.nn.functional.normalize(x, dim=1), torch.nn.functional.normalize(y, dim=1)
    # Wang & Isola (2020): align = E ||f(x) - f(x+)||^2 ; uniform = log E exp(-2 ||f(x) - f(y)||^2)
    want_align = (xn - yn).norm(dim=1).pow(2).mean().item()
    want_uniform = torch.pdist(xn, p=2).pow(2).mul(-2).exp().mean().log().item()
    assert alignment(x.numpy(), y.numpy()) == pytest.approx(want_align, abs=1e-12)
    assert uniformity(x.numpy()) == pytest.approx(want_uniform, abs=1e-12)
    assert uniformity(x.numpy(), chunk=2) == pytest.approx(want_uniform, abs=1e-12)  # chunked == whole
    # written out pair by pair
    pairs = [np.exp(-2 * np.sum((xn[i].numpy() - xn[j].numpy()) ** 2)) for i in range(9) for j in range(i + 1, 9)]
    assert uniformity(x.numpy()) == pytest.approx(np.log(np.mean(pairs)), abs=1e-12)

    s = torch.linalg.svdvals(xn)
    spec = spectrum(x.numpy())
    assert spec["singular_values"] == pytest.approx((s / s[0]).tolist(), abs=1e-12)
    p = s / s.sum()
    assert spec["effective_rank"] == pytest.approx(torch.exp(-(p * p.log()).sum()).item(), abs=1e-12)
    # collapse: every embedding the same direction -> rank 1, uniformity 0 (the worst)
    same = np.tile(np.array([[1.0, 2.0, 3.0]]), (6, 1)) * np.arange(1, 7)[:, None]
    assert spectrum(same)["effective_rank"] == pytest.approx(1.0, abs=1e-6)
    assert uniformity(same) == pytest.approx(0.0, abs=1e-12)


def test_geometry_on_stsb_uses_pairs_scored_4_or_more(encode):
    from raysent.eval.geometry import evaluate_geometry

    res = evaluate_geometry(encode, data="stsb:test")
    rows = read_tsv(DATA / "sts/STSB/test.tsv")
    pos = [r for r in rows if float(r["score"]) >= 4.0]
    a, b = unit(encode([r["sentence1"] for r in pos])), unit(encode([r["sentence2"] for r in pos]))
    assert res.positive_pairs == len(pos) == 338
    assert res.alignment == pytest.approx(np.mean(np.sum((a - b) ** 2, axis=1)), abs=1e-9)
    assert res.sentences == len({s for r in rows for s in (r["sentence1"], r["sentence2"])})
    assert -4.0 < res.uniformity < 0.0 and 1.0 < res.effective_rank <= 384


# --------------------------------------------------------------------------- STS17
def test_sts17_pearson_matches_scipy_on_real_tracks(encode):
    from raysent.eval.sts17 import evaluate_sts17

    res = evaluate_sts17(encode, tracks=["en-en", "es-es"])
    for track in ("en-en", "es-es"):
        rows = read_tsv(DATA / f"sts/STS17/{track}.tsv")
        gold = np.array([float(r["score"]) for r in rows])
        cos = (unit(encode([r["sentence1"] for r in rows])) * unit(encode([r["sentence2"] for r in rows]))).sum(1)
        assert res.tracks[track].n == 250
        assert res.tracks[track].pearson == pytest.approx(100 * stats.pearsonr(cos, gold).statistic, abs=1e-9)
        assert res.tracks[track].spearman == pytest.approx(100 * stats.spearmanr(cos, gold).statistic, abs=1e-9)
    assert res.avg == pytest.approx((res.tracks["en-en"].pearson + res.tracks["es-es"].pearson) / 2)
    assert res.tracks["en-en"].pearson > 70  # an English paraphrase model on English STS


# --------------------------------------------------------------------------- the suite
def test_suite_flat_metrics_one_cache_and_table(encode):
    from raysent.eval.suite import evaluate_tasks

    seen: list[str] = []

    def spy(sentences):
        seen.extend(sentences)
        return encode(sentences)  # cached by the fixture: cheap

    res = evaluate_tasks(spy, "search,geometry,sts17", options={"sts17": {"tracks": ["en-en"]}})
    assert len(seen) == len(set(seen))  # every distinct sentence embedded once across the tasks
    m = res.metrics()
    for key in ("search/mrr_at_10", "search/recall_at_1", "search/recall_at_5", "search/recall_at_10",
                "search/ms_per_query", "search/index_mb", "geometry/alignment", "geometry/uniformity",
                "geometry/effective_rank", "sts17/en-en", "sts17/en-en/spearman", "sts17/avg"):
        assert key in m and np.isfinite(m[key]), key
    assert res.search is not None and m["search/mrr_at_10"] == res.search.mrr
    assert res.tasks == ["search", "geometry", "sts17"] and res.primary_metric == "search/mrr_at_10"
    assert all(set(k) <= set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./: ") for k in m)
    for head in ("MRR@10", "R@5", "align", "uniform", "en-en"):
        assert head in res.table()


def test_suite_sts_task_is_the_sts_evaluator():
    from raysent.eval.sts import evaluate_sts
    from raysent.eval.suite import evaluate_tasks

    def bag_of_words(sentences):
        out = np.zeros((len(sentences), 64), dtype=np.float32)
        for i, s in enumerate(sentences):
            for w in s.lower().split():
                out[i, hash(w) % 64] += 1.0
            out[i, 0] += 1e-3
        return out

    res = evaluate_tasks(bag_of_words, ["sts"], options={"sts": {"tasks": ["stsb", "sts13"], "aggregation": "wmean"}})
    want = evaluate_sts(bag_of_words, tasks=["stsb", "sts13"], aggregation="wmean")
    assert res.metrics()["sts/stsb"] == want.tasks["stsb"].spearman
    assert res.metrics()["sts/sts13"] == want.tasks["sts13"].spearman_wmean
    assert res.metrics()["sts/avg"] == want.avg == res.sts.primary_score


# --------------------------------------------------------------------------- errors
def test_unknown_task_names_the_field_and_allowed_values(tmp_path):
    from raysent.config import load_config
    from raysent.eval.suite import evaluate_tasks

    with pytest.raises(RaysentError) as info:
        evaluate_tasks(lambda s: np.ones((len(s), 2)), ["sts", "senteveal"])
    msg = str(info.value)
    assert "'senteveal'" in msg and "did you mean 'senteval'" in msg
    assert "allowed: sts, senteval, search, geometry, sts17" in msg

    cfg = tmp_path / "exp.yaml"
    cfg.write_text("name: x\nmethod: simcse-unsup\nmodel:\n  name: raw-bert-mini-mlm\neval:\n  tasks: sts,serch\n")
    with pytest.raises(ConfigError) as info:
        load_config(cfg)
    msg = str(info.value)
    assert "exp.yaml:6" in msg and "eval.tasks.1" in msg and "'serch'" in msg and "did you mean 'search'" in msg
    assert "'sts', 'senteval', 'search', 'geometry', 'sts17'" in msg
    cfg.write_text("name: x\nmethod: simcse-unsup\nmodel:\n  name: raw-bert-mini-mlm\neval:\n  tasks: sts,geometry\n")
    assert load_config(cfg).eval.tasks == ["sts", "geometry"]

    with pytest.raises(RaysentError) as info:
        evaluate_tasks(lambda s: np.ones((len(s), 2)), ["search"], options={"search": {"top_k": 3}})
    assert "unknown option 'top_k' for the search task" in str(info.value) and "min_score" in str(info.value)
    with pytest.raises(DataError) as info:
        from raysent.data.transfer import get_task

        get_task("MRR")
    assert "did you mean 'MR'" in str(info.value) and "MR, CR, SUBJ, MPQA, SST2, TREC, MRPC" in str(info.value)


def test_missing_data_folder_names_raysent_data_dir_and_the_hub(tmp_path, monkeypatch):
    from raysent.eval.senteval import evaluate_senteval
    from raysent.eval.sts17 import evaluate_sts17

    never = lambda s: pytest.fail("nothing may be embedded when the data is missing")  # noqa: E731
    monkeypatch.setenv("RAYSENT_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub-cache"))
    for task in ("MR", "SST2"):  # every task: SentEval's own files in SimCSE's senteval.tar
        with pytest.raises(DataError) as info:
            evaluate_senteval(never, [task])
        msg = str(info.value)
        assert str(tmp_path / "senteval") in msg and "RAYSENT_DATA_DIR" in msg
        assert "princeton-nlp/datasets-for-simcse/senteval.tar" in msg and "HF_HUB_OFFLINE is set" in msg
        assert "hf download princeton-nlp/datasets-for-simcse senteval.tar" in msg
    with pytest.raises(DataError) as info:
        evaluate_sts17(never, ["es-es"])
    assert "RAYSENT_DATA_DIR" in str(info.value) and "mteb/sts17-crosslingual-sts" in str(info.value)
    monkeypatch.delenv("RAYSENT_DATA_DIR")
    with pytest.raises(DataError) as info:
        evaluate_senteval(never, ["TREC"])
    assert "RAYSENT_DATA_DIR is not set" in str(info.value) and "senteval.tar" in str(info.value)


# --------------------------------------------------------------------------- CLI
def test_cli_eval_geometry_and_sts17_json(capsys):
    # in this process (the command's own code path; a subprocess spent 7 of its 11 s importing torch and
    # transformers again), its --threads undone after
    from raysent.cli import main

    threads = torch.get_num_threads()
    try:
        assert main(["eval", "--model", PARAPHRASE, "--pooling", "mean", "--tasks", "geometry,sts17",
                     "--max-samples", "40", "--threads", "1", "--format", "json"]) == 0
    finally:
        torch.set_num_threads(threads)
    res = json.loads(capsys.readouterr().out)
    assert res["tasks"] == ["geometry", "sts17"] and res["pooling"] == "mean"
    tracks = ["ar-ar", "ar-en", "es-es", "es-en.track4a", "es-en.track4b", "en-en"]
    want = {"geometry/alignment", "geometry/uniformity", "geometry/effective_rank", "geometry/top1_energy",
            "sts17/avg", "sts17/avg/spearman"} | {f"sts17/{t}" for t in tracks} | {f"sts17/{t}/spearman" for t in tracks}
    assert set(res["metrics"]) == want
    assert all(np.isfinite(v) for v in res["metrics"].values())
    assert any("max_samples" in n for n in res["notes"])  # a capped run says so

    bad = run_cli("eval", "--model", PARAPHRASE, "--tasks", "sts,glue", check=False)
    assert bad.returncode == 2 and "unknown evaluation task 'glue'" in bad.stderr
    assert "allowed: sts, senteval, search, geometry, sts17" in bad.stderr and "Traceback" not in bad.stderr
