"""Readers for the plain files raysent trains and evaluates on, with errors that name file and line.

Formats (the layout of ``RAYSENT_DATA_DIR``, see ../shared/data/MANIFEST.md):

* ``.tsv``: tab-separated, first line a header, no quoting (fields never contain tabs).
* ``.csv``: comma-separated with standard double-quote quoting, first line a header.
* ``.txt``: one sentence per line, no header.

A malformed file is never half-read: the first problem found raises :class:`DataError` with the
file, the 1-based line number, what was found and what is allowed.
"""

from __future__ import annotations

import csv
import math
import sys
from pathlib import Path
from typing import Literal

from raysent.errors import DataError

csv.field_size_limit(min(sys.maxsize, 2**31 - 1))


def _open_lines(path: Path):
    try:
        return path.open(encoding="utf-8", newline="")
    except FileNotFoundError:
        raise DataError(f"{path}: file not found") from None
    except IsADirectoryError:
        raise DataError(f"{path}: is a directory, expected a file") from None


def read_table(
    path: str | Path,
    required: list[str],
    numeric: dict[str, tuple[float, float]] | None = None,
    allowed_values: dict[str, set[str]] | None = None,
    non_empty: list[str] | None = None,
) -> dict[str, list]:
    """Read a TSV/CSV file with a header into ``{column: [values]}`` (only ``required`` columns).

    ``numeric`` maps a column to its allowed closed range; its values come back as floats.
    ``allowed_values`` maps a column to the set of values it may hold. ``non_empty`` columns must
    not be blank (default: every required column that is not numeric).
    """
    path = Path(path)
    numeric = numeric or {}
    allowed_values = allowed_values or {}
    non_empty = [c for c in required if c not in numeric] if non_empty is None else non_empty
    suffix = path.suffix.lower()
    quoting: Literal[0, 1, 2, 3]  # csv.QUOTE_* (typeshed's quoting type)
    if suffix == ".tsv":
        delimiter, quoting = "\t", csv.QUOTE_NONE
    elif suffix == ".csv":
        delimiter, quoting = ",", csv.QUOTE_MINIMAL
    else:
        raise DataError(f"{path}: unsupported table format '{suffix or '(none)'}'; allowed: .tsv, .csv")

    with _open_lines(path) as fh:
        reader = csv.reader(fh, delimiter=delimiter, quoting=quoting)
        try:
            header = next(reader)
        except StopIteration:
            raise DataError(
                f"{path}: the file is empty; expected a header line with the columns "
                f"{', '.join(required)}"
            ) from None
        except (csv.Error, UnicodeDecodeError) as exc:
            raise DataError(f"{path} line 1: cannot read the header: {exc}") from None
        header = [h.strip().lstrip("\ufeff") for h in header]
        missing = [c for c in required if c not in header]
        if missing:
            raise DataError(
                f"{path} line 1: missing column(s) {', '.join(repr(m) for m in missing)}; "
                f"the header has {', '.join(repr(h) for h in header) or 'nothing'}; "
                f"expected the columns {', '.join(required)}"
            )
        index = {c: header.index(c) for c in required}
        out: dict[str, list] = {c: [] for c in required}
        try:
            for row in reader:
                line = reader.line_num
                if not row or (len(row) == 1 and not row[0].strip()):
                    continue  # blank line
                if len(row) != len(header):
                    raise DataError(
                        f"{path} line {line}: {len(row)} field(s), expected {len(header)} "
                        f"({', '.join(header)}); "
                        + ("fields are tab-separated and must not contain tabs" if delimiter == "\t"
                           else "quote fields that contain commas")
                    )
                for col, i in index.items():
                    value = row[i].strip()
                    if col in numeric:
                        lo, hi = numeric[col]
                        try:
                            num = float(value)
                        except ValueError:
                            raise DataError(
                                f"{path} line {line}: {col} {value!r} is not a number; "
                                f"expected a number in [{lo:g}, {hi:g}]"
                            ) from None
                        if math.isnan(num) or not lo <= num <= hi:
                            raise DataError(
                                f"{path} line {line}: {col} {value} is outside the allowed range "
                                f"[{lo:g}, {hi:g}]"
                            )
                        out[col].append(num)
                        continue
                    if col in non_empty and not value:
                        raise DataError(f"{path} line {line}: {col} is empty")
                    if col in allowed_values and value not in allowed_values[col]:
                        raise DataError(
                            f"{path} line {line}: {col} {value!r} is not allowed; expected one of "
                            f"{', '.join(sorted(allowed_values[col]))}"
                        )
                    out[col].append(value)
        except csv.Error as exc:
            raise DataError(f"{path} line {reader.line_num}: {exc}") from None
        except UnicodeDecodeError as exc:
            raise DataError(f"{path} line {reader.line_num + 1}: not valid UTF-8 ({exc.reason})") from None
    if not out[required[0]]:
        raise DataError(f"{path}: has a header but no data rows")
    return out


def refuse_constant_scores(where: str | Path, scores, use: str = "an STS set") -> None:
    """Refuse gold scores that are all equal: their correlation with any model's cosines is undefined (Spearman and
    Pearson are NaN), so no checkpoint could be chosen on them and no test number computed. ``where``: the file (or
    hub source) they were read from; ``use``: what they were read for."""
    values = [float(v) for v in scores]
    if values and all(v == values[0] for v in values):
        raise DataError(
            f"{where}: every gold score is {values[0]:g} ({len(values):,} pair(s)): a correlation with scores that "
            f"do not vary is undefined (NaN), so it cannot serve as {use}. Fix: use a file whose pairs have "
            "different gold scores (the whole split, or a sample of it that kept scores of every level)"
        )


def read_lines(path: str | Path) -> list[str]:
    """One sentence per line; blank lines are skipped. Empty files are an error."""
    path = Path(path)
    sentences: list[str] = []
    with _open_lines(path) as fh:
        line_no = 0
        try:
            for line in fh:
                line_no += 1
                s = line.strip()
                if s:
                    sentences.append(s)
        except UnicodeDecodeError as exc:
            raise DataError(f"{path} line {line_no + 1}: not valid UTF-8 ({exc.reason})") from None
    if not sentences:
        raise DataError(f"{path}: the file is empty; expected one sentence per line")
    return sentences
