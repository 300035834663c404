"""Models read from disk once per process: for a process that trains one run after another (a Tune trial process
that Tune reuses for the next trial, :func:`raysent.train.run.reuse_across_runs`), each run gets its own fresh
copy of the weights the first run read.

A copy is exactly what :meth:`Encoder.load <raysent.models.encoder.Encoder.load>` would give at that point, and
leaves torch's random generator where the load would. Loading is not free of randomness: weights the checkpoint
lacks are initialised from torch's generator (BERT's pooler in an MLM checkpoint, ``Encoder.random_init``), and
the heads a method builds next draw from the generator where the load left it. So the cache keeps, beside the
weights read from disk, for each generator state a load started from (``build_method`` seeds it just before: one
state per seed), the weights it drew and the state it left; a copy for a state not seen yet is a real load (whose
draws are then kept). A load that drew from the generator for weights it does not name is not cached.

Off unless enabled (:func:`enable`): a process that trains once gains nothing and would hold a second copy.
Kept: the :data:`KEPT_MODELS` models used last (a method's stages read two); a folder whose files changed
(size, modification time) is read again.
"""

from __future__ import annotations

import copy
import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import torch

from raysent.models.encoder import Encoder
from raysent.models.locate import locate_model

KEPT_MODELS = 2
KEPT_DRAWS = 16  # generator states (seeds) remembered per model

_lock = threading.Lock()
_enabled = False


@dataclass
class _Read:
    """One model as read from disk, and what loading it drew from each generator state it started from."""

    template: Encoder  # never trained: every load gets a copy
    drew: bool  # loading draws from torch's generator (else the copy is the same from any generator state)
    draws: OrderedDict[bytes, tuple[dict[str, torch.Tensor], torch.Tensor]] = field(default_factory=OrderedDict)


_models: OrderedDict[tuple, _Read] = OrderedDict()


def enable(on: bool = True) -> None:
    """Keep what :func:`load_encoder` reads for the next run of this process (``on=False``: stop, and forget it)."""
    global _enabled
    with _lock:
        _enabled = on
        if not on:
            _models.clear()


def clear() -> None:
    with _lock:
        _models.clear()


def signature(where: str) -> tuple:
    """What identifies a model's files: its folder's files with their sizes and modification times (a hub id
    stands for itself)."""
    path = Path(where)
    if not path.is_dir():
        return (where,)
    files = []
    for f in sorted(path.rglob("*")):
        if f.is_file():
            st = f.stat()
            files.append((str(f.relative_to(path)), st.st_size, st.st_mtime_ns))
    return (str(path.resolve()), tuple(files))


def _state_key(state: torch.Tensor) -> bytes:
    return hashlib.sha1(state.numpy().tobytes()).digest()


def _copy(template: Encoder) -> Encoder:
    """A fresh encoder with the template's weights (the tokenizer, which nothing changes, is shared)."""
    enc = Encoder(copy.deepcopy(template.model), template.tokenizer, source=template.source,
                  has_trained_pooler=template.has_trained_pooler, meta=copy.deepcopy(template.meta),
                  head=copy.deepcopy(template.head))
    enc.random_init = template.random_init
    return enc


def load_encoder(name: str, dropout: float | None = None, revision: str | None = None) -> Encoder:
    """``Encoder.load(name, dropout=dropout, revision=revision)``; from this process's cache when enabled (see the
    module)."""
    if not _enabled:
        return Encoder.load(name, dropout=dropout, revision=revision)
    where, _ = locate_model(name, revision)
    key = (signature(where), dropout)
    before = torch.random.get_rng_state()
    state = _state_key(before)
    with _lock:
        read = _models.get(key)
        if read is not None:
            _models.move_to_end(key)
            drawn = read.draws.get(state)
            if drawn is not None or not read.drew:
                enc = _copy(read.template)
                if drawn is not None:
                    weights, after = drawn
                    own = enc.model.state_dict()
                    with torch.no_grad():
                        for k, v in weights.items():
                            own[k].copy_(v)
                    torch.random.set_rng_state(after)
                return enc
    enc = Encoder.load(name, dropout=dropout, revision=revision)
    after = torch.random.get_rng_state()
    drew = not torch.equal(before, after)
    if drew and not enc.random_init:
        return enc  # it drew for something it does not name: a copy could not be exact
    weights = {k: v.detach().clone() for k, v in enc.model.state_dict().items() if k in enc.random_init}
    with _lock:
        if not _enabled:
            return enc
        read = _models.get(key)
        if read is None:
            read = _models[key] = _Read(template=_copy(enc), drew=drew)
            while len(_models) > KEPT_MODELS:
                _models.popitem(last=False)
        if drew:
            read.draws[state] = (weights, after)
            while len(read.draws) > KEPT_DRAWS:
                read.draws.popitem(last=False)
    return enc


__all__ = ["KEPT_MODELS", "clear", "enable", "load_encoder", "signature"]
