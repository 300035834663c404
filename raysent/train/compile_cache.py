"""One compile per search: the compiler's caches of an experiment's trials, in ``results/<experiment>/compile-cache``.

A compiled encoder (``train.compile``) is compiled again by every new process: a new trial process, each Ray Train
worker. What torch.compile makes is cached on disk by content, not by process: inductor's FX-graph cache (the
generated code of each graph, keyed by the graph, its input shapes and torch's configuration: ``fxgraph/``), AOT
autograd's cache (the forward and backward graphs: ``aotautograd/``) and Triton's cache (compiled GPU kernels). Every
one lives under ``TORCHINDUCTOR_CACHE_DIR`` (Triton's under ``TRITON_CACHE_DIR``, by default
``$TORCHINDUCTOR_CACHE_DIR/triton/<device>``; torch/_inductor/runtime/cache_dir_utils.py). So a search points
both at its experiment's folder (:func:`use`) before Ray starts: the trial processes inherit them, and Tune trials
and Ray Train workers are given them (``raysent.train.ray_train.FORWARDED_ENV``, as absolute paths; :func:`take`).
The first trial compiles and fills the folder; a later one, in any process on a machine that sees the folder, finds
its graphs there (the same model, dropout, batch and widths give the same graphs: the learning rate, the temperature
and the seed do not enter them) and skips inductor's and Triton's compiles; only dynamo's trace of the model runs
again.

(torch's default folder, ``/tmp/torchinductor_<user>``, is also shared by one user's processes on one machine; the
experiment's folder is shared wherever ``results/`` is, survives a cleaned /tmp, and is the experiment's to delete.
PyTorch's portable cache artifacts, ``torch.compiler.save_cache_artifacts`` / ``load_cache_artifacts``, carry the
same entries as bytes between machines without a shared folder; raysent does not use them yet.)

An exported ``TORCHINDUCTOR_CACHE_DIR`` or ``TRITON_CACHE_DIR`` wins. Entries are written atomically (a temporary
file renamed), so trials running at once can share the folder. ``tests/train/test_compile_cache.py`` compiles a
model in two processes with one folder: the second finds every graph in the cache.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from raysent.config import ExperimentConfig

FOLDER = "compile-cache"
INDUCTOR_VAR = "TORCHINDUCTOR_CACHE_DIR"
TRITON_VAR = "TRITON_CACHE_DIR"
VARS = (INDUCTOR_VAR, TRITON_VAR)

_ours: dict[str, str] = {}  # what use() set in this process, by variable


def folder(cfg: ExperimentConfig) -> Path:
    """``results/<experiment>/compile-cache`` of ``cfg``, absolute."""
    from raysent.tracking import experiment_name

    return Path(cfg.tracking.results_dir).resolve() / experiment_name(cfg) / FOLDER


def _torch_default(var: str) -> str | None:
    """The value torch itself puts into ``var`` when it compiles with none set (cache_dir() writes it back), in a
    process that imported torch; None otherwise."""
    if "torch" not in sys.modules or var != INDUCTOR_VAR:
        return None
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    return os.path.abspath(default_cache_dir())


def use(where: str | Path) -> dict[str, str]:
    """Point this process's compiler caches, and those of the processes it starts, at ``where``: inductor's there,
    Triton's in ``where/triton``. A variable exported by the user is kept. Returns the variables as they now are."""
    where = Path(where).resolve()
    wanted = {INDUCTOR_VAR: str(where), TRITON_VAR: str(where / "triton")}
    for var, value in wanted.items():
        current = os.environ.get(var)
        if current is None or current == _ours.get(var) or current == _torch_default(var):
            os.environ[var] = value
            _ours[var] = value
    return {var: os.environ[var] for var in VARS}


def use_for(cfg: ExperimentConfig) -> dict[str, str] | None:
    """:func:`use` the experiment's folder when its runs may compile (``train.compile`` auto or true); None when
    ``train.compile`` is false."""
    if cfg.train.compile is False:
        return None
    return use(folder(cfg))


def take(env: dict[str, str]) -> None:
    """In a trial process or Ray Train worker: the driver's compiler-cache variables from ``env`` (what
    ``worker_env`` forwarded), when the folder above the cache (the experiment's, for a search) exists on this
    node, so that torch can create the cache there; on a node without it the process keeps its own (torch's
    default folder). Both variables or neither."""
    where = env.get(INDUCTOR_VAR)
    if where and Path(where).parent.is_dir():
        for var in VARS:
            if var in env:
                os.environ[var] = env[var]
