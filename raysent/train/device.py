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
============== ===================================== =========================================

Under ``train.compile`` ``length_buckets`` is 1 on every device (the compiled graphs need fixed widths). An
explicit setting always wins. The resolved settings are logged once and recorded in ``result.json``
(``settings``), with the names that were ``auto``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from raysent.config import TrainConfig

AUTO_CPU: dict[str, Any] = {"length_buckets": 4, "huge_pages": True, "fused_adamw": True}
AUTO_CUDA: dict[str, Any] = {"length_buckets": 1, "huge_pages": False, "fused_adamw": True}


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

    def record(self) -> dict[str, Any]:
        """What ``result.json`` keeps under ``settings``."""
        out = asdict(self)
        out["auto"] = list(self.auto)
        return out

    def describe(self) -> str:
        """One line for the run's log: each setting, marked where ``auto`` chose it."""
        parts = [f"{k} {getattr(self, k)}" + (" (auto)" if k in self.auto else "")
                 for k in ("precision", "length_buckets", "huge_pages", "fused_adamw", "compile")]
        return f"device {self.device}: " + ", ".join(parts)


def resolve(train: TrainConfig, device: torch.device | str) -> DeviceSettings:
    """``train``'s speed settings for ``device``, each ``auto`` resolved (see the module docstring)."""
    device_type = torch.device(device).type
    table = AUTO_CUDA if device_type == "cuda" else AUTO_CPU
    auto: list[str] = []
    values: dict[str, Any] = {}
    for name in ("length_buckets", "huge_pages", "fused_adamw"):
        value = getattr(train, name)
        if value == "auto":
            # under train.compile every batch is one piece of a fixed width (raysent.train.loop.compile_widths)
            value = 1 if name == "length_buckets" and train.compile else table[name]
            auto.append(name)
        values[name] = value
    precision: str = train.precision
    if precision == "auto":
        precision = auto_precision(device_type)
        auto.append("precision")
    return DeviceSettings(device=device_type, precision=precision, compile=train.compile, auto=tuple(auto),
                          **values)
