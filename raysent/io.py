"""Files that are never seen half-written (a run record, a summary, a search's state), and the folders they go in."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write ``obj`` as JSON to ``path`` through a temporary file in the same folder and a rename, so a reader
    (or a crash) sees the old file or the new one, never a part."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as fh:
        json.dump(obj, fh, indent=2, default=str)
    os.replace(tmp, path)


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
