"""The hub path through the real code, offline: every evaluation set, the training files and a hub model read from
a Hugging Face cache laid out as the hub has them (tests/hub_standins.py says where each layout was read), with
``HF_HUB_OFFLINE=1``, as a cluster whose nodes have no internet reads what was downloaded before."""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from raysent.data import datasets as ds
from raysent.errors import DataError, ModelError

import hub_standins

pytestmark = pytest.mark.shared

DATA = Path(os.environ["RAYSENT_DATA_DIR"])
MODELS = Path(os.environ["RAYSENT_MODEL_DIR"])
EVAL_SETS = ["sts12", "sts13", "sts14", "sts15", "sts16", "stsb:train", "stsb:dev", "stsb:test", "sickr:train",
             "sickr:dev", "sickr:test"]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return hub_standins.hub_cache(tmp_path_factory.mktemp("hub"), DATA, MODELS)


@pytest.fixture
def from_hub(cache, monkeypatch, tmp_path):
    """No RAYSENT_DATA_DIR or RAYSENT_MODEL_DIR: the hub's cache, offline."""
    monkeypatch.delenv("RAYSENT_DATA_DIR", raising=False)
    monkeypatch.delenv("RAYSENT_MODEL_DIR", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets-cache"))
    return cache


def _local(spec: str) -> ds.ScoredPairs:
    old = os.environ.get("RAYSENT_DATA_DIR")
    os.environ["RAYSENT_DATA_DIR"] = str(DATA)
    try:
        return ds.load(spec, "scored_pairs")
    finally:
        if old is None:
            del os.environ["RAYSENT_DATA_DIR"]
        else:
            os.environ["RAYSENT_DATA_DIR"] = old


@pytest.mark.parametrize("spec", EVAL_SETS)
def test_every_evaluation_set_reads_from_senteval_tar_with_the_papers_pairs_and_sub_sets(from_hub, spec):
    hub = ds.load(spec, "scored_pairs")
    local = _local(spec)
    assert hub.source.startswith(f"hf://datasets/{hub_standins.SIMCSE[0]}@{hub_standins.SIMCSE[1]}/senteval.tar/")
    assert len(hub) == len(local) == ds.DATASETS[spec.split(":")[0]].sizes[spec.split(":")[1] if ":" in spec
                                                                           else "test"]
    norm = [" ".join(s.split()) for s in local.sentence1]
    assert hub.sentence1 == norm and hub.sentence2 == [" ".join(s.split()) for s in local.sentence2]
    np.testing.assert_array_equal(hub.scores, local.scores)
    if ds.DATASETS[spec.split(":")[0]].subsets:  # STS12-16: SentEval's sub-set of every pair
        assert hub.subsets == local.subsets and len(set(hub.subsets)) > 2


def test_wmean_and_mean_from_the_hub_are_sentevals_per_sub_set_averages(from_hub):
    """STS14's three aggregations from the hub copy, against scipy on its sub-sets computed here."""
    from raysent.eval.sts import score_pairs

    data = ds.load("sts14", "scored_pairs")
    rng = np.random.default_rng(0)
    vectors = {s: rng.normal(size=8) for s in data.sentences()}
    got = score_pairs(vectors, data)
    a = np.stack([vectors[s] for s in data.sentence1])
    b = np.stack([vectors[s] for s in data.sentence2])
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    subs = np.asarray(data.subsets)
    per = {n: stats.spearmanr(cos[subs == n], data.scores[subs == n]).statistic * 100 for n in dict.fromkeys(subs)}
    sizes = {n: (subs == n).sum() for n in per}
    assert len(per) == 6 and got.spearman_mean == pytest.approx(np.mean(list(per.values())), abs=1e-3)
    assert got.spearman_wmean == pytest.approx(sum(per[n] * sizes[n] for n in per) / len(subs), abs=1e-3)
    assert got.spearman_all == pytest.approx(stats.spearmanr(cos, data.scores).statistic * 100, abs=1e-3)
    assert got.spearman_wmean != pytest.approx(got.spearman_all)


@pytest.mark.parametrize("prefix", ["./", "downstream/"])
def test_the_archive_s_top_folder_is_found_from_its_members(tmp_path, monkeypatch, prefix):
    cache = tmp_path / "hf"
    hub_standins.simcse_repo(cache, DATA, prefix=prefix)
    monkeypatch.delenv("RAYSENT_DATA_DIR", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    assert len(ds.load("sickr:test")) == 4927 and len(ds.load("sts16")) == 1186


def test_a_copy_with_another_release_s_split_is_refused_with_the_reason(tmp_path, monkeypatch):
    """The full SICK release's split (4,439 / 495 / 4,906: what SICK's hub copies hold), not SentEval's."""
    cache = tmp_path / "hf"
    hub_standins.simcse_repo(cache, DATA, sick_splits={"train": slice(0, 4439), "dev": slice(0, 495),
                                                       "test": slice(0, 4906)})
    monkeypatch.delenv("RAYSENT_DATA_DIR", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    with pytest.raises(DataError, match=r"sickr:test has 4,906 pairs, but the papers evaluate on 4,927") as err:
        ds.load("sickr:test")
    assert "senteval.tar/SICK/SICK_test_annotated.txt" in str(err.value)


def test_a_score_out_of_range_in_the_archive_names_the_member_and_the_line(tmp_path, monkeypatch):
    cache = tmp_path / "hf"
    snapshot = hub_standins.simcse_repo(cache, DATA)
    tar = (snapshot / "senteval.tar").resolve()
    members = {}
    with tarfile.open(tar) as t:
        for m in t.getmembers():
            members[m.name] = t.extractfile(m).read()
    gold = members["STS/STS13-en-test/STS.gs.FNWN.txt"].decode().splitlines()
    gold[2] = "6.5"
    members["STS/STS13-en-test/STS.gs.FNWN.txt"] = ("\n".join(gold) + "\n").encode()
    tar.unlink()
    with tarfile.open(tar, "w") as t:
        for name, payload in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            t.addfile(info, __import__("io").BytesIO(payload))
    monkeypatch.delenv("RAYSENT_DATA_DIR", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    with pytest.raises(DataError, match=r"STS13-en-test/STS.gs.FNWN.txt line 3: score 6.5 is outside the allowed "
                                        r"range \[0, 5\]"):
        ds.load("sts13")


def test_gold_scores_all_equal_are_refused_from_a_local_copy_a_users_file_and_the_hub_naming_each(
        tmp_path, monkeypatch):
    """Issue 60: an STS set whose gold scores are all equal makes every Spearman NaN (no checkpoint is ever best). The
    local reader, a user's file read as a dev set and the hub's archive refuse it alike, each naming where it read
    it; so is one sub-set of STS13 (its ``mean`` and ``wmean`` correlate each sub-set)."""
    from raysent.data.readers import refuse_constant_scores

    local = tmp_path / "data"
    (local / "sts" / "STSB").mkdir(parents=True)
    rows = (DATA / "sts" / "STSB" / "dev.tsv").read_text(encoding="utf-8").splitlines()
    flat = "\n".join([rows[0]] + ["2.5\t" + r.split("\t", 1)[1] for r in rows[1:]]) + "\n"
    (local / "sts" / "STSB" / "dev.tsv").write_text(flat, encoding="utf-8")
    (local / "sts" / "STS13").mkdir()
    for sub in ("headlines", "OnWN"):
        (local / "sts" / "STS13" / f"{sub}.tsv").symlink_to(DATA / "sts" / "STS13" / f"{sub}.tsv")
    fnwn = (DATA / "sts" / "STS13" / "FNWN.tsv").read_text(encoding="utf-8").splitlines()
    (local / "sts" / "STS13" / "FNWN.tsv").write_text(
        "\n".join([fnwn[0]] + ["1\t" + r.split("\t", 1)[1] for r in fnwn[1:]]) + "\n", encoding="utf-8")
    monkeypatch.setenv("RAYSENT_DATA_DIR", str(local))
    with pytest.raises(DataError, match=f"^{local / 'sts/STSB/dev.tsv'}: every gold score is 2.5 \\(1,500 pair"):
        ds.load("stsb:dev", "scored_pairs")
    with pytest.raises(DataError, match=f"^{local / 'sts/STS13/FNWN.tsv'}: every gold score is 1 \\(189 pair"):
        ds.load("sts13", "scored_pairs")
    user = ds.load(f"path:{local / 'sts/STSB/dev.tsv'}", "scored_pairs")  # search data may be scored alike
    with pytest.raises(DataError, match=f"^{local / 'sts/STSB/dev.tsv'}: every gold score is 2.5 .*NaN.*a dev set"):
        ds.check_scores_vary(user, "a dev set")
    refuse_constant_scores("x", [1.0, 1.0, 1.5])  # varied: fine

    cache = tmp_path / "hf"  # SentEval's archive made from these two copies: STS-B dev all 2.5, STS13's FNWN all 1
    hub_data = tmp_path / "hub-data"
    (hub_data / "sts").mkdir(parents=True)
    for part in DATA.iterdir():
        if part.name != "sts":
            (hub_data / part.name).symlink_to(part)
    for part in (DATA / "sts").iterdir():
        (hub_data / "sts" / part.name).symlink_to(local / "sts" / part.name if part.name == "STS13" else part)
    (hub_data / "sts" / "STSB").unlink()
    (hub_data / "sts" / "STSB").mkdir()
    for split in ("train", "test"):
        (hub_data / "sts" / "STSB" / f"{split}.tsv").symlink_to(DATA / "sts" / "STSB" / f"{split}.tsv")
    (hub_data / "sts" / "STSB" / "dev.tsv").write_text(flat, encoding="utf-8")
    hub_standins.simcse_repo(cache, hub_data)
    monkeypatch.delenv("RAYSENT_DATA_DIR")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    with pytest.raises(DataError, match=r"senteval.tar/STS/STSBenchmark/sts-dev.csv: every gold score is 2.5 "
                                        r"\(1,500 pair\(s\)\)"):
        ds.load("stsb:dev", "scored_pairs")
    with pytest.raises(DataError, match=r"senteval.tar/STS/STS13-en-test/STS.gs.FNWN.txt: every gold score is 1 "):
        ds.load("sts13", "scored_pairs")
    assert len(ds.load("stsb:test", "scored_pairs")) == 1379  # the other splits of the archive still read


def test_sts17_reads_mtebs_default_config_at_its_pinned_revision_by_lang(from_hub):
    hub = ds.load("sts17:en-en", "scored_pairs")
    local = _local("sts17:en-en")
    assert hub.source == (f"hf://datasets/{hub_standins.STS17[0]}@{hub_standins.STS17[1]}[default:test; "
                          "lang=en-en]")
    assert hub.sentence1 == local.sentence1 and len(hub) == 250
    np.testing.assert_allclose(hub.scores, local.scores)


def test_the_training_files_read_from_simcses_repository(from_hub):
    wiki = ds.load("wiki1m")
    assert wiki.source == f"hf://datasets/{hub_standins.SIMCSE[0]}@{hub_standins.SIMCSE[1]}/wiki1m_for_simcse.txt"
    assert len(wiki) == len(ds.read_lines(next((DATA / "unsup").glob("wiki1m_for_simcse*.txt"))))
    nli = ds.load("nli-triplets")
    assert len(nli) == 3256 and nli.sent0[0] and nli.hard_neg[0]
    unlabeled = ds.load("stsb-unlabeled")  # built from STS-B's three splits, each from the archive
    assert len(unlabeled) == 2 * (5749 + 1500 + 1379)


def test_offline_and_not_in_the_cache_is_one_error_that_says_what_to_download(tmp_path, monkeypatch):
    monkeypatch.delenv("RAYSENT_DATA_DIR", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    with pytest.raises(DataError) as err:
        ds.load("sickr:test")
    msg = str(err.value)
    assert f"{hub_standins.SIMCSE[0]}/senteval.tar at revision {hub_standins.SIMCSE[1]}" in msg
    assert "HF_HUB_OFFLINE is set" in msg and "hf download princeton-nlp/datasets-for-simcse senteval.tar" in msg
    assert "give the machine access" not in msg and "RAYSENT_DATA_DIR is not set" in msg


def test_a_hub_model_in_the_cache_is_found_offline_and_its_commit_recorded(from_hub):
    from raysent.models.encoder import Encoder, check_model

    name, commit = hub_standins.BERT_MINI
    found = check_model(name)
    assert found["source"] == f"hf://{name}@{commit}" and found["layers"] == 4 and found["hidden"] == 256
    enc = Encoder.load(name)
    assert enc.source_id == f"hf://{name}@{commit}"
    with pytest.raises(ModelError, match=r"not found.*HF_HUB_OFFLINE is set.*hf download google/other-model"):
        check_model("google/other-model")


def test_a_hub_model_reads_the_same_weights_as_its_local_copy(from_hub):
    """The stand-in holds raw-bert-mini-mlm's weights as a BertForPreTraining pytorch_model.bin: the hub model's
    embeddings equal the local folder's."""
    import torch

    from raysent.models.encoder import Encoder

    hub = Encoder.load(hub_standins.BERT_MINI[0])
    local = Encoder.load(str(MODELS / "raw-bert-mini-mlm"))
    tok = local.tokenizer(["A man is playing a guitar."], return_tensors="pt")
    with torch.no_grad():
        a = hub.model(**tok).last_hidden_state
        b = local.model(**tok).last_hidden_state
    torch.testing.assert_close(a, b)


def test_raysent_data_download_reads_every_split_from_the_cache_and_names_the_commit(from_hub, monkeypatch):
    from conftest import cli_in_process

    monkeypatch.setenv("RAYSENT_DATA_DIR", str(DATA))  # a local copy exists: --download reads the hub's anyway
    out = cli_in_process("data", "--download", "sickr", "sts17", "--model", hub_standins.BERT_MINI[0]).stdout
    sim = f"hf://datasets/{hub_standins.SIMCSE[0]}@{hub_standins.SIMCSE[1]}/senteval.tar"
    assert f"sickr:test: 4,927 rows from {sim}/SICK/SICK_test_annotated.txt" in out
    assert f"sickr:train: 4,500 rows from {sim}/SICK/SICK_train.txt" in out
    assert "sts17:en-en: 250 rows from hf://datasets/mteb/sts17-crosslingual-sts@" in out
    assert f"model {hub_standins.BERT_MINI[0]}: hf://{hub_standins.BERT_MINI[0]}@{hub_standins.BERT_MINI[1]}" in out
    assert os.environ["RAYSENT_DATA_DIR"] == str(DATA)


@pytest.mark.parametrize("task", ["MR", "CR", "SUBJ", "MPQA", "SST2", "TREC", "MRPC"])
def test_every_senteval_transfer_task_reads_from_the_archive_in_sentevals_order(from_hub, task):
    """SentEval's own files in senteval.tar: SentEval's splits and sizes, the label-1 file first, empty lines left
    out; the same rows as shared/data's copy (SentEval's text)."""
    from raysent.data.transfer import load_task

    hub = load_task(task)
    os.environ["RAYSENT_DATA_DIR"] = str(DATA)
    try:
        local = load_task(task)
    finally:
        del os.environ["RAYSENT_DATA_DIR"]
    assert hub.keys() == local.keys()
    for split, data in hub.items():
        assert data.source.startswith(f"hf://datasets/{hub_standins.SIMCSE[0]}@{hub_standins.SIMCSE[1]}/senteval.tar/")
        np.testing.assert_array_equal(data.labels, local[split].labels)
        assert data.sentences() == [" ".join(s.split()) for s in local[split].sentences()]
