"""Named data sets: declared once here, found in ``RAYSENT_DATA_DIR`` first and on the hub second.

A data set is named by a *spec*: ``NAME`` or ``NAME:SPLIT`` (splits joined with ``+``, e.g.
``snli:dev+test``), or ``path:FILE`` for the user's own file. ``raysent data`` lists them.

Where each one is looked for, in order:

1. ``$RAYSENT_DATA_DIR/<relative path>`` (the layout of ../shared/data, see its MANIFEST.md);
2. the Hugging Face hub at the revision :data:`DATASETS` pins, through the Hugging Face cache first (so with
   ``HF_HUB_OFFLINE=1`` a copy downloaded before is read, offline: :mod:`raysent.hub`). STS12-16, STS-B and
   SICK-R come from SimCSE's own evaluation data, SentEval's files in ``senteval.tar`` of
   ``princeton-nlp/datasets-for-simcse`` (:mod:`raysent.data.senteval_archive`): the papers' splits and STS12-16's
   sub-sets, so ``mean`` and ``wmean`` mean SentEval's;
3. otherwise a :class:`DataError` that says where it looked, what failed and how to fix it.

An evaluation set whose number of pairs is not the papers' (:attr:`DatasetDecl.sizes`, SentEval's counts) is refused,
wherever it was read: another release's split would make the numbers mean something else.

Nothing is silently substituted: a local sample that stands in for a bigger corpus (the 11,914-line
head of wiki1m, SNLI dev/test triplets instead of SimCSE's 275k SNLI+MNLI triplets) is accepted
only with a note that is logged and recorded on the run (:attr:`Data.notes`).
"""

from __future__ import annotations

import csv
import glob
import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast, overload

import numpy as np

from raysent.data.readers import read_lines, read_table, refuse_constant_scores
from raysent.data.senteval_archive import (
    SICK_FILES,
    STS_FOLDERS,
    STSB_FILES,
    read_sick,
    read_sts_year,
    read_stsb,
)
from raysent.errors import DataError, did_you_mean
from raysent.hub import fetch_file, fetch_snapshot, hub_url

# Lazy imports: datasets (heavy; only the reader of a hub repository's own data files imports it).

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
    """Where a split lives on the Hugging Face hub, at which revision, and how it is read.

    ``reader``: ``senteval_sts`` / ``senteval_stsb`` / ``senteval_sick`` (a set of SentEval's archive ``file``,
    :mod:`raysent.data.senteval_archive`), ``file`` (one text or table file, read as a ``path:FILE``), ``datasets``
    (the repository's own data files through ``datasets.load_dataset`` on its snapshot: ``config``, ``split``, the
    rows whose ``lang`` column is ``lang``, ``columns`` mapped to ours).
    """

    repo: str
    revision: str | None  # the commit read (None: the default branch; the commit read is recorded either way)
    reader: str
    file: str | None = None
    split: str | None = None
    config: str | None = None
    lang: str | None = None
    columns: tuple[tuple[str, str], ...] = ()  # (ours, theirs)
    note: str = ""

    def where(self) -> str:
        return f"{self.repo}{'/' + self.file if self.file else ''}@{(self.revision or 'main')[:10]}"


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
    # split -> the pairs the papers evaluate on (SentEval's counts): a copy with another number is refused
    sizes: dict[str, int] = field(default_factory=dict)
    subsets: tuple[str, ...] = ()  # STS12-16: the sub-sets SentEval reads, in its order
    # split -> the rows of the full set where the local copy is a sample (wiki1m: 1M; nli-triplets: about 275k,
    # SimCSE §5.1): what a run reads from the hub, for the estimate of a dry run (not checked)
    full_rows: dict[str, int] = field(default_factory=dict)
    # scored pairs whose gold scores are correlated with cosines (STS): a file whose scores are all equal is refused
    # (the correlation is NaN); False for pairs read by label (search's relevant pairs, geometry's positive pairs)
    correlated: bool = True


# SimCSE's data (Gao et al. 2021): its training files and SentEval's evaluation data (senteval.tar). The commit is the
# repository's newest ("update senteval data", 2021-09-03; huggingface.co/datasets/princeton-nlp/datasets-for-simcse/
# commits/main, read 2026-12-01).
SIMCSE_REPO = "princeton-nlp/datasets-for-simcse"
SIMCSE_REVISION = "e145e8bb659b2aa2669f32ef79cb4cdef6c58fef"
SENTEVAL_TAR = "senteval.tar"
_SENTEVAL_NOTE = "SentEval's Moses-tokenized copy, the text SimCSE evaluated on"


def _senteval(reader: str) -> HubSource:
    return HubSource(SIMCSE_REPO, SIMCSE_REVISION, reader, file=SENTEVAL_TAR)


def _sts_year(name: str, folder: str, subsets: list[str], size: int) -> DatasetDecl:
    return DatasetDecl(
        name=name,
        kind="scored_pairs",
        description=f"{folder} test, all gold-scored pairs of {len(subsets)} sub-sets ({', '.join(subsets)})",
        local={"test": tuple(f"sts/{folder}/{s}.tsv" for s in subsets)},
        hub={"test": _senteval("senteval_sts")},
        default_split="test",
        sizes={"test": size},
        subsets=tuple(subsets),
    )


# (folder, SentEval's sub-sets, gold-scored pairs: SentEval's and the papers' counts)
STS_YEARS = {
    "sts12": ("STS12", ["MSRpar", "MSRvid", "SMTeuroparl", "surprise.OnWN", "surprise.SMTnews"], 3108),
    "sts13": ("STS13", ["FNWN", "headlines", "OnWN"], 1500),
    "sts14": ("STS14", ["deft-forum", "deft-news", "headlines", "images", "OnWN", "tweet-news"], 3750),
    "sts15": ("STS15", ["answers-forums", "answers-students", "belief", "headlines", "images"], 3000),
    "sts16": ("STS16", ["answer-answer", "headlines", "plagiarism", "postediting", "question-question"], 1186),
}

# STS17 (Cer et al. 2017) on the hub: MTEB's copy, at the revision the installed mteb 2.26 reads
# (mteb/tasks/sts/multilingual/sts17_crosslingual_sts.py). That revision ("fast loading", 2026) holds one `default`
# config with a `lang` column (mteb's AbsTask.fast_load), not a config per track.
STS17_REPO = "mteb/sts17-crosslingual-sts"
STS17_REVISION = "faeb762787bd10488a50c8b5be4a3b82e411949c"
STS17_TRACKS = {  # local file stem -> `lang` of the hub copy (None: no hub copy of that track)
    "ar-ar": "ar-ar",
    "ar-en": None,
    "es-es": "es-es",
    "es-en.track4a": None,
    "es-en.track4b": None,
    "en-en": "en-en",
}

DATASETS: dict[str, DatasetDecl] = {
    **{k: _sts_year(k, folder, subsets, n) for k, (folder, subsets, n) in STS_YEARS.items()},
    "stsb": DatasetDecl(
        name="stsb",
        kind="scored_pairs",
        description="STS Benchmark (Cer et al. 2017): train 5,749 / dev 1,500 / test 1,379 pairs",
        local={s: (f"sts/STSB/{s}.tsv",) for s in ("train", "dev", "test")},
        hub={s: _senteval("senteval_stsb") for s in ("train", "dev", "test")},
        default_split="test",
        sizes={"train": 5749, "dev": 1500, "test": 1379},
    ),
    "sickr": DatasetDecl(
        name="sickr",
        kind="scored_pairs",
        description="SICK relatedness (scores 1-5): train 4,500 / dev (trial) 500 / test 4,927 pairs",
        local={s: (f"sts/SICK-R/{s}.tsv",) for s in ("train", "dev", "test")},
        hub={s: _senteval("senteval_sick") for s in ("train", "dev", "test")},
        default_split="test",
        score_range=(1.0, 5.0),
        sizes={"train": 4500, "dev": 500, "test": 4927},
    ),
    "sts17": DatasetDecl(
        name="sts17",
        kind="scored_pairs",
        description="SemEval-2017 Task 1 (multilingual / cross-lingual STS), 250 pairs a track",
        local={t: (f"sts/STS17/{t}.tsv",) for t in STS17_TRACKS},
        hub={t: HubSource(STS17_REPO, STS17_REVISION, "datasets", split="test", lang=lang)
             for t, lang in STS17_TRACKS.items() if lang},
        default_split="en-en",
        sizes={t: 250 for t in STS17_TRACKS},
    ),
    "quora-duplicates": DatasetDecl(
        name="quora-duplicates",
        kind="scored_pairs",
        description="Quora duplicate question pairs (404,290; score = label, 1 duplicate, 0 different): "
        "semantic search queries and documents (raysent.eval.retrieval)",
        local={"train": ("pairs/quora_duplicates.tsv",)},
        hub={"train": HubSource("sentence-transformers/quora-duplicates", None, "datasets", split="train",
                                config="pair-class", columns=(("score", "label"),))},
        default_split="train",
        score_range=(0.0, 1.0),
        correlated=False,
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
        hub={"train": HubSource(SIMCSE_REPO, SIMCSE_REVISION, "file", file="wiki1m_for_simcse.txt")},
        default_split="train",
        local_notes={"train": "local wiki1m is a sample ({n:,} lines), not the full 1M-sentence file"},
        full_rows={"train": 1_000_000},
    ),
    "nli-triplets": DatasetDecl(
        name="nli-triplets",
        kind="triplets",
        description="(premise, entailment, contradiction) triplets: SimCSE's nli_for_simcse.csv "
        "(SNLI+MNLI, ~275k) on the hub; SNLI dev+test triplets (6,503) locally",
        local={"train": ("nli/snli_dev_triplets.tsv", "nli/snli_test_triplets.tsv")},
        hub={"train": HubSource(SIMCSE_REPO, SIMCSE_REVISION, "file", file="nli_for_simcse.csv")},
        default_split="train",
        local_notes={"train": "local nli-triplets are built from SNLI dev+test ({n:,} triplets), "
                     "not SimCSE's SNLI+MNLI train set"},
        full_rows={"train": 275_000},
    ),
    "snli": DatasetDecl(
        name="snli",
        kind="nli_pairs",
        description="SNLI labelled pairs (premise, hypothesis, entailment/neutral/contradiction)",
        local={"dev": ("nli/snli_dev.tsv",), "test": ("nli/snli_test.tsv",)},
        hub={s: HubSource("stanfordnlp/snli", None, "datasets", split=theirs, config="plain_text")
             for s, theirs in (("train", "train"), ("dev", "validation"), ("test", "test"))},
        default_split="train",
    ),
}

# STS evaluation suite in the papers' column order.
STS_TASKS = ("sts12", "sts13", "sts14", "sts15", "sts16", "stsb", "sickr")
TRAIN_KINDS = ("sentences", "triplets", "nli_pairs", "scored_pairs")


def data_dir() -> Path | None:
    d = os.environ.get("RAYSENT_DATA_DIR")
    return Path(d).expanduser() if d else None


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
        else:
            check_size(decl, split, data, " + ".join(str(f) for f in files))
        return data
    hub = decl.hub.get(split)
    root = data_dir()
    where = " and ".join(str((root or Path("$RAYSENT_DATA_DIR")) / p) for p in decl.local.get(split, ()))
    local = (f"not in {where}" + ("" if root else " (RAYSENT_DATA_DIR is not set)")) if where else "no local copy"
    if hub is None:
        raise DataError(f"data set '{decl.name}:{split}' not found: {local}, and no hub copy is declared for it. "
                        "Fix: set RAYSENT_DATA_DIR to a folder with the layout of shared/data (see "
                        "docs/experiments.md, 'Local data and models')")
    try:
        return _read_hub(decl, split, hub)
    except DataError as exc:
        raise DataError(f"{exc} (data set '{decl.name}:{split}': {local}; then the hub)") from None


def check_size(decl: DatasetDecl, split: str, data: Data, source: str) -> None:
    """Refuse a copy of an evaluation set whose number of pairs is not the papers' (SentEval's counts)."""
    want = decl.sizes.get(split)
    if want is not None and len(data) != want:
        raise DataError(f"{source}: {decl.name}:{split} has {len(data):,} pairs, but the papers evaluate on {want:,} "
                        "(SentEval's copy): a different split or release would make the numbers incomparable, so it "
                        "is refused. Use SentEval's files (docs/evaluation.md, 'Where the data comes from')")


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
            if decl.correlated:
                refuse_constant_scores(f, t["score"], correlation_use(f"{decl.name}:{split}"))
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
    """Read one split from its pinned hub source, through the Hugging Face cache (offline too: :mod:`.hub`); the
    record's source names the repository and the commit read."""
    what = f"{decl.name}:{split}"
    if hub.reader.startswith("senteval_"):
        path, commit = fetch_file(hub.repo, hub.file or SENTEVAL_TAR, hub.revision, what)
        where = hub_url(hub.repo, commit, path.name)
        if hub.reader == "senteval_sts":
            pairs = read_sts_year(path, decl.name, list(decl.subsets), where, decl.score_range)
            member = STS_FOLDERS[decl.name]
        elif hub.reader == "senteval_stsb":
            pairs = read_stsb(path, split, where, decl.score_range)
            member = STSB_FILES[split]
        else:
            pairs = read_sick(path, split, where, decl.score_range)
            member = SICK_FILES[split]
        scored = ScoredPairs(name=what, source=f"{where}/{member}", sentence1=pairs.sentence1,
                             sentence2=pairs.sentence2, scores=np.asarray(pairs.scores, dtype=np.float64),
                             subsets=pairs.subsets, notes=[hub.note] if hub.note else [])
        if decl.correlated:  # STS12-16: each sub-set's gold file named
            gold = {s: f"{where}/{member}/STS.gs.{s}.txt" for s in decl.subsets}
            check_scores_vary(scored, correlation_use(what), gold if hub.reader == "senteval_sts" else None)
        data: Data = scored
        check_size(decl, split, data, f"{where}/{member}")
        return data
    if hub.reader == "file":
        path, commit = fetch_file(hub.repo, hub.file or "", hub.revision, what)
        data = _load_user_file(path, decl.kind)
        data.name, data.source = what, hub_url(hub.repo, commit, hub.file or "")
        check_size(decl, split, data, data.source)
        return data
    folder, commit = fetch_snapshot(hub.repo, hub.revision, what)
    data = _read_datasets_folder(decl, split, hub, folder, hub_url(hub.repo, commit) + f"[{hub.config or 'default'}:"
                                 f"{hub.split}{'; lang=' + hub.lang if hub.lang else ''}]")
    check_size(decl, split, data, data.source)
    return data


def _read_datasets_folder(decl: DatasetDecl, split: str, hub: HubSource, folder: Path, source: str) -> Data:
    """A split of a hub repository's snapshot through ``datasets.load_dataset`` on the folder: the same resolution
    of its README's configs and data files as on the hub, with no loading script run (datasets >= 4 runs none)."""
    import datasets

    what = f"{decl.name}:{split}"
    try:
        ds = datasets.load_dataset(str(folder), hub.config, split=hub.split)
    except Exception as exc:
        first = str(exc).splitlines()[0][:200] if str(exc) else ""
        raise DataError(f"{what}: {source}: datasets could not read split {hub.split!r} of config "
                        f"{hub.config or 'default'!r} ({type(exc).__name__}: {first})") from None
    cols = dict(hub.columns)
    if hub.lang is not None:
        if "lang" not in ds.column_names:
            raise DataError(f"{what}: {source} has no 'lang' column to pick the track {hub.lang!r} from; its columns: "
                            f"{', '.join(ds.column_names)}")
        ds = ds.filter(lambda row: row["lang"] == hub.lang)

    def col(ours: str) -> list:
        theirs = cols.get(ours, ours)
        if theirs not in ds.column_names:
            raise DataError(f"{what}: {source} has no column {theirs!r}; its columns: {', '.join(ds.column_names)}")
        return list(ds[theirs])

    if decl.kind == "scored_pairs":
        s1, s2, scores = col("sentence1"), col("sentence2"), col("score")
        check_rows(what, source, s1, s2, scores, decl.score_range)
        if decl.correlated:
            refuse_constant_scores(f"{what}: {source}", scores, correlation_use(what))
        return ScoredPairs(name=what, source=source, sentence1=[str(x).strip() for x in s1],
                           sentence2=[str(x).strip() for x in s2], scores=np.asarray(scores, dtype=np.float64),
                           subsets=[""] * len(scores), notes=[hub.note] if hub.note else [])
    if decl.kind == "nli_pairs":
        labels = np.asarray(col("label"), dtype=np.int64)
        keep = labels >= 0  # SNLI marks pairs without a gold label with -1
        p, h = col("premise"), col("hypothesis")
        return NLIPairs(name=what, source=source, premise=[x for x, k in zip(p, keep) if k],
                        hypothesis=[x for x, k in zip(h, keep) if k], labels=labels[keep])
    raise AssertionError(decl.kind)  # pragma: no cover


def check_rows(what: str, source: str, s1: list, s2: list, scores: list, score_range: tuple[float, float]) -> None:
    """The local reader's checks on rows read from the hub: no empty sentence, every score a number in range."""
    lo, hi = score_range
    for i, (a, b, y) in enumerate(zip(s1, s2, scores), start=1):
        if not str(a or "").strip() or not str(b or "").strip():
            raise DataError(f"{what}: {source} row {i}: an empty sentence")
        if y is None or not isinstance(y, (int, float)) or math.isnan(y) or not lo <= y <= hi:
            raise DataError(f"{what}: {source} row {i}: score {y!r} is not a number in [{lo:g}, {hi:g}]")
    if not s1:
        raise DataError(f"{what}: {source} holds no rows")


def correlation_use(what: str) -> str:
    """What a declared STS set is for, as :func:`refuse_constant_scores` says it."""
    return f"{what} (an STS set: its gold scores are correlated with a model's cosines, to select and to test)"


def check_scores_vary(data: ScoredPairs, use: str, files: dict[str, str] | None = None) -> None:
    """Refuse scored pairs whose gold scores are all equal (the whole set, or one of its sub-sets: STS12-16's
    ``mean`` and ``wmean`` correlate each sub-set): their correlation with any model's cosines is NaN. The error
    names the file (``files``: each sub-set's; a local copy's sub-set: its own file) and says what the pairs were read
    for (``use``)."""
    names = list(dict.fromkeys(data.subsets))
    if not (len(names) > 1 or (names and names[0])):
        refuse_constant_scores(data.source, data.scores, use)
        return
    if files is None:  # a local copy: one file a sub-set, in the order of the source
        parts = data.source.split(" + ")
        files = dict(zip(names, parts)) if len(parts) == len(names) else {}
    subset = np.asarray(data.subsets)
    for name in names:
        refuse_constant_scores(files.get(name, f"{data.source} (sub-set {name})"), data.scores[subset == name], use)


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
