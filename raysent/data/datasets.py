"""Named data sets: declared once here, found in ``RAYSENT_DATA_DIR`` first and on the hub second.

A data set is named by a *spec*: ``NAME`` or ``NAME:SPLIT`` (splits joined with ``+``, e.g.
``snli:dev+test``), or ``path:FILE`` for the user's own file. ``raysent data`` lists them.

Where each one is looked for, in order:

1. ``$RAYSENT_DATA_DIR/<relative path>`` (the layout of ../shared/data, see its MANIFEST.md);
2. the Hugging Face hub, through ``datasets.load_dataset`` (hub ids in :data:`DATASETS`), unless
   ``HF_HUB_OFFLINE=1``;
3. otherwise a :class:`DataError` that says where it looked and how to fix it.

Nothing is silently substituted: a local sample that stands in for a bigger corpus (the 11,914-line
head of wiki1m, SNLI dev/test triplets instead of SimCSE's 275k SNLI+MNLI triplets) is accepted
only with a note that is logged and recorded on the run (:attr:`Data.notes`).
"""

from __future__ import annotations

import csv
import glob
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast, overload

import numpy as np

from raysent.data.readers import read_lines, read_table
from raysent.errors import DataError, did_you_mean

# Lazy imports: datasets, huggingface_hub (heavy, and only the functions that need them import them).

log = logging.getLogger(__name__)

NLI_LABELS = ("entailment", "neutral", "contradiction")  # label ids 0, 1, 2 (SNLI's order)


# --------------------------------------------------------------------------- containers
@dataclass
class Data:
    """Base of every loaded data set: where it came from and what to know about it."""

    name: str
    source: str  # the files or hub id it was read from
    transductive: bool = False  # holds the text of evaluation sets (ConSERT / SG-BERT setting)
    notes: list[str] = field(default_factory=list)

    kind = "data"

    def sentences(self) -> list[str]:  # pragma: no cover - overridden
        raise NotImplementedError

    def __len__(self) -> int:  # pragma: no cover - overridden
        raise NotImplementedError


@dataclass
class ScoredPairs(Data):
    """Sentence pairs with a gold similarity score (STS, SICK-R)."""

    sentence1: list[str] = field(default_factory=list)
    sentence2: list[str] = field(default_factory=list)
    scores: np.ndarray = field(default_factory=lambda: np.zeros(0))
    subsets: list[str] = field(default_factory=list)  # the sub-set each pair belongs to
    kind = "scored_pairs"

    def sentences(self) -> list[str]:
        return [s for pair in zip(self.sentence1, self.sentence2) for s in pair]

    def __len__(self) -> int:
        return len(self.sentence1)


@dataclass
class Sentences(Data):
    """Unlabelled sentences (unsupervised training)."""

    texts: list[str] = field(default_factory=list)
    kind = "sentences"

    def sentences(self) -> list[str]:
        return list(self.texts)

    def __len__(self) -> int:
        return len(self.texts)


@dataclass
class Triplets(Data):
    """(anchor, positive, hard negative), SimCSE's supervised format (sent0, sent1, hard_neg)."""

    sent0: list[str] = field(default_factory=list)
    sent1: list[str] = field(default_factory=list)
    hard_neg: list[str] = field(default_factory=list)
    kind = "triplets"

    def sentences(self) -> list[str]:
        return [s for t in zip(self.sent0, self.sent1, self.hard_neg) for s in t]

    def __len__(self) -> int:
        return len(self.sent0)


@dataclass
class NLIPairs(Data):
    """Labelled NLI pairs; ``labels`` are 0 entailment, 1 neutral, 2 contradiction."""

    premise: list[str] = field(default_factory=list)
    hypothesis: list[str] = field(default_factory=list)
    labels: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    kind = "nli_pairs"

    def sentences(self) -> list[str]:
        return [s for pair in zip(self.premise, self.hypothesis) for s in pair]

    def __len__(self) -> int:
        return len(self.premise)


# --------------------------------------------------------------------------- declarations
@dataclass(frozen=True)
class HubSource:
    """Where a split lives on the Hugging Face hub and how its columns map to ours."""

    repo: str
    split: str | None = None  # a split of `repo` (load_dataset) ...
    file: str | None = None  # ... or one file of a dataset repo (hf_hub_download)
    config: str | None = None
    columns: tuple[tuple[str, str], ...] = ()  # (ours, theirs)
    note: str = ""


@dataclass(frozen=True)
class DatasetDecl:
    name: str
    kind: str  # scored_pairs | sentences | triplets | nli_pairs
    description: str
    local: dict[str, tuple[str, ...]]  # split -> files relative to RAYSENT_DATA_DIR
    hub: dict[str, HubSource]
    default_split: str
    score_range: tuple[float, float] = (0.0, 5.0)
    transductive: bool = False
    local_notes: dict[str, str] = field(default_factory=dict)  # split -> note when read locally


def _sts_year(name: str, folder: str, subsets: list[str], hub_repo: str) -> DatasetDecl:
    return DatasetDecl(
        name=name,
        kind="scored_pairs",
        description=f"{folder} test, all gold-scored pairs of {len(subsets)} sub-sets ({', '.join(subsets)})",
        local={"test": tuple(f"sts/{folder}/{s}.tsv" for s in subsets)},
        hub={"test": HubSource(hub_repo, split="test", note="the hub copy has no sub-set labels")},
        default_split="test",
    )


STS_YEARS = {
    "sts12": ("STS12", ["MSRpar", "MSRvid", "SMTeuroparl", "surprise.OnWN", "surprise.SMTnews"]),
    "sts13": ("STS13", ["FNWN", "headlines", "OnWN"]),
    "sts14": ("STS14", ["deft-forum", "deft-news", "headlines", "images", "OnWN", "tweet-news"]),
    "sts15": ("STS15", ["answers-forums", "answers-students", "belief", "headlines", "images"]),
    "sts16": ("STS16", ["answer-answer", "headlines", "plagiarism", "postediting", "question-question"]),
}

STS17_TRACKS = {  # local file stem -> hub config of mteb/sts17-crosslingual-sts
    "ar-ar": "ar-ar",
    "ar-en": None,
    "es-es": "es-es",
    "es-en.track4a": None,
    "es-en.track4b": None,
    "en-en": "en-en",
}

_STSB_HUB = {
    "train": HubSource("mteb/stsbenchmark-sts", split="train"),
    "dev": HubSource("mteb/stsbenchmark-sts", split="validation"),
    "test": HubSource("mteb/stsbenchmark-sts", split="test"),
}
_SICK_COLUMNS = (("sentence1", "sentence_A"), ("sentence2", "sentence_B"), ("score", "relatedness_score"))
_SICK_HUB = {
    "train": HubSource("RobZamp/sick", split="train", columns=_SICK_COLUMNS),
    "dev": HubSource("RobZamp/sick", split="validation", columns=_SICK_COLUMNS),
    "test": HubSource("RobZamp/sick", split="test", columns=_SICK_COLUMNS),
}
_SIMCSE_REPO = "princeton-nlp/datasets-for-simcse"

DATASETS: dict[str, DatasetDecl] = {
    **{k: _sts_year(k, folder, subsets, f"mteb/{k}-sts") for k, (folder, subsets) in STS_YEARS.items()},
    "stsb": DatasetDecl(
        name="stsb",
        kind="scored_pairs",
        description="STS Benchmark (Cer et al. 2017): train 5,749 / dev 1,500 / test 1,379 pairs",
        local={s: (f"sts/STSB/{s}.tsv",) for s in ("train", "dev", "test")},
        hub=_STSB_HUB,
        default_split="test",
    ),
    "sickr": DatasetDecl(
        name="sickr",
        kind="scored_pairs",
        description="SICK relatedness (scores 1-5): train 4,500 / dev (trial) 500 / test 4,927 pairs",
        local={s: (f"sts/SICK-R/{s}.tsv",) for s in ("train", "dev", "test")},
        hub=_SICK_HUB,
        default_split="test",
        score_range=(1.0, 5.0),
    ),
    "sts17": DatasetDecl(
        name="sts17",
        kind="scored_pairs",
        description="SemEval-2017 Task 1 (multilingual / cross-lingual STS), 250 pairs a track",
        local={t: (f"sts/STS17/{t}.tsv",) for t in STS17_TRACKS},
        hub={t: HubSource("mteb/sts17-crosslingual-sts", split="test", config=c)
             for t, c in STS17_TRACKS.items() if c},
        default_split="en-en",
    ),
    "quora-duplicates": DatasetDecl(
        name="quora-duplicates",
        kind="scored_pairs",
        description="Quora duplicate question pairs (404,290; score = label, 1 duplicate, 0 different): "
        "semantic search queries and documents (raysent.eval.retrieval)",
        local={"train": ("pairs/quora_duplicates.tsv",)},
        hub={"train": HubSource("sentence-transformers/quora-duplicates", split="train", config="pair-class",
                                columns=(("score", "label"),))},
        default_split="train",
        score_range=(0.0, 1.0),
    ),
    "sts-unlabeled": DatasetDecl(
        name="sts-unlabeled",
        kind="sentences",
        description="every sentence of STS12-16, STS-B (all splits) and SICK-R (all splits), "
        "unlabelled: the transductive setting of ConSERT (Yan et al. 2021, Table 1)",
        local={},  # built from the seven sets
        hub={},
        default_split="train",
        transductive=True,
    ),
    "stsb-unlabeled": DatasetDecl(
        name="stsb-unlabeled",
        kind="sentences",
        description="every sentence of STS-B train+dev+test, unlabelled: the setting of SG-BERT "
        "(Kim et al. 2021, §4.2) and BERT-flow",
        local={},
        hub={},
        default_split="train",
        transductive=True,
    ),
    "wiki1m": DatasetDecl(
        name="wiki1m",
        kind="sentences",
        description="SimCSE's 1M English Wikipedia sentences (wiki1m_for_simcse.txt)",
        local={"train": ("unsup/wiki1m_for_simcse.txt", "unsup/wiki1m_for_simcse.head*.txt")},
        hub={"train": HubSource(_SIMCSE_REPO, file="wiki1m_for_simcse.txt")},
        default_split="train",
        local_notes={"train": "local wiki1m is a sample ({n:,} lines), not the full 1M-sentence file"},
    ),
    "nli-triplets": DatasetDecl(
        name="nli-triplets",
        kind="triplets",
        description="(premise, entailment, contradiction) triplets: SimCSE's nli_for_simcse.csv "
        "(SNLI+MNLI, ~275k) on the hub; SNLI dev+test triplets (6,503) locally",
        local={"train": ("nli/snli_dev_triplets.tsv", "nli/snli_test_triplets.tsv")},
        hub={"train": HubSource(_SIMCSE_REPO, file="nli_for_simcse.csv")},
        default_split="train",
        local_notes={"train": "local nli-triplets are built from SNLI dev+test ({n:,} triplets), "
                     "not SimCSE's SNLI+MNLI train set"},
    ),
    "snli": DatasetDecl(
        name="snli",
        kind="nli_pairs",
        description="SNLI labelled pairs (premise, hypothesis, entailment/neutral/contradiction)",
        local={"dev": ("nli/snli_dev.tsv",), "test": ("nli/snli_test.tsv",)},
        hub={
            "train": HubSource("stanfordnlp/snli", split="train"),
            "dev": HubSource("stanfordnlp/snli", split="validation"),
            "test": HubSource("stanfordnlp/snli", split="test"),
        },
        default_split="train",
    ),
}

# STS evaluation suite in the papers' column order.
STS_TASKS = ("sts12", "sts13", "sts14", "sts15", "sts16", "stsb", "sickr")
TRAIN_KINDS = ("sentences", "triplets", "nli_pairs", "scored_pairs")


def data_dir() -> Path | None:
    d = os.environ.get("RAYSENT_DATA_DIR")
    return Path(d).expanduser() if d else None


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes") or os.environ.get(
        "HF_DATASETS_OFFLINE", ""
    ).lower() in ("1", "true", "yes")


# --------------------------------------------------------------------------- spec parsing
def parse_spec(spec: str) -> tuple[str, list[str]]:
    """``'stsb:dev'`` -> ``('stsb', ['dev'])``; ``'path:FILE'`` -> ``('path', ['FILE'])``."""
    if not isinstance(spec, str) or not spec.strip():
        raise DataError(f"data set spec {spec!r} is empty; expected NAME, NAME:SPLIT or path:FILE")
    spec = spec.strip()
    if spec.startswith("path:"):
        file = spec[len("path:"):]
        if not file:
            raise DataError("data set spec 'path:' names no file; expected path:FILE")
        return "path", [file]
    name, _, splits = spec.partition(":")
    if name not in DATASETS:
        raise DataError(
            f"unknown data set {name!r}{did_you_mean(name, DATASETS)}; known: "
            f"{', '.join(DATASETS)}, or path:FILE for your own file"
        )
    decl = DATASETS[name]
    split_list = [s for s in splits.split("+")] if splits else [decl.default_split]
    known = list(dict.fromkeys([*decl.local, *decl.hub])) or [decl.default_split]
    for s in split_list:
        if s not in known:
            raise DataError(
                f"data set {name!r} has no split {s!r}{did_you_mean(s, known)}; its splits: {', '.join(known)}"
            )
    return name, split_list


def validate_spec(spec: str, expect_kind: str | None = None) -> None:
    """Check a spec without reading files (config validation)."""
    name, _ = parse_spec(spec)
    if name == "path" or expect_kind is None:
        return
    kind = DATASETS[name].kind
    if not _convertible(kind, expect_kind):
        raise DataError(f"data set {spec!r} holds {kind.replace('_', ' ')}, "
                        f"but {expect_kind.replace('_', ' ')} are needed")


def _convertible(have: str, want: str) -> bool:
    return have == want or want == "sentences"


# --------------------------------------------------------------------------- loading
@overload
def load(spec: str, kind: Literal["scored_pairs"]) -> ScoredPairs: ...
@overload
def load(spec: str, kind: Literal["sentences"]) -> Sentences: ...
@overload
def load(spec: str, kind: Literal["triplets"]) -> Triplets: ...
@overload
def load(spec: str, kind: Literal["nli_pairs"]) -> NLIPairs: ...
@overload
def load(spec: str, kind: str | None = None) -> Data: ...


def load(spec: str, kind: str | None = None) -> Data:
    """Load a data set by spec; with ``kind``, convert it (anything gives ``sentences``) or refuse."""
    name, splits = parse_spec(spec)
    if name == "path":
        data = _load_user_file(Path(splits[0]), kind)
    elif name in ("sts-unlabeled", "stsb-unlabeled"):
        data = _load_unlabeled(name)
    else:
        parts = [_load_split(DATASETS[name], s) for s in splits]
        data = parts[0] if len(parts) == 1 else _concat(parts, f"{name}:{'+'.join(splits)}")
    for note in data.notes:
        log.warning("%s: %s", spec, note)
    if kind is not None and data.kind != kind:
        if kind == "sentences":
            return Sentences(name=data.name, source=data.source, transductive=data.transductive,
                             notes=data.notes, texts=data.sentences())
        raise DataError(
            f"data set {spec!r} holds {data.kind.replace('_', ' ')}, but this method trains on "
            f"{kind.replace('_', ' ')}"
        )
    return data


def _concat(parts: list[Data], name: str) -> Data:
    first = parts[0]
    merged: dict[str, Any] = dict(
        name=name,
        source=" + ".join(p.source for p in parts),
        transductive=any(p.transductive for p in parts),
        notes=[n for p in parts for n in p.notes],
    )
    # the parts are splits of one data set: all of the first part's kind
    if isinstance(first, ScoredPairs):
        sp = cast("list[ScoredPairs]", parts)
        return ScoredPairs(**merged, sentence1=sum((p.sentence1 for p in sp), []),
                           sentence2=sum((p.sentence2 for p in sp), []),
                           scores=np.concatenate([p.scores for p in sp]),
                           subsets=sum((p.subsets for p in sp), []))
    if isinstance(first, NLIPairs):
        nli = cast("list[NLIPairs]", parts)
        return NLIPairs(**merged, premise=sum((p.premise for p in nli), []),
                        hypothesis=sum((p.hypothesis for p in nli), []),
                        labels=np.concatenate([p.labels for p in nli]))
    if isinstance(first, Triplets):
        tri = cast("list[Triplets]", parts)
        return Triplets(**merged, sent0=sum((p.sent0 for p in tri), []),
                        sent1=sum((p.sent1 for p in tri), []), hard_neg=sum((p.hard_neg for p in tri), []))
    return Sentences(**merged, texts=sum((p.sentences() for p in parts), []))


def _load_unlabeled(name: str) -> Sentences:
    if name == "stsb-unlabeled":
        specs = ["stsb:train+dev+test"]
    else:
        specs = [f"{t}" for t in STS_TASKS[:5]] + ["stsb:train+dev+test", "sickr:train+dev+test"]
    parts = [load(s) for s in specs]
    texts = [t for p in parts for t in p.sentences()]
    return Sentences(name=name, source=" + ".join(p.source for p in parts), transductive=True,
                     notes=[n for p in parts for n in p.notes], texts=texts)


def local_files(decl: DatasetDecl, split: str) -> list[Path] | None:
    """The files of a data set's split under ``RAYSENT_DATA_DIR``, or None when they are not all there."""
    root = data_dir()
    if root is None or split not in decl.local:
        return None
    patterns = decl.local[split]
    if decl.name == "wiki1m":  # the full file first, a sample only if it is missing
        for pattern in patterns:
            hits = sorted(glob.glob(str(root / pattern)))
            if hits:
                return [Path(hits[0])]
        return None
    files = [root / p for p in patterns]
    return files if all(f.is_file() for f in files) else None


def _load_split(decl: DatasetDecl, split: str) -> Data:
    files = local_files(decl, split)
    if files is not None:
        data = _read_local(decl, split, files)
        note = decl.local_notes.get(split)
        full_local = decl.name == "wiki1m" and files[0].name == "wiki1m_for_simcse.txt"
        if note and not full_local:
            data.notes.append(note.format(n=len(data)))
        return data
    tried = []
    root = data_dir()
    if split in decl.local:
        where = " and ".join(str((root or Path("$RAYSENT_DATA_DIR")) / p) for p in decl.local[split])
        tried.append(f"{where}" + ("" if root else " (RAYSENT_DATA_DIR is not set)"))
    hub = decl.hub.get(split)
    if hub is not None:
        if hub_offline():
            tried.append(f"the Hugging Face hub ({hub.repo}): skipped, HF_HUB_OFFLINE is set")
        else:
            try:
                return _read_hub(decl, split, hub)
            except DataError:
                raise
            except Exception as exc:  # network, missing repo, ... -> summarised below
                tried.append(f"the Hugging Face hub ({hub.repo}{'/' + hub.file if hub.file else ''}): "
                             f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}")
    raise DataError(
        f"data set '{decl.name}:{split}' not found. Looked in: " + "; ".join(tried or ["nowhere"])
        + ". Fix: set RAYSENT_DATA_DIR to a folder with the layout of shared/data (see docs/experiments.md, "
        "'Local data and models'), or give the machine access to the Hugging Face hub."
    )


DATA_DIR_VAR = "$RAYSENT_DATA_DIR"


def portable_source(path: Path) -> str:
    """A local data file as ``$RAYSENT_DATA_DIR/<relative path>``: what a record says it read, on any machine."""
    root = data_dir()
    if root is not None:
        try:
            return f"{DATA_DIR_VAR}/{Path(os.path.normpath(path)).relative_to(os.path.normpath(root.resolve()))}"
        except ValueError:
            try:
                return f"{DATA_DIR_VAR}/{Path(os.path.normpath(path)).relative_to(os.path.normpath(root))}"
            except ValueError:
                pass
    return str(path)


def _read_local(decl: DatasetDecl, split: str, files: list[Path]) -> Data:
    source = " + ".join(portable_source(f) for f in files)
    if decl.kind == "scored_pairs":
        s1, s2, scores, subsets = [], [], [], []
        for f in files:
            t = read_table(f, ["score", "sentence1", "sentence2"], numeric={"score": decl.score_range})
            s1 += t["sentence1"]
            s2 += t["sentence2"]
            scores += t["score"]
            subsets += [f.stem] * len(t["score"])
        return ScoredPairs(name=f"{decl.name}:{split}", source=source, sentence1=s1, sentence2=s2,
                           scores=np.asarray(scores, dtype=np.float64), subsets=subsets)
    if decl.kind == "sentences":
        texts = [s for f in files for s in read_lines(f)]
        return Sentences(name=f"{decl.name}:{split}", source=source, transductive=decl.transductive, texts=texts)
    if decl.kind == "triplets":
        cols: dict[str, list[str]] = {"sent0": [], "sent1": [], "hard_neg": []}
        for f in files:
            t = read_table(f, list(cols))
            for c in cols:
                cols[c] += t[c]
        return Triplets(name=f"{decl.name}:{split}", source=source, sent0=cols["sent0"], sent1=cols["sent1"],
                        hard_neg=cols["hard_neg"])
    if decl.kind == "nli_pairs":
        p, h, y = [], [], []
        for f in files:
            t = read_table(f, ["label", "premise", "hypothesis"], allowed_values={"label": set(NLI_LABELS)})
            p += t["premise"]
            h += t["hypothesis"]
            y += [NLI_LABELS.index(v) for v in t["label"]]
        return NLIPairs(name=f"{decl.name}:{split}", source=source, premise=p, hypothesis=h,
                        labels=np.asarray(y, dtype=np.int64))
    raise AssertionError(decl.kind)  # pragma: no cover


def _read_hub(decl: DatasetDecl, split: str, hub: HubSource) -> Data:
    """Read one split from the hub (only reached with network access)."""
    source = f"hf://{hub.repo}" + (f"/{hub.file}" if hub.file else f"[{hub.config or ''}:{hub.split}]")
    if hub.file is not None:
        from huggingface_hub import hf_hub_download

        path = Path(hf_hub_download(hub.repo, hub.file, repo_type="dataset"))
        data = _load_user_file(path, decl.kind)
        data.name, data.source = f"{decl.name}:{split}", source
        return data
    import datasets

    ds = datasets.load_dataset(hub.repo, hub.config, split=hub.split)
    cols = dict(hub.columns)

    def col(ours: str) -> list:
        return list(ds[cols.get(ours, ours)])

    if decl.kind == "scored_pairs":
        scores = np.asarray(col("score"), dtype=np.float64)
        return ScoredPairs(name=f"{decl.name}:{split}", source=source, sentence1=col("sentence1"),
                           sentence2=col("sentence2"), scores=scores, subsets=[""] * len(scores),
                           notes=[hub.note] if hub.note else [])
    if decl.kind == "nli_pairs":
        labels = np.asarray(col("label"), dtype=np.int64)
        keep = labels >= 0  # SNLI marks pairs without a gold label with -1
        p, h = col("premise"), col("hypothesis")
        return NLIPairs(name=f"{decl.name}:{split}", source=source,
                        premise=[x for x, k in zip(p, keep) if k], hypothesis=[x for x, k in zip(h, keep) if k],
                        labels=labels[keep])
    raise AssertionError(decl.kind)  # pragma: no cover


# --------------------------------------------------------------------------- user files
_USER_COLUMNS = {
    "scored_pairs": ["score", "sentence1", "sentence2"],
    "triplets": ["sent0", "sent1", "hard_neg"],
    "nli_pairs": ["label", "premise", "hypothesis"],
}


def _load_user_file(path: Path, kind: str | None) -> Data:
    """``path:FILE``: .txt is one sentence per line; .tsv/.csv are detected by their header."""
    if not path.exists():
        raise DataError(f"{path}: file not found (from the data spec 'path:{path}')")
    source = str(path)
    if path.suffix.lower() == ".txt":
        return Sentences(name=f"path:{path}", source=source, texts=read_lines(path))
    if path.suffix.lower() not in (".tsv", ".csv"):
        raise DataError(f"{path}: unsupported file type '{path.suffix}'; allowed: .txt (one sentence a line), "
                        f".tsv or .csv with a header")
    header = _peek_header(path)
    wanted = kind if kind in _USER_COLUMNS else None
    if wanted is None:  # sentences: any known layout, or a single text column
        for k, cols in _USER_COLUMNS.items():
            if set(cols) <= set(header):
                wanted = k
                break
    if wanted is None:
        text_col = next((c for c in ("sentence", "text") if c in header), None)
        if text_col is None:
            raise DataError(
                f"{path} line 1: cannot tell what the file holds from its header "
                f"({', '.join(header) or 'empty'}); expected a 'sentence' or 'text' column, or the columns "
                + "; ".join(f"{', '.join(c)} ({k.replace('_', ' ')})" for k, c in _USER_COLUMNS.items())
            )
        t = read_table(path, [text_col])
        return Sentences(name=f"path:{path}", source=source, texts=t[text_col])
    if wanted == "scored_pairs":
        t = read_table(path, _USER_COLUMNS[wanted], numeric={"score": (0.0, 5.0)})
        return ScoredPairs(name=f"path:{path}", source=source, sentence1=t["sentence1"], sentence2=t["sentence2"],
                           scores=np.asarray(t["score"]), subsets=[""] * len(t["score"]))
    if wanted == "triplets":
        t = read_table(path, _USER_COLUMNS[wanted])
        return Triplets(name=f"path:{path}", source=source, sent0=t["sent0"], sent1=t["sent1"],
                        hard_neg=t["hard_neg"])
    t = read_table(path, _USER_COLUMNS[wanted], allowed_values={"label": set(NLI_LABELS)})
    return NLIPairs(name=f"path:{path}", source=source, premise=t["premise"], hypothesis=t["hypothesis"],
                    labels=np.asarray([NLI_LABELS.index(v) for v in t["label"]], dtype=np.int64))


def _peek_header(path: Path) -> list[str]:
    delimiter = "\t" if path.suffix.lower() == ".tsv" else ","
    with path.open(encoding="utf-8", newline="") as fh:
        try:
            row = next(csv.reader(fh, delimiter=delimiter))
        except StopIteration:
            raise DataError(f"{path}: the file is empty; expected a header line") from None
    return [h.strip().lstrip("\ufeff") for h in row]
