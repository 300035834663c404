"""The untuned model's dev scores, computed once and reused (``train.eval_at_start_cache``).

Every run evaluates its model on the dev sets before the first step: ``initial_dev``, which says whether the
run learned (its best checkpoint beat it). Runs that start from the same weights, read them with the same
pooling and score the same dev sets get the same numbers: every seed of a configuration whose method adds no
seeded head, and every configuration whose hyperparameters leave the model as loaded (the learning rate, the
temperature, the batch size). A search of 8 configurations on 3 seeds otherwise scores the same model 24 times;
on a CPU that is ~6 s on STS-B dev for the 4-layer raw-bert-mini-mlm and ~1 s on SICK-R dev (docs/testing.md).

The key is a SHA-256 of everything the scores depend on:
- every tensor ``embed`` reads (the encoder and any head it pools with: name, dtype, shape and bytes). A pooler
  the checkpoint lacked is drawn from each run's seed (raw-bert-mini-mlm, MLM-only, has none) but read by no
  pooling, so it is left out: without that, every seed of such a model was a key of its own;
- the inference pooling and the evaluation's ``max_length``, batch size and device type;
- each dev set's name and pairs;
- raysent's own source (every ``.py`` file of the package, so that a changed evaluator never reads an older
  score) and the torch and transformers versions.

A score is a JSON file under ``$RAYSENT_CACHE_DIR/initial-dev/`` (default ``~/.cache/raysent``), written
atomically; one that cannot be read is computed again. Runs that start together on one machine compute a key
once: the first takes a lock on it, the others wait for its file. Nothing here changes what a run trains: the
evaluation draws no random numbers, so a run that reuses a score takes the same steps.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from raysent.io import write_json_atomic

SUBDIR = "initial-dev"


def cache_dir() -> Path:
    """``$RAYSENT_CACHE_DIR`` (a Ray worker gets the driver's, raysent.train.ray_train.FORWARDED_ENV), else
    ``~/.cache/raysent``."""
    root = os.environ.get("RAYSENT_CACHE_DIR")
    return Path(root) if root else Path.home() / ".cache" / "raysent"


@functools.cache
def source_digest() -> str:
    """SHA-256 of raysent's own source files (sorted by path): a code change is a new key."""
    root = Path(__file__).resolve().parents[1]  # the package
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def weights_digest(state_dicts: Sequence[Mapping[str, torch.Tensor]]) -> str:
    """SHA-256 of the weights ``embed`` reads (:meth:`raysent.methods.base.Method.embeds_with`), in order: names,
    dtypes, shapes and bytes."""
    h = hashlib.sha256()
    for i, state in enumerate(state_dicts):
        for name, t in state.items():
            t = t.detach()
            h.update(f"{i}.{name}|{t.dtype}|{tuple(t.shape)}|".encode())
            h.update(t.reshape(-1).contiguous().view(torch.uint8).cpu().numpy().tobytes())
    return h.hexdigest()


def key(reads: tuple[Mapping[str, Any], Sequence[Mapping[str, torch.Tensor]]], embedding: Mapping[str, Any],
        dev_sets: Mapping) -> str:
    """The cache key of one evaluation (above). ``reads``: what the method's ``embed`` reads
    (:meth:`raysent.methods.base.Method.embeds_with`); ``embedding``: the Embedder's settings; ``dev_sets``: name ->
    ScoredPairs."""
    import transformers

    described, modules = reads
    h = hashlib.sha256()
    parts = {"reads": dict(described), "weights": weights_digest(modules), "embedding": dict(embedding),
             "raysent": source_digest(), "torch": torch.__version__, "transformers": transformers.__version__}
    h.update(json.dumps(parts, sort_keys=True, default=str).encode())
    for name in sorted(dev_sets):
        d = dev_sets[name]
        h.update(json.dumps([name, list(d.sentence1), list(d.sentence2), [float(s) for s in d.scores]]).encode())
    return h.hexdigest()


def _read(path: Path) -> dict[str, float] | None:
    try:
        stored = json.loads(path.read_text())["scores"]
        return {str(n): float(v) for n, v in stored.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


@contextlib.contextmanager
def _computing(path: Path) -> Iterator[None]:
    """Held by the one process on this machine that computes the scores of ``path``'s key: trials that start
    together (a search's first concurrent trials, every seed of a final phase) wait for its result instead of each
    computing it. The lock goes with its process, so a run that dies leaves nothing held; without a usable lock
    file each process computes for itself."""
    try:
        import fcntl

        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    except (ImportError, OSError):
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def scores(compute: Callable[[], dict], k: str, log: Callable[[str], None] | None = None) -> dict:
    """The scores stored under the key ``k``, else ``compute()``'s, stored for the next run."""
    path = cache_dir() / SUBDIR / f"{k}.json"
    with _computing(path):
        stored = _read(path)
        if stored is not None:
            if log:
                log(f"step 0: the untuned model's dev scores as an earlier run computed them ({path})")
            return stored
        out = compute()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(path, {"scores": out})
        except OSError as exc:  # a read-only home: the run goes on, the next one computes them again
            if log:
                log(f"NOTE: could not keep the untuned model's dev scores in {path.parent} ({exc}); set "
                    "RAYSENT_CACHE_DIR to a writable folder, or train.eval_at_start_cache: false")
        return out
