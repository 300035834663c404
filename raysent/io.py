"""Files that are never seen half-written (a run record, a summary, a search's state), and the folders they go in."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import sqlite3
import tempfile
from pathlib import Path
from typing import Any

# how a full disk reads in an error's text, where only the text came through (an error Ray passed on, sqlite's)
FULL_DISK_TEXTS = ("No space left on device", "database or disk is full", "Disk quota exceeded")


def is_disk_full(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or an exception it was raised from or during) says the disk is full: ENOSPC or EDQUOT,
    sqlite's SQLITE_FULL (through SQLAlchemy too), or the text of either in an error Ray passed on."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if isinstance(exc, sqlite3.OperationalError) and "disk is full" in str(exc):
            return True
        if any(t in str(exc) for t in FULL_DISK_TEXTS):
            return True
        exc = getattr(exc, "orig", None) or exc.__cause__ or exc.__context__  # .orig: SQLAlchemy's wrapped error
    return False


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write ``obj`` as JSON to ``path`` through a temporary file in the same folder and a rename, so a reader
    (or a crash) sees the old file or the new one, never a part; a failed write (a full disk) removes its
    temporary file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(obj, fh, indent=2, default=str)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def file_in_the_way(folder: str | os.PathLike) -> Path | None:
    """The file that stands where ``folder`` or one of its parents should be a folder, else None (the folder
    exists, or can be created)."""
    for here in (Path(folder), *Path(folder).parents):
        if here.exists():
            return None if here.is_dir() else here
    return None


def not_a_folder(folder: str | os.PathLike) -> str | None:
    """Why ``folder`` cannot be a results folder, in words ("is a file, not a folder"), else None."""
    blocker = file_in_the_way(folder)
    if blocker is None:
        return None
    if blocker == Path(folder):
        return "is a file, not a folder"
    return f"cannot be a folder: {blocker} is a file"
