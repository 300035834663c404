"""Where a search keeps things: its experiment folder under results/, and Tune's storage.

``resources.storage_path`` (a folder every node sees, or s3:// / gs://) holds Tune's experiment state and trial
folders under the experiment's name; without it they are in ``results/<experiment>/tune`` on this machine. A
local storage path is made absolute before any trial starts (:func:`with_absolute_storage`): trials run in
their own folders, and on other nodes.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from raysent.config import ExperimentConfig, with_overrides
from raysent.io import FULL_DISK_TEXTS
from raysent.tracking import experiment_name


def experiment_dir(cfg: ExperimentConfig) -> Path:
    """``results/<experiment>``, absolute."""
    return Path(cfg.tracking.results_dir).resolve() / experiment_name(cfg)


def tune_storage(cfg: ExperimentConfig, exp: Path) -> str:
    """Where Tune keeps the experiment state and trial folders: ``resources.storage_path`` under the experiment's
    name, else results/<experiment>/tune on this machine."""
    if cfg.resources.storage_path:
        root = cfg.resources.storage_path
        root = root if "://" in root else str(Path(root).expanduser().resolve())
        return f"{root.rstrip('/')}/{exp.name}"
    return str(exp / "tune")


def with_absolute_storage(cfg: ExperimentConfig) -> ExperimentConfig:
    """``cfg`` with a local ``resources.storage_path`` made absolute (as the trials, in their own folders and on
    other nodes, must read it); a URI (s3://, gs://) or no storage path leaves it as it is."""
    sp = cfg.resources.storage_path
    if sp and "://" not in sp:
        return with_overrides(cfg, {"resources.storage_path": str(Path(sp).expanduser().resolve())})
    return cfg


# what a process killed in the middle of a write leaves (raysent.io.write_json_atomic's temporary file; a run's
# best model and checkpoint being written, raysent.train.loop and raysent.train.ray_train): removed when the next
# search of the experiment starts, which holds its lock (raysent.tune.lock), so no live write is among them
_TRAINING_LEFTOVERS = (".best-*", ".ckpt-*", ".checkpoint.old", ".restore-*", ".final-*")
_RECORD_FOLDERS = (".", "runs", "stopped")


def remove_leftovers(exp: Path) -> int:
    """Remove the temporary files and folders of writes that never finished in ``exp`` (module note); how many."""
    found: list[Path] = []
    for sub in _RECORD_FOLDERS:
        found += [p for p in (exp / sub).glob(".*.json.*") if p.is_file()]
    for phase in ("search", "final"):
        for pattern in _TRAINING_LEFTOVERS:
            found += (exp / phase).rglob(pattern)
    for p in found:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
    return len(found)


def errored_for_space(run_path: str, since: float = 0.0) -> int:
    """Trials of Tune run ``run_path`` (a local folder) that failed for lack of space (their error written after
    ``since``, a time.time()): their error.txt says so, or their error.pkl is empty (written when nothing more could
    be); 0 for a URI, whose trials are not read here."""
    if "://" in run_path:
        return 0
    root, n = Path(run_path), 0
    for trial in (p for p in root.iterdir() if p.is_dir()) if root.is_dir() else ():
        pkl, txt = trial / "error.pkl", trial / "error.txt"
        text = txt.read_text(errors="replace") if txt.is_file() else ""
        written = max((p.stat().st_mtime for p in (pkl, txt) if p.is_file()), default=0.0)
        empty = pkl.is_file() and pkl.stat().st_size == 0
        if written >= since and (empty or any(t in text for t in FULL_DISK_TEXTS)):
            n += 1
    return n


def space_ran_out(cfg: ExperimentConfig, exp: Path, since: float) -> bool:
    """Whether a trial of one of the experiment's Tune runs failed for lack of space since ``since``: a search whose
    disk filled can end in an error that does not say so (Tune's "EOFError: Ran out of input", reading the
    error.pkl the full disk left empty)."""
    storage = tune_storage(cfg, exp)
    root = Path(storage)
    if "://" in storage or not root.is_dir():
        return False
    return any(errored_for_space(str(run), since) for run in root.iterdir() if run.is_dir())
