"""How many trials share one GPU under ``resources.gpus_per_worker: auto``: a pure function of a probe's measurements.

A trial that trains in its own process (``resources.workers: null``) rarely fills a large GPU: at BERT-base, batch
16-64, length 32, a step is bound by the host (Python dispatching ~1,900 operators a step), and the chip idles while
it waits. Several trials on one GPU then train more steps per second together than one alone: while one process is
in Python, another's kernels run. Whether they do, and how many fit, depends on the model, the batch, the length and
the GPU, so it is measured: the probe (:mod:`raysent.tune.gpu_probe`, on CUDA only) runs 1, 2, 4, ... copies of the
trial's own training step at once, each in its own process as trials are, and measures for each count ``k``
(:class:`ProbePoint`) the steps per second of all ``k`` together, the most memory one of them held, and the memory
in use on the whole device. This module turns those numbers into a choice (:func:`choose`), and tells the probe
which count to try next (:func:`next_count`); it imports neither Ray nor CUDA, so it is tested on a CPU with
measured-looking numbers.

The rule (docs/performance.md, "Many trials per GPU"):

* **Memory**: at least :data:`HEADROOM` (10 %) of the device's memory stays free, for what the caching allocator
  does not hold (each process's CUDA context, about 0.5 GiB, and the libraries' workspaces), for what the probe
  did not run (evaluation) and for the GPU's other users. Each of ``k`` trials is capped at its share of the rest,
  ``(1 - HEADROOM) / k`` of the memory (:func:`memory_fraction`, set in the trial's process with
  ``torch.cuda.set_per_process_memory_fraction``), so one trial cannot run another out of memory. ``k`` fits when
  the most memory one copy held in the probe is within that cap and the device's memory in use with ``k`` copies,
  contexts included, is within ``1 - HEADROOM`` of it.
* **Speed**: a larger ``k`` is chosen only when all its copies together train at least :data:`MIN_GAIN` (5 %) more
  steps per second than the best smaller count: a short probe's timing varies by a few percent, and packing that
  is not clearly faster must not be chosen (a packed search is never slower than one trial per GPU). ``k`` stays 1
  when no count gains.
* **Counts tried**: 1, 2, 4, 8, ... up to :func:`most_per_gpu` (at most :data:`MAX_TRIALS_PER_GPU`; no more than the
  phase's trials need on the cluster's GPUs, nor than the CPUs per GPU hold at ``resources.cpus_per_worker`` each),
  that largest count itself last. The probe stops at the first count that does not fit (or would not, judged from
  the last that did) and at the first that is slower than the best so far.
* **The share**: ``k`` trials per GPU ask Ray for ``1/k`` GPU each (:func:`share_of`, rounded down to Ray's 4
  decimals, so that ``k`` of them fit on one GPU and ``k + 1`` do not).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

HEADROOM = 0.10  # of the device's memory kept free: CUDA contexts, workspaces, evaluation, other users
MIN_GAIN = 1.05  # a larger count must train this many times the steps/s of the best smaller one
MAX_TRIALS_PER_GPU = 16  # the most trials auto packs on one GPU
SHARE_DECIMALS = 4  # Ray's precision for a fractional resource
EPS = 1e-9
GIB = 2**30


@dataclass(frozen=True)
class ProbePoint:
    """What the probe measured with ``k`` copies of a trial's training step on one GPU at once."""

    k: int
    steps_per_second: float | None  # all k copies together; None: the count failed (``error``)
    peak_bytes: int | None = None  # the most memory one copy's allocator held (max_memory_reserved), over the k
    device_used_bytes: int | None = None  # the device's memory in use with the k copies running (contexts included)
    error: str | None = None  # why the count failed (out of memory, a copy that died)
    peak_allocated_bytes: int | None = None  # the most one copy's tensors took (max_memory_allocated): for the record

    @property
    def ok(self) -> bool:
        return self.error is None and self.steps_per_second is not None and self.steps_per_second > 0


@dataclass(frozen=True)
class Probe:
    """A probe's measurements on one GPU (:mod:`raysent.tune.gpu_probe`)."""

    device: str  # the GPU's name (torch.cuda.get_device_name)
    total_bytes: int  # its memory
    points: tuple[ProbePoint, ...]
    most: int  # the largest count the probe was allowed to try
    key: dict[str, Any] = field(default_factory=dict)  # what was probed: the trial's model, batch, length, settings
    seconds: float = 0.0  # the probe's wall time
    note: str | None = None  # why it stopped, or failed before measuring a count

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Probe:
        points = tuple(ProbePoint(**p) for p in data.get("points") or ())
        return cls(**{**data, "points": points})


@dataclass(frozen=True)
class Packing:
    """What ``gpus_per_worker: auto`` chose: ``trials_per_gpu`` trials on each GPU, and why."""

    trials_per_gpu: int
    reason: str
    probe: Probe | None = None

    @property
    def gpus_per_worker(self) -> float:
        return share_of(self.trials_per_gpu)

    def record(self) -> dict[str, Any]:
        """What the search's state and every run record keep of it (the probe's points as measured)."""
        out: dict[str, Any] = {"trials_per_gpu": self.trials_per_gpu, "gpus_per_worker": self.gpus_per_worker,
                               "memory_fraction": memory_fraction(self.gpus_per_worker), "reason": self.reason}
        if self.probe is not None:
            out["probe"] = {"device": self.probe.device, "total_gib": round(self.probe.total_bytes / GIB, 2),
                            "seconds": round(self.probe.seconds, 1),
                            "points": [{"k": p.k, "steps_per_second": p.steps_per_second,
                                        "peak_gib": None if p.peak_bytes is None else round(p.peak_bytes / GIB, 3),
                                        "device_used_gib": None if p.device_used_bytes is None
                                        else round(p.device_used_bytes / GIB, 3), "error": p.error}
                                       for p in self.probe.points]}
        return out


# --------------------------------------------------------------------------- shares and caps
def share_of(k: int) -> float:
    """The GPU share each of ``k`` trials asks Ray for: ``1/k`` rounded down to Ray's 4 decimals (1 for ``k`` <= 1)."""
    if k <= 1:
        return 1.0
    scale = 10**SHARE_DECIMALS
    return math.floor(scale / k) / scale


def trials_per_gpu(gpus: float) -> int:
    """Trials that share one GPU when each asks for ``gpus`` (0: none train on a GPU)."""
    if gpus <= 0:
        return 0
    return math.floor(1 / gpus + EPS) if gpus < 1 else 1


def memory_fraction(gpus: float) -> float | None:
    """The cap on the memory of a process given ``gpus`` of one GPU (a share below 1), as a fraction of the
    device's memory: its share of what :data:`HEADROOM` leaves; None for a whole GPU or none."""
    if not 0 < gpus < 1:
        return None
    return round(gpus * (1 - HEADROOM), 6)


def cap_bytes(k: int, total_bytes: int) -> float:
    """The memory each of ``k`` trials on a device of ``total_bytes`` may hold."""
    return (1 - HEADROOM) * total_bytes / k


# --------------------------------------------------------------------------- the counts
def most_per_gpu(gpus: float, cpus: float, cpus_per_trial: float, trials: int | None,
                 max_concurrent: int | None = None, cpus_per_gpu: float | None = None) -> int:
    """The largest count worth trying on a cluster of ``gpus`` GPUs and ``cpus`` CPUs: at most
    :data:`MAX_TRIALS_PER_GPU`, no more than ``trials`` (and ``max_concurrent``, when a number) need on ``gpus``
    GPUs, nor than the CPUs per GPU (``cpus_per_gpu``, default ``cpus / gpus``) hold at ``cpus_per_trial`` each."""
    if gpus <= 0:
        return 1
    k = MAX_TRIALS_PER_GPU
    for n in (trials, max_concurrent):
        if n is not None:
            k = min(k, math.ceil(n / gpus))
    per_gpu = cpus_per_gpu if cpus_per_gpu is not None else cpus / gpus
    k = min(k, math.floor(per_gpu / cpus_per_trial + EPS))
    return max(k, 1)


def counts(most: int) -> list[int]:
    """The counts a probe tries, in order: 1, 2, 4, ... below ``most``, then ``most``."""
    out = [1]
    while out[-1] * 2 < most:
        out.append(out[-1] * 2)
    if most > 1:
        out.append(most)
    return out


def fits(p: ProbePoint, total_bytes: int) -> bool:
    """Whether ``p``'s count ran and fits the memory: one copy's peak within its cap and the device's memory in use
    within ``1 - HEADROOM`` (where measured)."""
    if not p.ok:
        return False
    if p.peak_bytes is not None and p.peak_bytes > cap_bytes(p.k, total_bytes):
        return False
    return p.device_used_bytes is None or p.device_used_bytes <= (1 - HEADROOM) * total_bytes


def would_fit(k: int, last: ProbePoint, total_bytes: int) -> bool:
    """Whether ``k`` copies would fit, judged from ``last``, a smaller count that did: each copy holds what one of
    ``last``'s held, and each added copy adds what one of ``last``'s took of the device on average."""
    if last.peak_bytes is not None and last.peak_bytes > cap_bytes(k, total_bytes):
        return False
    if last.device_used_bytes is None:
        return True
    return last.device_used_bytes * k / last.k <= (1 - HEADROOM) * total_bytes


def best(points: list[ProbePoint] | tuple[ProbePoint, ...], total_bytes: int) -> ProbePoint | None:
    """The chosen point of ``points`` (by count): one copy, replaced by each larger count that fits and trains at
    least :data:`MIN_GAIN` times the steps/s of the best before it; a count that does not fit ends the walk (a
    larger one needs more). None when one copy alone did not run."""
    ordered = sorted(points, key=lambda p: p.k)
    if not ordered or ordered[0].k != 1 or not ordered[0].ok:
        return None
    chosen = ordered[0]
    for p in ordered[1:]:
        if not fits(p, total_bytes):
            break
        assert p.steps_per_second is not None and chosen.steps_per_second is not None
        if p.steps_per_second >= MIN_GAIN * chosen.steps_per_second:
            chosen = p
    return chosen


def next_count(points: list[ProbePoint] | tuple[ProbePoint, ...], most: int, total_bytes: int) -> int | None:
    """The count the probe tries next after ``points`` (None: it is done): the next of :func:`counts`, unless the
    last count failed, did not fit, or was slower than the best so far, or the next would not fit."""
    if not points:
        return 1
    last = max(points, key=lambda p: p.k)
    if not fits(last, total_bytes):
        return None
    chosen = best(points, total_bytes)
    assert chosen is not None and chosen.steps_per_second is not None and last.steps_per_second is not None
    if last.steps_per_second < chosen.steps_per_second:
        return None
    later = [k for k in counts(most) if k > last.k]
    if not later or not would_fit(later[0], last, total_bytes):
        return None
    return later[0]


def _gib(n: float | None) -> str:
    return "?" if n is None else f"{n / GIB:.2f} GiB"


def choose(probe: Probe, most: int) -> Packing:
    """``gpus_per_worker: auto``'s packing from ``probe``'s points up to ``most`` copies (see the module)."""
    points = [p for p in probe.points if p.k <= most]
    chosen = best(points, probe.total_bytes)
    if chosen is None:
        first = next((p for p in points if p.k == 1), None)
        why = (first.error if first is not None and first.error else probe.note) or "one copy did not run"
        return Packing(1, f"1 trial per GPU: the GPU probe measured no step ({why})", probe)
    one = min(points, key=lambda p: p.k)
    assert one.steps_per_second is not None and chosen.steps_per_second is not None
    tried = ", ".join(f"{p.k}: {p.steps_per_second:.1f}" if p.ok else f"{p.k}: {p.error or 'failed'}"
                      for p in sorted(points, key=lambda p: p.k))
    memory = (f"one trial's peak {_gib(chosen.peak_bytes)} of its cap {_gib(cap_bytes(chosen.k, probe.total_bytes))}"
              f", {_gib(chosen.device_used_bytes)} of {_gib(probe.total_bytes)} in use")
    if chosen.k == 1:
        why = (f"1 trial per GPU: packing gained less than {MIN_GAIN - 1:.0%} on {probe.device} "
               f"(steps/s of all trials at once by count: {tried})")
    else:
        why = (f"{chosen.k} trials per GPU: {chosen.steps_per_second:.1f} steps/s together on {probe.device}, "
               f"{chosen.steps_per_second / one.steps_per_second:.2f}× one trial's {one.steps_per_second:.1f} "
               f"(by count: {tried}); {memory}")
    return Packing(chosen.k, why, probe)


__all__ = ["HEADROOM", "MAX_TRIALS_PER_GPU", "MIN_GAIN", "Packing", "Probe", "ProbePoint", "choose", "counts",
           "memory_fraction", "most_per_gpu", "next_count", "share_of", "trials_per_gpu"]
