"""SentEval's STS data as SimCSE distributes it: ``senteval.tar`` of ``princeton-nlp/datasets-for-simcse``.

This is the data the SimCSE paper (and the papers that follow its evaluation) scored STS12-16, STS-B and SICK-R on:
SentEval's files, with STS12-16's sub-sets and SentEval's splits (STS-B 5,749 / 1,500 / 1,379; SICK-R 4,500 / 500 /
4,927, not the 4,439 / 495 / 4,906 of the full SICK release that other hub copies carry).

The layout read, and where it comes from:

* SimCSE's ``SentEval/data/downstream/download_dataset.sh`` (github.com/princeton-nlp/SimCSE) fetches
  ``https://huggingface.co/datasets/princeton-nlp/datasets-for-simcse/resolve/main/senteval.tar`` and unpacks it in
  SentEval's ``data/downstream/``;
* SentEval's ``senteval/engine.py`` then reads ``downstream/STS/STS1X-en-test``, ``downstream/STS/STSBenchmark`` and
  ``downstream/SICK``; its ``senteval/sts.py`` reads, in those folders, ``STS.input.<sub-set>.txt`` (two
  tab-separated sentences a line) with ``STS.gs.<sub-set>.txt`` (a gold score a line, empty for a pair without
  one, which is left out), ``sts-{train,dev,test}.csv`` (tab-separated, no header: genre, file, year, id, score,
  sentence 1, sentence 2, and on some lines more fields, which it ignores), and ``SICK_{train,trial,
  test_annotated}.txt`` (a header, then pair id, sentence A, sentence B, relatedness, entailment);
* SentEval's ``data/downstream/get_transfer_data.bash`` made those files: STS12-16 and STS-B Moses-tokenized and
  lower-cased, SICK Moses-tokenized.

So the archive's members end in ``STS/STS12-en-test/STS.input.MSRpar.txt`` and so on; whatever folder the archive
puts above ``STS/`` and ``SICK/`` (none, ``./`` or ``downstream/``) is found from the members, not assumed. A
sentence is its whitespace-separated tokens joined by one space, as SentEval splits them and SimCSE's batcher joins
them (``' '.join(s)``). tests/data/test_hub.py lays out an archive of this layout from ../shared/data and reads it
through the real code.

Imports no Ray, MLflow, torch or datasets.
"""

from __future__ import annotations

import math
import tarfile
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from raysent.errors import DataError

STS_FOLDERS = {f"sts1{i}": f"STS/STS1{i}-en-test" for i in range(2, 7)}
STSB_FILES = {"train": "STS/STSBenchmark/sts-train.csv", "dev": "STS/STSBenchmark/sts-dev.csv",
              "test": "STS/STSBenchmark/sts-test.csv"}
SICK_FILES = {"train": "SICK/SICK_train.txt", "dev": "SICK/SICK_trial.txt", "test": "SICK/SICK_test_annotated.txt"}
ANCHOR = STSB_FILES["test"]  # a member every such archive has: where STS/ and SICK/ sit inside it
FOLDERS = ("STS", "SICK", "MR", "CR", "SUBJ", "MPQA", "SST", "TREC", "MRPC")  # what is read of it
LATIN1 = ("MR", "CR", "SUBJ", "MPQA", "TREC")  # SentEval's loaders read these as latin-1, the others as UTF-8


@dataclass
class Pairs:
    """Scored pairs as read from the archive, each pair with its sub-set's name ('' for a set without sub-sets)."""

    sentence1: list[str] = field(default_factory=list)
    sentence2: list[str] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    subsets: list[str] = field(default_factory=list)

    def add(self, other: Pairs) -> None:
        for name in ("sentence1", "sentence2", "scores", "subsets"):
            getattr(self, name).extend(getattr(other, name))


@lru_cache(maxsize=2)
def _members(path: str, size: int, mtime: float) -> dict[str, bytes]:
    """The STS/ and SICK/ files of the archive at ``path`` by their path below the archive's own top folder (read
    once per process and archive: ``size`` and ``mtime`` make a replaced file read again)."""
    try:
        with tarfile.open(path) as tar:
            names = [m for m in tar.getmembers() if m.isfile()]
            anchors = [m.name for m in names if m.name.endswith(ANCHOR)]
            if len(anchors) != 1:
                raise DataError(f"{path}: not SentEval's data archive: {len(anchors)} members end in {ANCHOR} "
                                "(expected one)")
            prefix = anchors[0][: -len(ANCHOR)]
            out = {}
            for m in names:
                rel = m.name[len(prefix):]
                if m.name.startswith(prefix) and rel.split("/", 1)[0] in FOLDERS:
                    f = tar.extractfile(m)
                    if f is not None:
                        out[rel] = f.read()
            return out
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise DataError(f"{path}: cannot be read as a tar archive ({type(exc).__name__}: {exc}); the download may be "
                        "incomplete: delete it from the Hugging Face cache (`hf cache rm`) and read it again") from None


def read_labelled(path: Path, task: str, rels: tuple[str, ...], where: str,
                  label_names: tuple[str, ...]) -> tuple[list[str], list[int]]:
    """A single-sentence task's split (texts, label ids) as SentEval reads it: MR/CR/SUBJ/MPQA one file per label,
    the label-1 file first (``binary.py``); SST-2 ``sentence<TAB>label`` (``sst.py``); TREC ``LABEL:fine text``,
    the coarse label (``trec.py``). Empty lines are left out."""
    files = members(path)
    texts: list[str] = []
    ids: list[int] = []
    encoding = "latin-1" if task in LATIN1 else "utf-8"
    for k, rel in enumerate(rels):
        if rel not in files:
            raise DataError(f"{where}: the archive has no {rel} (SentEval's layout: {Path(rel).parent}/)")
        for i, line in enumerate(files[rel].decode(encoding).splitlines(), start=1):
            if not line.strip():
                continue
            if task == "TREC":
                target, _, rest = line.strip().partition(":")
                text = rest.split(" ", 1)[1] if " " in rest else ""
                label = target
            elif task == "SST2":
                text, _, label = line.strip().rpartition("\t")
            else:
                text, label = line, str(1 - k)  # the label-1 file first, then the label-0 one
            if label not in label_names:
                raise DataError(f"{where}/{rel} line {i}: label {label!r} is not one of {', '.join(label_names)}")
            texts.append(_text(text, rel, i, where, "sentence"))
            ids.append(label_names.index(label))
    return texts, ids


def read_mrpc(path: Path, rel: str, where: str) -> tuple[list[str], list[str], list[int]]:
    """MRPC's split as SentEval's ``mrpc.py`` reads it: after the header, quality, ids, sentence 1, sentence 2."""
    s1: list[str] = []
    s2: list[str] = []
    y: list[int] = []
    for i, line in enumerate(_lines(members(path), rel, where)[1:], start=2):
        if not line.strip():
            continue
        fields = line.strip().split("\t")
        if len(fields) < 5 or fields[0] not in ("0", "1"):
            raise DataError(f"{where}/{rel} line {i}: expected quality (0 or 1), #1 ID, #2 ID, #1 String, #2 String")
        y.append(int(fields[0]))
        s1.append(_text(fields[3], rel, i, where, "#1 String"))
        s2.append(_text(fields[4], rel, i, where, "#2 String"))
    return s1, s2, y


def members(path: Path) -> dict[str, bytes]:
    st = path.stat()
    return _members(str(path), st.st_size, st.st_mtime)


def _lines(files: dict[str, bytes], rel: str, where: str) -> list[str]:
    if rel not in files:
        raise DataError(f"{where}: the archive has no {rel} (SentEval's layout: {Path(rel).parent}/)")
    try:
        return files[rel].decode("utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise DataError(f"{where}/{rel}: not valid UTF-8 ({exc.reason})") from None


def _score(value: str, rel: str, line: int, where: str, score_range: tuple[float, float]) -> float:
    lo, hi = score_range
    try:
        num = float(value)
    except ValueError:
        raise DataError(f"{where}/{rel} line {line}: score {value!r} is not a number; expected a number in "
                        f"[{lo:g}, {hi:g}]") from None
    if math.isnan(num) or not lo <= num <= hi:
        raise DataError(f"{where}/{rel} line {line}: score {value} is outside the allowed range [{lo:g}, {hi:g}]")
    return num


def _text(value: str, rel: str, line: int, where: str, column: str) -> str:
    text = " ".join(value.split())
    if not text:
        raise DataError(f"{where}/{rel} line {line}: {column} is empty")
    return text


def read_sts_year(path: Path, name: str, subsets: list[str], where: str,
                  score_range: tuple[float, float] = (0.0, 5.0)) -> Pairs:
    """STS12-16 (``name``) with each pair's sub-set: every pair of ``STS.input.<sub-set>.txt`` whose line of
    ``STS.gs.<sub-set>.txt`` holds a score (SentEval's ``STSEval.loadFile``)."""
    files, folder = members(path), STS_FOLDERS[name]
    out = Pairs()
    for sub in subsets:
        inputs = _lines(files, f"{folder}/STS.input.{sub}.txt", where)
        gold = _lines(files, f"{folder}/STS.gs.{sub}.txt", where)
        rel = f"{folder}/STS.input.{sub}.txt"
        if len(inputs) != len(gold):
            raise DataError(f"{where}/{folder}: STS.input.{sub}.txt has {len(inputs)} lines and STS.gs.{sub}.txt "
                            f"{len(gold)}: a gold line is needed for every pair")
        for i, (pair, g) in enumerate(zip(inputs, gold), start=1):
            if not g.strip():
                continue  # no gold score: SentEval leaves the pair out
            fields = pair.split("\t")
            if len(fields) != 2:
                raise DataError(f"{where}/{rel} line {i}: {len(fields)} tab-separated field(s), expected 2 sentences")
            out.sentence1.append(_text(fields[0], rel, i, where, "sentence 1"))
            out.sentence2.append(_text(fields[1], rel, i, where, "sentence 2"))
            out.scores.append(_score(g.strip(), f"{folder}/STS.gs.{sub}.txt", i, where, score_range))
            out.subsets.append(sub)
    return out


def read_stsb(path: Path, split: str, where: str, score_range: tuple[float, float] = (0.0, 5.0)) -> Pairs:
    """STS-B's ``split`` (train/dev/test): fields 5-7 of each line (SentEval's ``STSBenchmarkEval.loadFile``)."""
    rel = STSB_FILES[split]
    out = Pairs()
    for i, line in enumerate(_lines(members(path), rel, where), start=1):
        if not line.strip():
            continue
        fields = line.strip().split("\t")
        if len(fields) < 7:
            raise DataError(f"{where}/{rel} line {i}: {len(fields)} tab-separated field(s), expected at least 7 "
                            "(genre, file, year, id, score, sentence 1, sentence 2)")
        out.scores.append(_score(fields[4], rel, i, where, score_range))
        out.sentence1.append(_text(fields[5], rel, i, where, "sentence 1"))
        out.sentence2.append(_text(fields[6], rel, i, where, "sentence 2"))
        out.subsets.append("")
    return out


def read_sick(path: Path, split: str, where: str, score_range: tuple[float, float] = (1.0, 5.0)) -> Pairs:
    """SICK-R's ``split`` (train/dev = SICK's trial set/test): after the header, fields 2-4 of each line (SentEval's
    ``SICKRelatednessEval.loadFile``)."""
    rel = SICK_FILES[split]
    out = Pairs()
    for i, line in enumerate(_lines(members(path), rel, where)[1:], start=2):
        if not line.strip():
            continue
        fields = line.strip().split("\t")
        if len(fields) < 4:
            raise DataError(f"{where}/{rel} line {i}: {len(fields)} tab-separated field(s), expected at least 4 "
                            "(pair_ID, sentence_A, sentence_B, relatedness_score)")
        out.sentence1.append(_text(fields[1], rel, i, where, "sentence_A"))
        out.sentence2.append(_text(fields[2], rel, i, where, "sentence_B"))
        out.scores.append(_score(fields[3], rel, i, where, score_range))
        out.subsets.append("")
    return out
