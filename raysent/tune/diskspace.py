"""A full disk during a search: the space a search needs, and the one error that says so (issue 60).

A disk that fills in the middle of a search fails it in many places at once: a trial's checkpoint (Ray reports
it as the trial's error, "No space left on device" deep in a traceback), a run record, sqlite's "database or disk
is full" in the MLflow store, an empty ``error.pkl`` Ray writes for the failed trial.
:func:`raysent.io.is_disk_full` finds any of them in an exception's chain (or in the text Ray's errors carry), and
:func:`disk_full` is the one error the
search ends with: the folder, the space left, the space the search needs, and the way on (`--resume` retries the
trials that failed, :mod:`raysent.tune.driver`).

The estimate (:func:`space_needed`) counts the model copies a search writes (raysent.train.loop and
raysent.tune.trial): every run keeps its best model (one copy of the weights); a training run holds, besides,
its newest checkpoint (the weights and AdamW's two moments: three copies) and, while it replaces that, the one
before (three more); ``search.keep_checkpoints`` keeps every run's last checkpoint. The tokenizer and configs are
small against the weights and not counted.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from raysent.config import ExperimentConfig
from raysent.errors import RaysentError
from raysent.models.locate import resolve_model

WEIGHTS = ("*.safetensors", "pytorch_model*.bin")
# copies of the weights (see above): a run's best model, and a training run's checkpoint and the one it replaces
KEPT_PER_RUN = 1
HELD_WHILE_TRAINING = 6
CHECKPOINT = 3



class DiskFull(RaysentError):
    """The disk a search writes to filled up (exit 2); with space freed, `--resume` goes on."""


def weights_bytes(model: str, revision: str | None = None) -> int | None:
    """Bytes of a local model's weights (its safetensors or .bin files), None when it is not on this machine."""
    try:
        where, _ = resolve_model(model, revision)
    except RaysentError:
        return None
    folder = Path(where)
    if not folder.is_dir():
        return None
    sizes = [p.stat().st_size for pattern in WEIGHTS for p in folder.glob(pattern)]
    return sum(sizes) or None


def space_needed(cfg: ExperimentConfig, search_runs: int, at_once: int | None = None) -> int | None:
    """The bytes a search of ``cfg`` writes at most (its estimate, module docstring): ``search_runs`` runs in the
    search phase (0: the final phase alone), ``at_once`` trials training at once (default: the config's resolved
    ``search.max_concurrent_trials``, 1 while it is auto); None when the model's size is not known here (a hub model
    not downloaded yet)."""
    size = weights_bytes(cfg.model.name, cfg.model.revision)
    if size is None:
        return None
    runs = search_runs + 2 * len(cfg.seeds)  # the final phase: the searched best and the warm-start configuration
    if at_once is None:
        value = cfg.search.max_concurrent_trials if cfg.search is not None else 1
        at_once = value if isinstance(value, int) else 1
    copies = runs * KEPT_PER_RUN + at_once * HELD_WHILE_TRAINING
    if cfg.search is not None and cfg.search.keep_checkpoints:
        copies += runs * CHECKPOINT
    return size * copies


def in_words(needed: int | None) -> str:
    """``needed`` bytes as `--dry-run` and the full-disk error say them."""
    if needed is None:
        return "not known here (the model is not on this machine yet)"
    return f"about {_mb(needed)} at most (raysent.tune.diskspace: the model copies its runs keep)"


def _mb(n: float) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"


def disk_full(folder: Path, needed: int | None, source: str) -> DiskFull:
    """The one error a search ends with when its disk filled: the folder, the space left, the space needed."""
    probe = next((p for p in (folder, *folder.parents) if p.exists()), Path("/"))
    free = shutil.disk_usage(probe).free
    need = f"; the search needs {in_words(needed)}" if needed else ""
    return DiskFull(f"the disk of {folder} ran out of space ({_mb(free)} free now{need}). Free space there, then "
                    f"run `raysent tune {source} --resume`: it retries the trials that failed for lack of space, "
                    "and keeps every finished run")


__all__ = ["DiskFull", "disk_full", "in_words", "space_needed", "weights_bytes"]
