"""SentEval transfer-task data (MR, CR, SUBJ, MPQA, SST-2, TREC, MRPC): declared once, read locally first.

Each task is declared in a few lines (:data:`TRANSFER_TASKS`): its files under ``RAYSENT_DATA_DIR``
(the layout of ../shared/data, see its MANIFEST.md: the SentEval-distributed versions, tokenized),
its label names, the SentEval protocol that evaluates it (:mod:`raysent.eval.senteval`) and, where a
faithful public copy exists, where it lives on the Hugging Face hub.

Rows keep the order of the SentEval source files (for MR/CR/SUBJ/MPQA: the label-1 file first, then
the label-0 file), because SentEval's cross-validation folds are drawn on that order after its sort
by sentence length (:func:`senteval_order`).

Where a task is looked for, in order: ``$RAYSENT_DATA_DIR/senteval/...``; SentEval's own files in SimCSE's
``senteval.tar`` on the hub (pinned; through the Hugging Face cache, so offline too once downloaded:
:mod:`raysent.hub`), with SentEval's splits and order, every split's size checked against SentEval's; otherwise a
:class:`DataError` that says where it looked, what failed and how to fix it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from raysent.data.datasets import SENTEVAL_TAR, SIMCSE_REPO, SIMCSE_REVISION, Data, data_dir
from raysent.data.readers import read_table
from raysent.data.senteval_archive import read_labelled, read_mrpc
from raysent.errors import DataError, did_you_mean
from raysent.hub import fetch_file, hub_url

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- containers
@dataclass
class LabelledSentences(Data):
    """Sentences with a class label (``labels`` are indices into ``label_names``)."""

    texts: list[str] = field(default_factory=list)
    labels: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    label_names: tuple[str, ...] = ()
    kind = "labelled_sentences"

    def sentences(self) -> list[str]:
        return list(self.texts)

    def __len__(self) -> int:
        return len(self.texts)

    def subset(self, index: Sequence[int]) -> LabelledSentences:
        return LabelledSentences(name=self.name, source=self.source, notes=list(self.notes),
                                 texts=[self.texts[i] for i in index], labels=self.labels[list(index)],
                                 label_names=self.label_names)


@dataclass
class LabelledPairs(Data):
    """Sentence pairs with a class label (MRPC: 1 = paraphrase)."""

    sentence1: list[str] = field(default_factory=list)
    sentence2: list[str] = field(default_factory=list)
    labels: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    label_names: tuple[str, ...] = ()
    kind = "labelled_pairs"

    def sentences(self) -> list[str]:
        return [s for pair in zip(self.sentence1, self.sentence2) for s in pair]

    def __len__(self) -> int:
        return len(self.sentence1)

    def subset(self, index: Sequence[int]) -> LabelledPairs:
        return LabelledPairs(name=self.name, source=self.source, notes=list(self.notes),
                             sentence1=[self.sentence1[i] for i in index],
                             sentence2=[self.sentence2[i] for i in index],
                             labels=self.labels[list(index)], label_names=self.label_names)


# --------------------------------------------------------------------------- declarations
@dataclass(frozen=True)
class TransferTask:
    name: str  # SentEval's name (MR, CR, ...)
    description: str
    protocol: str  # inner_kfold | split | kfold (see raysent.eval.senteval)
    pairs: bool  # sentence pairs (MRPC) or single sentences
    local: dict[str, str]  # split -> file relative to RAYSENT_DATA_DIR
    label_names: tuple[str, ...]  # label id = index (SentEval's ids)
    archive: dict[str, tuple[str, ...]] = field(default_factory=dict)  # split -> SentEval's files in senteval.tar
    sizes: dict[str, int] = field(default_factory=dict)  # split -> rows (SentEval's files, empty lines dropped)

    @property
    def nclasses(self) -> int:
        return len(self.label_names)


_BINARY = ("0", "1")
TREC_LABELS = ("ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM")  # SentEval's tgt2idx order

TRANSFER_TASKS: dict[str, TransferTask] = {
    "MR": TransferTask(
        "MR", "movie-review polarity (Pang & Lee 2005), 10,662 sentences", "inner_kfold", False,
        {"all": "senteval/MR.tsv"}, _BINARY, {"all": ("MR/rt-polarity.pos", "MR/rt-polarity.neg")}, {"all": 10662}),
    "CR": TransferTask(
        "CR", "customer-review polarity (Hu & Liu 2004), 3,771 non-empty sentences", "inner_kfold", False,
        {"all": "senteval/CR.tsv"}, _BINARY, {"all": ("CR/custrev.pos", "CR/custrev.neg")}, {"all": 3771}),
    "SUBJ": TransferTask(
        "SUBJ", "subjectivity (Pang & Lee 2004), 10,000 sentences; 1 = objective (SentEval's convention)",
        "inner_kfold", False, {"all": "senteval/SUBJ.tsv"}, _BINARY,
        {"all": ("SUBJ/subj.objective", "SUBJ/subj.subjective")}, {"all": 10000}),
    "MPQA": TransferTask(
        "MPQA", "opinion polarity (Wiebe et al. 2005), 10,603 non-empty phrases", "inner_kfold", False,
        {"all": "senteval/MPQA.tsv"}, _BINARY, {"all": ("MPQA/mpqa.pos", "MPQA/mpqa.neg")}, {"all": 10603}),
    "SST2": TransferTask(
        "SST2", "Stanford Sentiment Treebank, binary (SentEval's version: train 67,349 phrases, dev 872, "
        "test 1,821)", "split", False,
        {"train": "senteval/SST2/train.tsv", "dev": "senteval/SST2/dev.tsv", "test": "senteval/SST2/test.tsv"},
        _BINARY, {s: (f"SST/binary/sentiment-{s}",) for s in ("train", "dev", "test")},
        {"train": 67349, "dev": 872, "test": 1821}),
    "TREC": TransferTask(
        "TREC", "question type, 6 coarse classes (Li & Roth 2002): train 5,452, test 500", "kfold", False,
        {"train": "senteval/TREC/train.tsv", "test": "senteval/TREC/test.tsv"}, TREC_LABELS,
        {"train": ("TREC/train_5500.label",), "test": ("TREC/TREC_10.label",)}, {"train": 5452, "test": 500}),
    "MRPC": TransferTask(
        "MRPC", "Microsoft Research paraphrase corpus: train 4,076, test 1,725 pairs", "kfold", True,
        {"train": "senteval/MRPC/train.tsv", "test": "senteval/MRPC/test.tsv"}, _BINARY,
        {"train": ("MRPC/msr_paraphrase_train.txt",), "test": ("MRPC/msr_paraphrase_test.txt",)},
        {"train": 4076, "test": 1725}),
}
# names users may type, case-insensitively
_ALIASES = {"SST-2": "SST2", "SST": "SST2"}


def task_names() -> list[str]:
    return list(TRANSFER_TASKS)


def get_task(name: str) -> TransferTask:
    key = str(name).strip()
    key = _ALIASES.get(key.upper(), key.upper())
    if key not in TRANSFER_TASKS:
        raise DataError(f"unknown SentEval task {name!r}{did_you_mean(str(name).upper(), TRANSFER_TASKS)}; "
                        f"allowed: {', '.join(TRANSFER_TASKS)}")
    return TRANSFER_TASKS[key]


# --------------------------------------------------------------------------- loading
def load_task(name: str, max_samples: int | None = None) -> dict[str, LabelledSentences | LabelledPairs]:
    """Every split of a task (``{'all': ...}`` or ``{'train', 'dev', 'test'}``), rows in file order.

    ``max_samples`` keeps at most that many rows of each split, by stride sampling
    (``rows[::ceil(n / max_samples)]``): spread over the file, so each class keeps about its share.
    A subset is for quick checks only and is noted on the data.
    """
    task = get_task(name)
    root = data_dir()
    files = {s: root / p for s, p in task.local.items()} if root is not None else None
    if files is not None and all(f.is_file() for f in files.values()):
        splits = {s: _read_local(task, s, f) for s, f in files.items()}
    else:
        splits = _load_from_hub_or_fail(task, files)
    if max_samples is not None:
        if max_samples < 1:
            raise DataError(f"max_samples must be a positive number, got {max_samples}")
        for s, d in list(splits.items()):
            if len(d) > max_samples:
                step = math.ceil(len(d) / max_samples)
                sub = d.subset(range(0, len(d), step))
                sub.notes.append(f"{task.name} {s}: a subset of {len(sub):,} of {len(d):,} rows (one row in "
                                 f"{step}; max_samples={max_samples}): not the full task")
                splits[s] = sub
    return splits


def _read_local(task: TransferTask, split: str, path: Path) -> LabelledSentences | LabelledPairs:
    allowed = {"label": set(task.label_names)}
    name = f"{task.name}:{split}"
    if task.pairs:
        t = read_table(path, ["label", "sentence1", "sentence2"], allowed_values=allowed)
        return LabelledPairs(name=name, source=str(path), sentence1=t["sentence1"], sentence2=t["sentence2"],
                             labels=_ids(t["label"], task), label_names=task.label_names)
    t = read_table(path, ["label", "sentence"], allowed_values=allowed)
    return LabelledSentences(name=name, source=str(path), texts=t["sentence"], labels=_ids(t["label"], task),
                             label_names=task.label_names)


def _ids(values: list[str], task: TransferTask) -> np.ndarray:
    index = {n: i for i, n in enumerate(task.label_names)}
    return np.asarray([index[v] for v in values], dtype=np.int64)


def _load_from_hub_or_fail(task: TransferTask, files: dict[str, Path] | None):
    root = data_dir()
    if files is None:
        local = " and ".join(f"$RAYSENT_DATA_DIR/{p}" for p in task.local.values()) + " (RAYSENT_DATA_DIR is not set)"
    else:
        local = " and ".join(str(f) for f in files.values() if not f.is_file()) + f" (RAYSENT_DATA_DIR={root})"
    try:
        return _read_archive(task)
    except DataError as exc:
        raise DataError(f"SentEval task {task.name!r}: not in {local}; then the hub: {exc}") from None


def _read_archive(task: TransferTask) -> dict[str, LabelledSentences | LabelledPairs]:
    """A task from SentEval's own files in SimCSE's ``senteval.tar`` (pinned: :data:`~raysent.data.datasets.
    SIMCSE_REVISION`), read as SentEval's loaders read them (``senteval/binary.py``, ``sst.py``, ``trec.py``,
    ``mrpc.py``): the label-1 file first, then the label-0 one; empty lines left out (CR has 4, MPQA 3)."""
    what = f"SentEval task {task.name}"
    path, commit = fetch_file(SIMCSE_REPO, SENTEVAL_TAR, SIMCSE_REVISION, what)
    where = hub_url(SIMCSE_REPO, commit, path.name)
    out: dict[str, LabelledSentences | LabelledPairs] = {}
    for split, rels in task.archive.items():
        source = " + ".join(f"{where}/{r}" for r in rels)
        name = f"{task.name}:{split}"
        if task.pairs:
            s1, s2, y = read_mrpc(path, rels[0], where)
            data: LabelledSentences | LabelledPairs = LabelledPairs(
                name=name, source=source, sentence1=s1, sentence2=s2, labels=np.asarray(y, dtype=np.int64),
                label_names=task.label_names)
        else:
            texts, ids = read_labelled(path, task.name, rels, where, task.label_names)
            data = LabelledSentences(name=name, source=source, texts=texts, labels=np.asarray(ids, dtype=np.int64),
                                     label_names=task.label_names)
        want = task.sizes.get(split)
        if want is not None and len(data) != want:
            raise DataError(f"{source}: {len(data):,} rows, but SentEval's {task.name} {split} has {want:,}: another "
                            "copy of the task would not give SentEval's numbers, so it is refused")
        out[split] = data
    return out


# --------------------------------------------------------------------------- SentEval's order
def senteval_order(data: LabelledSentences | LabelledPairs) -> np.ndarray:
    """The row order in which SentEval embeds a split and draws its folds.

    SentEval sorts each split "to reduce padding" and keeps the sorted order for the classifier:
    by (number of whitespace tokens, label) for single sentences and by (tokens of sentence 1,
    tokens of sentence 2, label) for MRPC, with Python's stable sort on the file order.
    """
    keys: list[tuple[int, ...]]
    if isinstance(data, LabelledPairs):
        keys = [(len(a.split()), len(b.split()), int(y))
                for a, b, y in zip(data.sentence1, data.sentence2, data.labels)]
    else:
        keys = [(len(s.split()), int(y)) for s, y in zip(data.texts, data.labels)]
    return np.asarray(sorted(range(len(keys)), key=keys.__getitem__), dtype=np.int64)
