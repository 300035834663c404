"""Where a run trains and how: the device, and the ``train`` settings that say ``auto``, resolved for it once.

What pays on a CPU can cost on a GPU (DESIGN.md, "Conventions"): on two CPU cores a padded token is compute, so
length buckets (several forwards of less padding) and huge pages (fewer page faults) pay; on a GPU padding is
nearly free and every extra forward is hundreds of kernel launches, and the first H200 run measured these CPU
speedups halving throughput (../shared/gpu/README.md: 445 sentences/s with them, 995 without). So each of these
settings is ``auto`` by default and resolves here, per device (the measurements: docs/performance.md, "On a
GPU"):

============== ===================================== =========================================
setting        CPU                                   CUDA
============== ===================================== =========================================
precision      fp32 (bf16 is emulated: slower)       bf16 where the device supports it, else fp32
length_buckets 4                                     1 (one forward)
huge_pages     on (Linux, where the kernel allows)   off (the host allocates little per step)
fused_adamw    on                                    on
compile        off                                   on, with CUDA graphs (``reduce-overhead``), for a run
                                                     of at least :data:`BREAK_EVEN_STEPS` steps
============== ===================================== =========================================

When the encoder is compiled ``length_buckets`` is 1 on every device (the compiled graphs need fixed widths); an
explicit ``length_buckets`` above 1, or ``grad_cache_rows``, leaves ``compile: auto`` off. An explicit setting
always wins. The resolved settings are logged once and recorded in ``result.json``
(``settings``), with the names that were ``auto``.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from raysent.config import TrainConfig

AUTO_CPU: dict[str, Any] = {"length_buckets": 4, "huge_pages": True, "fused_adamw": True}
AUTO_CUDA: dict[str, Any] = {"length_buckets": 1, "huge_pages": False, "fused_adamw": True}

# ``compile: auto``'s break-even, from one H200 run (torch 2.11, BERT-base shape, batch 64, max length 32, bf16;
# docs/performance.md, "On a GPU"; results/bench/20261127-141237): compiling took about 40 s in a new process, and a
# step then took 1/46.24 s instead of the eager defaults' 1/26.53 s, 16.1 ms less. A run earns its compile back
# after 40 s / 16.1 ms = 2,490 steps; a shorter one trains faster eager. (Those steps were timed with the default
# mode, without CUDA graphs, and with a cold compiler cache: a later trial of a search that finds the graphs in the
# experiment's compile cache, raysent.train.compile_cache, pays less; neither is measured yet, so the rule keeps the
# cold, measured cost.)
COMPILE_SECONDS = 40.0
EAGER_STEPS_PER_SECOND = 26.53
COMPILED_STEPS_PER_SECOND = 46.24
BREAK_EVEN_STEPS = math.ceil(COMPILE_SECONDS / (1.0 / EAGER_STEPS_PER_SECOND - 1.0 / COMPILED_STEPS_PER_SECOND))
# torch.compile's modes that capture CUDA graphs (torch/_inductor/config.py, triton.cudagraphs under these modes)
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")


def default_device() -> torch.device:
    """The device this process trains on: its (first visible) CUDA device when it has one, else the CPU.

    A Tune trial or Ray Train worker that asked for no GPU sees none (raysent.train.resources hides them), so
    this never takes a GPU that Ray did not give."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def auto_precision(device_type: str) -> str:
    """``precision: auto``: bf16 on a CUDA device with bf16 support (Ampere and later), fp32 elsewhere."""
    if device_type == "cuda" and torch.cuda.is_available() and torch.cuda.is_bf16_supported():
        return "bf16"
    return "fp32"


@dataclass(frozen=True)
class DeviceSettings:
    """The settings a run trains with on ``device`` (each a concrete value, no ``auto``)."""

    device: str
    precision: str  # what autocast is asked for; raysent.train.loop.used_precision says what it trains in
    length_buckets: int
    huge_pages: bool
    fused_adamw: bool
    compile: bool
    auto: tuple[str, ...] = field(default=())  # the names that were ``auto`` and were resolved here
    compile_mode: str | None = None  # torch.compile's mode when compiling, else None
    compile_note: str | None = None  # why ``compile: auto`` chose what it chose (None: an explicit setting)
    compile_cache: str | None = None  # where the compiler's caches are (TORCHINDUCTOR_CACHE_DIR), when compiling

    @property
    def cuda_graphs(self) -> bool:
        """Whether the compiled encoder replays CUDA graphs (a compile mode that captures them, on CUDA)."""
        return self.compile and self.device == "cuda" and self.compile_mode in CUDA_GRAPH_MODES

    def record(self) -> dict[str, Any]:
        """What ``result.json`` keeps under ``settings``."""
        out = asdict(self)
        out["auto"] = list(self.auto)
        return out

    def describe(self) -> str:
        """One line for the run's log: each setting, marked where ``auto`` chose it."""
        parts = [f"{k} {getattr(self, k)}" + (" (auto)" if k in self.auto else "")
                 for k in ("precision", "length_buckets", "huge_pages", "fused_adamw", "compile")]
        if self.compile:
            parts[-1] += f" (mode {self.compile_mode}" + (", CUDA graphs" if self.cuda_graphs else "") + ")"
        line = f"device {self.device}: " + ", ".join(parts)
        return line + (f"; compile auto: {self.compile_note}" if self.compile_note else "")


def compile_cache_dir() -> str:
    """Where this process's compiler keeps its caches: ``TORCHINDUCTOR_CACHE_DIR`` (a search's:
    raysent.train.compile_cache), else torch's default folder (shared by the processes of one user on a machine)."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    return os.path.abspath(os.environ.get("TORCHINDUCTOR_CACHE_DIR") or default_cache_dir())


def resolve_compile(train: TrainConfig, device_type: str, total_steps: int | None = None
                    ) -> tuple[bool, str | None, str | None]:
    """``train.compile`` on ``device_type`` for a run of ``total_steps`` optimizer steps (None: not known, as for
    the bench, which times the steps after the compile): whether to compile, torch.compile's mode, and why auto
    chose that (None for an explicit setting). ``compile_mode: auto`` is ``reduce-overhead`` (CUDA graphs) on CUDA
    and ``default`` elsewhere; an explicit ``compile`` or ``compile_mode`` wins."""
    mode = train.compile_mode if train.compile_mode != "auto" else (
        "reduce-overhead" if device_type == "cuda" else "default")
    if train.compile is False:
        return False, None, None
    if train.compile is True:
        return True, mode, None
    if device_type != "cuda":
        return False, None, ("off on a CPU: compiling pays on a GPU, where the host launching kernels bounds a step; "
                             "on a CPU the arithmetic does, and a compile costs more than it saves")
    if train.length_buckets not in ("auto", 1):
        return False, None, (f"off: train.length_buckets {train.length_buckets} runs each bucket at its own width, "
                             "a new shape for the compiled graphs at every batch")
    if train.grad_cache_rows:
        return False, None, (f"off: train.grad_cache_rows {train.grad_cache_rows} trims each chunk to its own "
                             "widest row, a new shape for the compiled graphs at every chunk")
    if total_steps is not None and total_steps < BREAK_EVEN_STEPS:
        return False, None, (
            f"off: a run of {total_steps} steps is shorter than compiling's break-even, {BREAK_EVEN_STEPS} steps "
            f"(BERT-base on an H200: about {COMPILE_SECONDS:.0f} s to compile, then {EAGER_STEPS_PER_SECOND} → "
            f"{COMPILED_STEPS_PER_SECOND} steps/s; docs/performance.md); train.compile: true compiles anyway")
    if total_steps is None:
        return True, mode, f"on, mode {mode}: a run of unknown length (the bench: steps after the compile are timed)"
    return True, mode, (f"on, mode {mode}: a run of {total_steps} steps, at least compiling's break-even of "
                        f"{BREAK_EVEN_STEPS} steps")


def resolve(train: TrainConfig, device: torch.device | str, total_steps: int | None = None) -> DeviceSettings:
    """``train``'s speed settings for ``device``, each ``auto`` resolved (see the module docstring), for a run of
    ``total_steps`` optimizer steps (None: unknown; ``compile: auto`` then needs no break-even)."""
    device_type = torch.device(device).type
    table = AUTO_CUDA if device_type == "cuda" else AUTO_CPU
    compiled, mode, note = resolve_compile(train, device_type, total_steps)
    auto: list[str] = []
    values: dict[str, Any] = {}
    for name in ("length_buckets", "huge_pages", "fused_adamw"):
        value = getattr(train, name)
        if value == "auto":
            # a compiled encoder runs every batch in one piece of a fixed width (raysent.train.loop.compile_widths)
            value = 1 if name == "length_buckets" and compiled else table[name]
            auto.append(name)
        values[name] = value
    precision: str = train.precision
    if precision == "auto":
        precision = auto_precision(device_type)
        auto.append("precision")
    if train.compile == "auto":
        auto.append("compile")
    cache = compile_cache_dir() if compiled else None
    return DeviceSettings(device=device_type, precision=precision, compile=compiled, auto=tuple(auto),
                          compile_mode=mode, compile_note=note, compile_cache=cache, **values)
