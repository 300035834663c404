"""CPU memory of a training process (Linux): large tensors on transparent huge pages (``train.huge_pages``),
and the memory a finished run freed handed back before the next run in the same process
(:func:`release_freed_memory`, for reused Tune trial processes).

Every step allocates the same large tensors again (the word-embedding gradient, hidden states, FFN
activations). glibc serves allocations above its mmap threshold with fresh ``mmap`` pages and unmaps them
when they are freed, so every step the kernel faults in and zeroes each 4 KiB page again. PyTorch's CPU
allocator can ask the kernel for transparent huge pages for tensors of 2 MB and more (its
``THP_MEM_ALLOC_ENABLE`` environment variable, c10/core/alloc_cpu.cpp): they then fault in 2 MB at a time.
The numbers computed do not change, nor does the memory the process holds. Measurements, and why freed
blocks are not kept in glibc's heap instead (``mallopt``): docs/performance.md, ``huge_pages``.

PyTorch reads the variable once, at its first large allocation, so it must be set before the model
loads: :func:`raysent.train.run.build_method` calls :func:`use_huge_pages` first. The kernel must allow
huge pages on request (``/sys/kernel/mm/transparent_hugepage/enabled``: ``madvise`` or ``always``).
"""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import platform
import re
from pathlib import Path

# Lazy imports: torch (heavy, and only the functions that need them import them).

log = logging.getLogger("raysent.train")

THP_ENV = "THP_MEM_ALLOC_ENABLE"  # PyTorch's switch
THP_SYSFS = Path("/sys/kernel/mm/transparent_hugepage/enabled")
_state: bool | None = None


def kernel_thp_mode(path: Path = THP_SYSFS) -> str | None:
    """The kernel's transparent-huge-page mode (``always``, ``madvise``, ``never``), None if unknown."""
    try:
        found = re.search(r"\[(\w+)\]", path.read_text())
    except OSError:
        return None
    return found.group(1) if found else None


def use_huge_pages() -> bool:
    """Have PyTorch put this process's tensors of 2 MB and more on huge pages (once); False, with the
    reason logged, where that does not take effect."""
    global _state
    if _state is not None:
        return _state
    _state = False
    mode = kernel_thp_mode() if platform.system() == "Linux" else None
    if mode not in ("madvise", "always"):
        log.info("train.huge_pages: not applied (transparent huge pages: %s)", mode or "not on this system")
        return False
    if mode == "always":  # the kernel already backs every large mapping with huge pages
        _state = True
        return _state
    exported = os.environ.get(THP_ENV)
    if exported is not None and exported != "1":
        log.info("train.huge_pages: not applied (%s=%s is exported)", THP_ENV, exported)
        return False
    os.environ[THP_ENV] = "1"
    try:
        _state = large_tensors_on_huge_pages()  # PyTorch reads the variable here, or has already
    finally:
        if exported is None:  # this process's setting: processes it starts decide for themselves
            del os.environ[THP_ENV]
    if not _state:
        log.warning("train.huge_pages: not applied: PyTorch allocated a large tensor in this process before "
                    "%s was set; export %s=1 before starting it", THP_ENV, THP_ENV)
    return _state


def large_tensors_on_huge_pages() -> bool:
    """Whether a fresh 4 MB tensor of this process lies in a mapping marked for huge pages (``hg`` in
    the mapping's VmFlags, /proc/self/smaps)."""
    import torch

    probe = torch.empty(1 << 20)
    addr = probe.data_ptr()
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = re.match(r"^([0-9a-f]+)-([0-9a-f]+) ", line)
            if head:
                inside = int(head.group(1), 16) <= addr < int(head.group(2), 16)
            elif inside and line.startswith("VmFlags:"):
                return "hg" in line.split()[1:]
    return False


def release_freed_memory() -> bool:
    """Give memory that a finished run freed back to the OS: ``gc.collect()``, then glibc's ``malloc_trim(0)``.

    For a process that runs one training after another (a Tune trial process reused by the next trial):
    each trial trains in a new thread, which glibc may serve from another malloc arena, and the free space
    the last run left in its arena is not handed back by itself (measured: docs/performance.md,
    "Reused trial processes"). Returns whether malloc_trim ran (False off glibc)."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        return True
    except (OSError, AttributeError):  # not glibc (macOS, musl)
        return False
