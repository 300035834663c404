"""``raysent bench --parts profile``: a few training steps of each side under torch.profiler.

raysent's simcse-unsup step goes through the loop's :class:`raysent.train.loop.Stepper` (on the device's resolved
settings), sentence-transformers' MNRL step through its ``SentenceTransformerTrainer`` (a ``TrainerCallback``
calls ``prof.step()``); same model, sentences, batch, length and precision (``auto``: bf16 on a CUDA device that
has it, fp32 on a CPU). Each runs in its own process (the ``profile-*`` kinds of :mod:`raysent.bench.cases`):
``warmup`` untimed steps, one step of the profiler's own warm-up (:func:`profiler`), then ``steps`` recorded steps,
each from one ``prof.step()`` to the next (so data loading is in it, as in a training loop).

From the recorded steps (:func:`summarize`), per step: the aten operators the host dispatched (every one, nested
ones included, and those called from outside another aten operator), the host's wall milliseconds, and the aten
operators that make the host wait for a CUDA device (``.item()``'s ``_local_scalar_dense``, ``nonzero``,
``masked_select``, ``unique``), with where each was called from. They are counted on a CPU too, where they cost
nothing, so a CPU run shows what the step's own code would make a GPU wait on; on a CPU some come from CPU kernels
themselves (the fused AdamW reads each parameter's scalars with ``item``: ``< aten::_fused_adamw_`` in the sources),
which their CUDA kernels do not do. On CUDA also the kernels launched, their time on the device, and the runtime
calls that make the host wait (``cudaStreamSynchronize``, ``cudaDeviceSynchronize``, ``cudaEventSynchronize``, a
blocking ``cudaMemcpy``) and the device-to-host copies. A host event counts for a step when it starts within the
step's span (backward runs on another thread on CUDA, so nesting alone would miss it); the profiler's own wait for
the device when it stops comes after the last span and is left out.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from typing import Any

# Lazy imports: torch (heavy, and only the functions that need it import it).

# aten operators that copy a value to the host and so wait for a CUDA device (boolean indexing reaches nonzero;
# .item() and bool(tensor) reach _local_scalar_dense)
SYNC_OPS = ("aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select", "aten::_unique", "aten::_unique2",
            "aten::unique_dim", "aten::unique_consecutive", "aten::repeat_interleave")
# CUDA runtime and driver calls that block the host until the device is done with earlier work
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy",
              "cudaMemcpy2D", "cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize")
LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
            "cudaLaunchCooperativeKernel", "cudaGraphLaunch")
TOP_OPS = 15


def _is_device(event) -> bool:
    return str(event.device_type).endswith(("CUDA", "PrivateUse1")) or getattr(event, "is_device", False)


def summarize(events: Iterable[Any]) -> dict:
    """Per-step counts from a profiler's recorded events (``prof.events()`` of a run whose recorded window is
    whole steps, each marked by ``prof.step()``)."""
    events = list(events)
    spans = sorted((e.time_range.start, e.time_range.end) for e in events
                   if e.name.startswith("ProfilerStep") and not _is_device(e))
    if not spans:
        raise RuntimeError("the profiler recorded no step (no ProfilerStep span): prof.step() was not called "
                           "inside its recorded window")
    steps = len(spans)

    def in_a_step(t: float) -> bool:
        return any(a <= t <= b for a, b in spans)

    host = [e for e in events if not _is_device(e) and not e.name.startswith("ProfilerStep")
            and in_a_step(e.time_range.start)]
    aten = [e for e in host if e.name.startswith("aten::")]

    def inside_aten(e) -> bool:
        p = e.cpu_parent
        while p is not None:
            if p.name.startswith("aten::"):
                return True
            p = p.cpu_parent
        return False

    def source(e) -> str:
        """Where an operator was called from: its callers up to the first one that is not an aten operator (the
        optimizer, autograd, or the step's own code where there is none)."""
        chain, p = [e.name], e.cpu_parent
        while p is not None and not p.name.startswith("ProfilerStep"):
            chain.append(p.name)
            if not p.name.startswith("aten::"):
                break
            p = p.cpu_parent
        return " < ".join(chain)

    counts = Counter(e.name for e in aten)
    sources = Counter(source(e) for e in aten if e.name in SYNC_OPS)
    out: dict[str, Any] = {
        "steps": steps,
        "ops_per_step": len(aten) / steps,
        "top_level_ops_per_step": sum(1 for e in aten if not inside_aten(e)) / steps,
        "host_ms_per_step": sum(b - a for a, b in spans) / steps / 1000.0,
        "sync_ops_per_step": {name: counts[name] / steps for name in SYNC_OPS if counts[name]},
        "sync_op_sources": {where: n / steps for where, n in sources.most_common()},
        "top_ops": {name: n / steps for name, n in counts.most_common(TOP_OPS)},
    }
    device = [e for e in events if _is_device(e) and e.time_range.start >= spans[0][0]]
    # runtime calls by their API name (a versioned entry point, cudaLaunchKernel_v7000, counts as cudaLaunchKernel)
    runtime = Counter(re.sub(r"_v\d+$", "", e.name) for e in host if not e.name.startswith("aten::"))
    if device or any(runtime[c] for c in LAUNCHES):
        kernels = [e for e in device if not e.name.startswith(("Memcpy", "Memset"))]
        syncs = {name: runtime[name] / steps for name in SYNC_CALLS if runtime[name]}
        d2h = sum(1 for e in device if e.name.startswith("Memcpy DtoH"))
        if d2h:
            syncs["Memcpy DtoH"] = d2h / steps
        out.update(kernels_per_step=sum(runtime[c] for c in LAUNCHES) / steps,
                   device_ms_per_step=sum(e.time_range.elapsed_us() for e in kernels) / steps / 1000.0,
                   sync_calls_per_step=syncs)
    return out


def profiler(warmup: int, steps: int):
    """torch.profiler over whole steps (the caller calls ``prof.step()`` after each): ``warmup`` steps skipped, one
    profiler warm-up step, ``steps`` recorded; CUDA activity too where there is a CUDA device."""
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    return profile(activities=activities, schedule=schedule(skip_first=warmup, wait=0, warmup=1, active=steps,
                                                            repeat=1))
