"""A local Ray that raysent started does not outlive its driver for long.

When the driver is killed (SIGKILL, an out-of-memory kill), Ray's raylet and GCS go with it, but some of the
processes they started are left with parent 1 and keep running (``ray::DashboardAgent`` and
``ray::RuntimeEnvAgent`` were still alive minutes later). So a raysent command that starts a local Ray notes
the driver's pid and the Ray session's folder in a marker file (:func:`note_local_ray`), a clean exit
removes it (:func:`forget_local_ray`), and the next raysent command, whatever it is, stops every process of a
session whose driver is gone (:func:`stop_orphaned_local_ray`), saying so in one line. A Ray the user started
(``ray start``) or another program's is never touched: only sessions raysent noted, and only once their
driver has died.
"""

from __future__ import annotations

import atexit
import json
import os
import tempfile
import time
from pathlib import Path

# Lazy imports: psutil (heavy, and only the functions that need them import them).

# not `<tmp>/raysent/`: a folder of that name in the current folder shadows an editable install of the package
MARKERS = Path(tempfile.gettempdir()) / "raysent-local-ray"


def _marker(pid: int) -> Path:
    return MARKERS / f"driver-{pid}.json"


def note_local_ray(session_dir: str) -> None:
    """Called once this process has started a local Ray whose session folder is ``session_dir``."""
    import psutil

    MARKERS.mkdir(parents=True, exist_ok=True)
    me = psutil.Process()
    # Ray's agents name themselves `ray::DashboardAgent` &c.: their command line does not name the session, so
    # the processes started with it are noted by pid (and start time, against a reused pid)
    started = []
    for p in me.children(recursive=True):
        try:
            started.append([p.pid, p.create_time()])
        except psutil.Error:
            continue
    _marker(me.pid).write_text(json.dumps({"driver_pid": me.pid, "driver_started": me.create_time(),
                                           "session_dir": session_dir, "processes": started}))
    atexit.register(forget_local_ray)  # an exit that runs Python's exit handlers ends Ray too (ray.shutdown's)


def forget_local_ray() -> None:
    """Called when this process stops the local Ray it started."""
    _marker(os.getpid()).unlink(missing_ok=True)


def _alive(pid: int, started: float) -> bool:
    import psutil

    try:
        return abs(psutil.Process(pid).create_time() - started) < 1.0  # not another process under a reused pid
    except psutil.Error:
        return False


def stop_orphaned_local_ray(say=None) -> int:
    """Stop the processes of every local Ray whose raysent driver has died; returns how many were stopped."""
    if not MARKERS.is_dir():
        return 0
    stopped = 0
    for marker in MARKERS.glob("driver-*.json"):
        try:
            note = json.loads(marker.read_text())
        except (OSError, ValueError):
            marker.unlink(missing_ok=True)
            continue
        if _alive(int(note["driver_pid"]), float(note["driver_started"])):
            continue
        n = _stop_session(note["session_dir"], note.get("processes", []))
        marker.unlink(missing_ok=True)
        if n and say is not None:
            say(f"raysent: stopped {n} process(es) of the local Ray that raysent (pid {note['driver_pid']}) started "
                f"and left running when it was killed ({note['session_dir']})")
        stopped += n
    return stopped


def _stop_session(session_dir: str, noted: list) -> int:
    """Terminate, then kill, the session's processes: those noted when it started (still the same processes)
    and any whose command line names the session's folder."""
    import psutil

    name = Path(session_dir).name
    procs = {}
    for pid, started in noted:
        if _alive(int(pid), float(started)):
            procs[int(pid)] = psutil.Process(int(pid))
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if p.pid != os.getpid() and any(name in part for part in (p.info["cmdline"] or [])):
                procs.setdefault(p.pid, p)
        except psutil.Error:
            continue
    return _end(list(procs.values()))


def _end(procs: list) -> int:
    import psutil

    for p in procs:
        try:
            p.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=5)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    deadline = time.time() + 5
    while alive and time.time() < deadline:
        _, alive = psutil.wait_procs(alive, timeout=1)
    return len(procs)
