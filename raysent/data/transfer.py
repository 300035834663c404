"""SentEval transfer-task data (MR, CR, SUBJ, MPQA, SST-2, TREC, MRPC): declared once, read locally first.

Each task is declared in a few lines (:data:`TRANSFER_TASKS`): its files under ``RAYSENT_DATA_DIR``
(the layout of ../shared/data, see its MANIFEST.md: the SentEval-distributed versions, tokenized),
its label names, the SentEval protocol that evaluates it (:mod:`raysent.eval.senteval`) and, where a
faithful public copy exists, where it lives on the Hugging Face hub.

Rows keep the order of the SentEval source files (for MR/CR/SUBJ/MPQA: the label-1 file first, then
the label-0 file), because SentEval's cross-validation folds are drawn on that order after its sort
by sentence length (:func:`senteval_order`).

Where a task is looked for, in order: ``$RAYSENT_DATA_DIR/senteval/...``; the hub copy named in the
declaration (unless ``HF_HUB_OFFLINE=1``); otherwise a :class:`DataError` that says where it looked
and how to fix it. Tasks without a faithful hub copy (SST-2 with SentEval's labelled test set and
phrase-level train set, SUBJ, MPQA, MRPC's labelled test set) name SentEval's download script instead.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from raysent.data.datasets import Data, data_dir
from raysent.data.readers import read_table
from raysent.errors import DataError, did_you_mean
from raysent.hub import hub_offline

# Lazy imports: datasets, huggingface_hub (heavy, and only the functions that need them import them).

log = logging.getLogger(__name__)

SENTEVAL_DOWNLOAD = ("SentEval's data/downstream/get_transfer_data.bash (github.com/facebookresearch/SentEval), "
                     "converted to the TSV layout of shared/data/MANIFEST.md")


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
class HubCopy:
    """A public hub copy of one task: ``files`` (raw SentEval files of a dataset repo, one per label,
    label order of ``label_names``) or ``splits`` of a ``load_dataset`` repo (ours -> theirs, joined with +)."""

    repo: str
    files: tuple[str, ...] = ()
    splits: tuple[tuple[str, str], ...] = ()
    text_column: str = "text"
    label_column: str = "label"
    label_map: tuple[tuple[str, str], ...] = ()  # (their label name, ours); default: the same names
    note: str = ""


@dataclass(frozen=True)
class TransferTask:
    name: str  # SentEval's name (MR, CR, ...)
    description: str
    protocol: str  # inner_kfold | split | kfold (see raysent.eval.senteval)
    pairs: bool  # sentence pairs (MRPC) or single sentences
    local: dict[str, str]  # split -> file relative to RAYSENT_DATA_DIR
    label_names: tuple[str, ...]  # label id = index (SentEval's ids)
    hub: HubCopy | None = None

    @property
    def nclasses(self) -> int:
        return len(self.label_names)


_BINARY = ("0", "1")
TREC_LABELS = ("ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM")  # SentEval's tgt2idx order

TRANSFER_TASKS: dict[str, TransferTask] = {
    "MR": TransferTask(
        "MR", "movie-review polarity (Pang & Lee 2005), 10,662 sentences", "inner_kfold", False,
        {"all": "senteval/MR.tsv"}, _BINARY,
        HubCopy("cornell-movie-review-data/rotten_tomatoes", splits=(("all", "train+validation+test"),),
                label_map=(("neg", "0"), ("pos", "1")),
                note="the hub copy orders the sentences differently from SentEval's rt-polarity.pos/.neg "
                     "files, so the cross-validation folds differ from SentEval's")),
    "CR": TransferTask(
        "CR", "customer-review polarity (Hu & Liu 2004), 3,771 non-empty sentences", "inner_kfold", False,
        {"all": "senteval/CR.tsv"}, _BINARY,
        HubCopy("SetFit/SentEval-CR", files=("custrev.neg", "custrev.pos"))),
    "SUBJ": TransferTask(
        "SUBJ", "subjectivity (Pang & Lee 2004), 10,000 sentences; 1 = objective (SentEval's convention)",
        "inner_kfold", False, {"all": "senteval/SUBJ.tsv"}, _BINARY),
    "MPQA": TransferTask(
        "MPQA", "opinion polarity (Wiebe et al. 2005), 10,603 non-empty phrases", "inner_kfold", False,
        {"all": "senteval/MPQA.tsv"}, _BINARY),
    "SST2": TransferTask(
        "SST2", "Stanford Sentiment Treebank, binary (SentEval's version: train 67,349 phrases, dev 872, "
        "test 1,821)", "split", False,
        {"train": "senteval/SST2/train.tsv", "dev": "senteval/SST2/dev.tsv", "test": "senteval/SST2/test.tsv"},
        _BINARY),
    "TREC": TransferTask(
        "TREC", "question type, 6 coarse classes (Li & Roth 2002): train 5,452, test 500", "kfold", False,
        {"train": "senteval/TREC/train.tsv", "test": "senteval/TREC/test.tsv"}, TREC_LABELS,
        HubCopy("CogComp/trec", splits=(("train", "train"), ("test", "test")), label_column="coarse_label")),
    "MRPC": TransferTask(
        "MRPC", "Microsoft Research paraphrase corpus: train 4,076, test 1,725 pairs", "kfold", True,
        {"train": "senteval/MRPC/train.tsv", "test": "senteval/MRPC/test.tsv"}, _BINARY),
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
        tried = [" and ".join(f"$RAYSENT_DATA_DIR/{p}" for p in task.local.values()) + " (RAYSENT_DATA_DIR is not set)"]
    else:
        missing = [str(f) for f in files.values() if not f.is_file()]
        tried = [" and ".join(missing) + f" (RAYSENT_DATA_DIR={root})"]
    if task.hub is None:
        tried.append(f"the Hugging Face hub: no copy with SentEval's data and splits is declared for {task.name}")
    elif hub_offline():
        tried.append(f"the Hugging Face hub ({task.hub.repo}): skipped, HF_HUB_OFFLINE is set")
    else:
        try:
            return _read_hub(task)
        except DataError:
            raise
        except Exception as exc:  # network, missing repo, ... -> summarised below
            tried.append(f"the Hugging Face hub ({task.hub.repo}): {type(exc).__name__}: "
                         f"{str(exc).splitlines()[0][:200] if str(exc) else ''}")
    fix = ("set RAYSENT_DATA_DIR to a folder with the layout of shared/data (senteval/..., see its "
           "MANIFEST.md)")
    fix += (f", or give the machine access to the Hugging Face hub ({task.hub.repo})" if task.hub is not None
            else f"; the files come from {SENTEVAL_DOWNLOAD}")
    raise DataError(f"SentEval task {task.name!r} not found. Looked in: " + "; ".join(tried) + f". Fix: {fix}.")


def _read_hub(task: TransferTask) -> dict[str, LabelledSentences]:
    """Read a task from its hub copy (only reached with network access)."""
    hub = task.hub
    assert hub is not None
    notes = [hub.note] if hub.note else []
    if hub.files:  # raw SentEval files, one per label (label id = position)
        from huggingface_hub import hf_hub_download

        texts, labels = [], []
        for label_id in reversed(range(len(hub.files))):  # SentEval reads the label-1 file first
            path = hf_hub_download(hub.repo, hub.files[label_id], repo_type="dataset")
            with open(path, encoding="latin-1") as fh:
                lines = [line.strip() for line in fh.read().splitlines()]
            kept = [s for s in lines if s]
            texts += kept
            labels += [label_id] * len(kept)
        return {"all": LabelledSentences(name=f"{task.name}:all", source=f"hf://{hub.repo}", notes=notes,
                                         texts=texts, labels=np.asarray(labels, dtype=np.int64),
                                         label_names=task.label_names)}
    import datasets

    out = {}
    for ours, theirs in hub.splits:
        parts = [datasets.load_dataset(hub.repo, split=s) for s in theirs.split("+")]
        texts, labels = [], []
        for ds in parts:
            feature = ds.features[hub.label_column]
            raw = list(ds[hub.label_column])
            names = [feature.int2str(v) for v in raw] if hasattr(feature, "int2str") else [str(v) for v in raw]
            names = [dict(hub.label_map).get(n, n) for n in names]
            bad = sorted(set(names) - set(task.label_names))
            if bad:
                raise DataError(f"hf://{hub.repo}: labels {bad} are not {task.name}'s ({', '.join(task.label_names)})")
            texts += [str(t).strip() for t in ds[hub.text_column]]
            labels += [task.label_names.index(n) for n in names]
        out[ours] = LabelledSentences(name=f"{task.name}:{ours}", source=f"hf://{hub.repo}[{theirs}]",
                                      notes=list(notes), texts=texts, labels=np.asarray(labels, dtype=np.int64),
                                      label_names=task.label_names)
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
