"""Offline stand-ins of the Hugging Face hub repositories raysent reads, laid out in a Hugging Face cache as the hub
and huggingface_hub lay them out, so that the real code (``hf_hub_download``, ``snapshot_download``,
``try_to_load_from_cache``, ``datasets.load_dataset`` on a snapshot) reads them with ``HF_HUB_OFFLINE=1``.

The cache (huggingface_hub's "Manage the cache" guide, https://huggingface.co/docs/huggingface_hub/guides/manage-cache):
``<cache>/<type>s--<org>--<name>/blobs/<sha256>``, ``snapshots/<commit>/<path>`` a relative symlink to the blob,
``refs/main`` holding the commit.

Each repository, and where its layout was read:

* ``datasets/princeton-nlp/datasets-for-simcse`` at ``e145e8bb…`` (its tree, huggingface.co/datasets/princeton-nlp/
  datasets-for-simcse/tree/e145e8bb659b2aa2669f32ef79cb4cdef6c58fef: ``senteval.tar``, ``wiki1m_for_simcse.txt``,
  ``nli_for_simcse.csv``). ``senteval.tar`` inside: SentEval's ``data/downstream`` layout as SimCSE's
  ``SentEval/data/downstream/download_dataset.sh``, SentEval's ``senteval/engine.py`` and ``senteval/sts.py``,
  ``senteval/sick.py`` and ``data/downstream/get_transfer_data.bash`` give it (raysent/data/senteval_archive.py lists
  each file and column). Its pairs are ../shared/data's (the organisers' text, which SentEval's copy holds
  Moses-tokenized), with one unscored pair per STS year (an empty gold line, as SentEval's STS15-16 files have) and
  one STS-B line with extra trailing fields (as the original sts-*.csv files have). ``nli_for_simcse.csv``: SimCSE's
  header ``sent0,sent1,hard_neg`` (SimCSE's train.py reads those columns). The archive's top folder is not known
  here: ``prefix`` lays it out under one, and the reader finds it.
* ``datasets/mteb/sts17-crosslingual-sts`` at ``faeb7627…``, the revision mteb 2.26 pins: its tree (huggingface.co/
  datasets/mteb/sts17-crosslingual-sts/tree/faeb762787bd10488a50c8b5be4a3b82e411949c) is ``README.md`` and
  ``test/``; mteb's ``AbsTask.fast_load`` reads it as one ``default`` config whose rows carry a ``lang`` column.
  The file name under ``test/`` and the README's ``configs:`` block are not known here: the stand-in uses
  ``test/0000.parquet`` (the name mteb's "fast loading" commit gave sts22's files) and a standard ``configs:``
  block; the reader goes through datasets' own resolution, which reads either.
* ``google/bert_uncased_L-4_H-256_A-4`` at ``e202cd79…`` (its tree, huggingface.co/google/bert_uncased_L-4_H-256_A-4/
  tree/e202cd790ed869c2af754c3ce19de62ccb3d5f26: ``config.json``, ``vocab.txt``, ``pytorch_model.bin``,
  ``bert_model.ckpt.*``, no safetensors, no tokenizer config). The stand-in holds raw-bert-mini-mlm's weights (the
  same shape: 4 layers, hidden 256, 4 heads) saved as a ``BertForPreTraining``-style ``pytorch_model.bin``
  (``bert.``-prefixed names), that model's ``vocab.txt``, and a config of BERT's keys; the TensorFlow checkpoint is
  left out (raysent never reads it).
"""

from __future__ import annotations

import csv
import hashlib
import io
import os
import tarfile
from pathlib import Path

SIMCSE = ("princeton-nlp/datasets-for-simcse", "e145e8bb659b2aa2669f32ef79cb4cdef6c58fef")
STS17 = ("mteb/sts17-crosslingual-sts", "faeb762787bd10488a50c8b5be4a3b82e411949c")
BERT_MINI = ("google/bert_uncased_L-4_H-256_A-4", "e202cd790ed869c2af754c3ce19de62ccb3d5f26")

STS_SUBSETS = {
    "STS12": ["MSRpar", "MSRvid", "SMTeuroparl", "surprise.OnWN", "surprise.SMTnews"],
    "STS13": ["FNWN", "headlines", "OnWN"],
    "STS14": ["deft-forum", "deft-news", "headlines", "images", "OnWN", "tweet-news"],
    "STS15": ["answers-forums", "answers-students", "belief", "headlines", "images"],
    "STS16": ["answer-answer", "headlines", "plagiarism", "postediting", "question-question"],
}


def put(cache: Path, repo_type: str, repo: str, commit: str, files: dict[str, bytes]) -> Path:
    """Lay ``files`` (path in the repository -> bytes) out as huggingface_hub caches them; the snapshot folder."""
    root = cache / f"{repo_type}s--{repo.replace('/', '--')}"
    blobs, snapshot = root / "blobs", root / "snapshots" / commit
    blobs.mkdir(parents=True, exist_ok=True)
    for rel, data in files.items():
        blob = blobs / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        link = snapshot / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(os.path.relpath(blob, link.parent))
    (root / "refs").mkdir(exist_ok=True)
    (root / "refs" / "main").write_text(commit)
    return snapshot


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(encoding="utf-8", newline="") as fh:
        return list(csv.DictReader(fh, delimiter="\t", quoting=csv.QUOTE_NONE))


def senteval_tar(data: Path, prefix: str = "", sick_splits: dict[str, slice] | None = None) -> bytes:
    """SentEval's STS and SICK files of ``senteval.tar``, made from ``data`` (../shared/data) under ``prefix``.
    ``sick_splits`` keeps a slice of each SICK split (a stand-in of another release's split sizes)."""
    files: dict[str, str] = {}
    for year, subsets in STS_SUBSETS.items():
        for i, sub in enumerate(subsets):
            rows = _rows(data / "sts" / year / f"{sub}.tsv")
            inputs = [f"{r['sentence1']}\t{r['sentence2']}" for r in rows]
            gold = [r["score"] for r in rows]
            if i == 0:  # a pair without a gold score: SentEval leaves it out
                inputs.insert(1, "An unscored first sentence .\tAn unscored second sentence .")
                gold.insert(1, "")
            files[f"STS/{year}-en-test/STS.input.{sub}.txt"] = "\n".join(inputs) + "\n"
            files[f"STS/{year}-en-test/STS.gs.{sub}.txt"] = "\n".join(gold) + "\n"
    for split in ("train", "dev", "test"):
        rows = _rows(data / "sts" / "STSB" / f"{split}.tsv")
        lines = [f"main-captions\tMSRvid\t2012test\t{i:04d}\t{r['score']}\t{r['sentence1']}\t{r['sentence2']}"
                 for i, r in enumerate(rows)]
        lines[0] += "\tsource-a\tsource-b"  # some lines of the original files carry more fields
        files[f"STS/STSBenchmark/sts-{split}.csv"] = "\n".join(lines) + "\n"
    header = "pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment"
    for split, name in (("train", "SICK_train"), ("dev", "SICK_trial"), ("test", "SICK_test_annotated")):
        rows = _rows(data / "sts" / "SICK-R" / f"{split}.tsv")
        if sick_splits:
            rows = rows[sick_splits[split]]
        lines = [header] + [f"{i + 1}\t{r['sentence1']}\t{r['sentence2']}\t{r['score']}\tNEUTRAL"
                            for i, r in enumerate(rows)]
        files[f"SICK/{name}.txt"] = "\n".join(lines) + "\n"
    files.update(transfer_files(data))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for rel, text in sorted(files.items()):
            payload = text.encode("latin-1" if rel.split("/")[0] in LATIN1 else "utf-8")
            info = tarfile.TarInfo(prefix + rel)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    return buf.getvalue()


LATIN1 = ("MR", "CR", "SUBJ", "MPQA", "TREC")  # SentEval reads these as latin-1


def transfer_files(data: Path) -> dict[str, str]:
    """SentEval's transfer-task files, as its data/downstream/get_transfer_data.bash leaves them and its loaders
    read them, made from ../shared/data/senteval (SentEval's own text): MR/CR/SUBJ/MPQA a file per label; SST-2
    ``sentence<TAB>label``; TREC ``LABEL:fine question`` (the fine label is not in shared/data: ``x`` stands for
    it); MRPC's header and five fields. CR gets back two of the empty lines its source has."""
    out: dict[str, str] = {}
    binary = {"MR": ("rt-polarity.pos", "rt-polarity.neg"), "CR": ("custrev.pos", "custrev.neg"),
              "SUBJ": ("subj.objective", "subj.subjective"), "MPQA": ("mpqa.pos", "mpqa.neg")}
    for task, (one, zero) in binary.items():
        rows = _rows(data / "senteval" / f"{task}.tsv")
        ones = [r["sentence"] for r in rows if r["label"] == "1"]
        zeros = [r["sentence"] for r in rows if r["label"] == "0"]
        if task == "CR":
            ones.insert(3, "")
            zeros.insert(0, "")
        out[f"{task}/{one}"] = "\n".join(ones) + "\n"
        out[f"{task}/{zero}"] = "\n".join(zeros) + "\n"
    for split in ("train", "dev", "test"):
        rows = _rows(data / "senteval" / "SST2" / f"{split}.tsv")
        out[f"SST/binary/sentiment-{split}"] = "".join(f"{r['sentence']}\t{r['label']}\n" for r in rows)
    for split, name in (("train", "train_5500.label"), ("test", "TREC_10.label")):
        rows = _rows(data / "senteval" / "TREC" / f"{split}.tsv")
        out[f"TREC/{name}"] = "".join(f"{r['label']}:x {r['sentence']}\n" for r in rows)
    for split in ("train", "test"):
        rows = _rows(data / "senteval" / "MRPC" / f"{split}.tsv")
        out[f"MRPC/msr_paraphrase_{split}.txt"] = "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n" + "".join(
            f"{r['label']}\t{2 * i}\t{2 * i + 1}\t{r['sentence1']}\t{r['sentence2']}\n" for i, r in enumerate(rows))
    return out


def simcse_repo(cache: Path, data: Path, prefix: str = "", sick_splits: dict[str, slice] | None = None) -> Path:
    """princeton-nlp/datasets-for-simcse at its pinned commit: senteval.tar, the wiki1m sample, SNLI triplets."""
    wiki = (data / "unsup").glob("wiki1m_for_simcse*.txt")
    triplets = io.StringIO()
    writer = csv.writer(triplets)
    writer.writerow(["sent0", "sent1", "hard_neg"])
    for r in _rows(data / "nli" / "snli_dev_triplets.tsv"):
        writer.writerow([r["sent0"], r["sent1"], r["hard_neg"]])
    return put(cache, "dataset", *SIMCSE, {
        "senteval.tar": senteval_tar(data, prefix, sick_splits),
        "wiki1m_for_simcse.txt": next(iter(wiki)).read_bytes(),
        "nli_for_simcse.csv": triplets.getvalue().encode("utf-8"),
    })


def sts17_repo(cache: Path, data: Path) -> Path:
    """mteb/sts17-crosslingual-sts at the revision mteb pins: one default config, rows with a ``lang`` column."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    cols: dict[str, list] = {"sentence1": [], "sentence2": [], "score": [], "lang": []}
    for lang in ("ar-ar", "en-en", "es-es"):
        for r in _rows(data / "sts" / "STS17" / f"{lang}.tsv"):
            cols["sentence1"].append(r["sentence1"])
            cols["sentence2"].append(r["sentence2"])
            cols["score"].append(float(r["score"]))
            cols["lang"].append(lang)
    buf = io.BytesIO()
    pq.write_table(pa.table(cols), buf)
    readme = ("---\nconfigs:\n- config_name: default\n  data_files:\n  - split: test\n    path: test/*.parquet\n---\n"
              "# STS17 (stand-in)\n")
    return put(cache, "dataset", *STS17, {"README.md": readme.encode(), "test/0000.parquet": buf.getvalue()})


def bert_mini_repo(cache: Path, models: Path) -> Path:
    """google/bert_uncased_L-4_H-256_A-4 at its newest commit: config.json, vocab.txt and pytorch_model.bin."""
    import json

    import torch
    from safetensors.torch import load_file

    src = models / "raw-bert-mini-mlm"
    state = {f"bert.{k}": v for k, v in load_file(str(src / "model.safetensors")).items()}
    buf = io.BytesIO()
    torch.save(state, buf)
    config = {"architectures": ["BertForPreTraining"], "attention_probs_dropout_prob": 0.1, "hidden_act": "gelu",
              "hidden_dropout_prob": 0.1, "hidden_size": 256, "initializer_range": 0.02, "intermediate_size": 1024,
              "layer_norm_eps": 1e-12, "max_position_embeddings": 512, "model_type": "bert",
              "num_attention_heads": 4, "num_hidden_layers": 4, "pad_token_id": 0, "type_vocab_size": 2,
              "vocab_size": 30522}
    return put(cache, "model", *BERT_MINI, {"config.json": json.dumps(config, indent=2).encode(),
                                             "vocab.txt": (src / "vocab.txt").read_bytes(),
                                             "pytorch_model.bin": buf.getvalue()})


def hub_cache(root: Path, data: Path, models: Path | None = None, **simcse) -> Path:
    """A Hugging Face hub cache under ``root`` holding every stand-in (the model only with ``models``)."""
    cache = root / "hf-hub"
    simcse_repo(cache, data, **simcse)
    sts17_repo(cache, data)
    if models is not None:
        bert_mini_repo(cache, models)
    return cache
