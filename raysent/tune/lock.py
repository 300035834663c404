"""One search per experiment folder at a time.

Two `raysent tune` runs of one experiment would share results/<experiment>/: the later one's state.json,
summary.json and best.yaml would replace the other's, its registry version and MLflow runs would be added beside
the other's, and `--resume` of the first would go on with the second (issue 60). A search holds an exclusive
``flock`` on ``<experiment>/.search.lock`` for as long as it runs; a second one is refused with the holder's
search id and process. The operating system releases the lock when the process ends however it ends (SIGKILL, a
lost node), so a killed search never leaves the folder locked: there is no stale lock file to remove by hand.

``flock`` is advisory and local to one machine's kernel (and NFS, where it is emulated with fcntl locks); two
drivers on two machines writing one results folder on a shared file system are not covered.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from raysent.errors import RaysentError

LOCK_FILE = ".search.lock"


class SearchRunning(RaysentError):
    """Another process runs a search of this experiment (exit 2: nothing was written)."""


def _holder(path: Path) -> str:
    """The running search, in words, from what its process wrote into the lock file."""
    try:
        info = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        info = {}
    search = info.get("search") or "(starting)"
    started = info.get("started")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)) if started else "?"
    return f"search {search}, process {info.get('pid', '?')} on {info.get('host', '?')}, started {when}"


class SearchLock:
    """The held lock of one experiment folder; :meth:`name` writes the search's id into it once it has one."""

    def __init__(self, fd: int, path: Path):
        self._fd, self.path = fd, path
        self._info = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(), "search": None}
        self._write()

    def _write(self) -> None:
        data = json.dumps(self._info).encode()
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, data, 0)

    def name(self, search: str) -> None:
        self._info["search"] = search
        self._write()


@contextmanager
def search_lock(exp: Path) -> Iterator[SearchLock]:
    """Hold ``exp``'s search lock for the block (``exp`` is created); :class:`SearchRunning` when another process
    holds it."""
    exp.mkdir(parents=True, exist_ok=True)
    path = exp / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SearchRunning(
                f"{exp}: another search of this experiment is running ({_holder(path)}); two at once would replace "
                "each other's state.json and summary.json. Wait for it to end, stop it (Ctrl-C, or kill the "
                "process), or give this run another name (--set name=NEW)") from None
        yield SearchLock(fd, path)
    finally:
        os.close(fd)  # releases the lock; the file stays (removing it would race a process about to lock it)


__all__ = ["LOCK_FILE", "SearchLock", "SearchRunning", "search_lock"]
