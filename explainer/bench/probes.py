"""OS probes of a worker process: its peak memory (CUDA allocator or resident set) and CPU time used by others."""

from __future__ import annotations

import gc
import os
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BUSY_WARNING = 0.10  # share of the CPUs used by other processes above which timings are flagged
_MIB = 1024 * 1024


class ContentionProbe:
    """CPU time the rest of the machine spends while we time: system busy time from /proc/stat minus our own."""

    def __init__(self) -> None:
        self.tick = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01
        self.cpus = os.cpu_count() or 1
        self.fraction: float | None = None  # of the last `with` block

    def _busy_seconds(self) -> float | None:
        try:
            values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        except (OSError, ValueError, IndexError):
            return None
        idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
        guest = sum(values[8:10])  # already counted in user and nice
        return (sum(values) - idle - guest) * self.tick

    def wait_quiet(self, max_seconds: float, window: float = 1.0) -> None:
        """Sleep in `window`-second samples until other processes use at most `BUSY_WARNING` of the CPUs."""
        deadline = time.perf_counter() + max_seconds
        while time.perf_counter() < deadline:
            with self:
                time.sleep(window)
            if self.fraction is None or self.fraction <= BUSY_WARNING:
                return

    def __enter__(self) -> ContentionProbe:
        self._busy0, self._own0, self._t0 = self._busy_seconds(), time.process_time(), time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        busy1, own1, t1 = self._busy_seconds(), time.process_time(), time.perf_counter()
        if self._busy0 is None or busy1 is None or t1 <= self._t0:
            self.fraction = None
            return
        other = max(0.0, (busy1 - self._busy0) - (own1 - self._own0))
        self.fraction = min(1.0, other / ((t1 - self._t0) * self.cpus))


def _proc_status_kib(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise OSError(f"{key} missing from /proc/self/status")


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc mallopt parameters
_LIVE_MMAP_THRESHOLD = 64 * 1024  # blocks this size or larger are mmap-ed and unmapped on free


def live_peak_mb(run: Callable[[Any, int], int], input_ids: Any, k: int) -> float | None:
    """Peak RSS (MiB) of one run with glibc caching switched off for blocks >= 64 KiB; None off glibc/Linux.

    Changes the allocator of this process for good, so it must be the last thing a worker measures.
    """
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(_M_MMAP_THRESHOLD, _LIVE_MMAP_THRESHOLD)
        libc.mallopt(_M_TRIM_THRESHOLD, 2 * _LIVE_MMAP_THRESHOLD)
        gc.collect()
        libc.malloc_trim(0)
        Path("/proc/self/clear_refs").write_text("5")
    except (OSError, AttributeError):
        return None
    run(input_ids, k)
    return _proc_status_kib("VmHWM") / 1024


def _malloc_trim() -> bool:
    """Return freed heap memory to the kernel (glibc only); True when it ran."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
        return True
    except (OSError, AttributeError):
        return False


class MemoryProbe:
    """Peak memory of the code run between `reset()` and `peak_mb()`.

    CUDA: peak allocated memory (`vmhwm` is meaningless there). CPU: the kernel's resident-set high-water mark,
    reset by writing "5" to /proc/self/clear_refs; where that is not allowed, `ru_maxrss`, which cannot be reset and
    so also covers model loading (the row's `mem_method` says so). Before the reset glibc's free heap is handed back
    (`malloc_trim`): otherwise whatever the warm-up left cached counts as resident, and that varies by tens of MiB
    between otherwise identical processes.
    """

    def __init__(self, device: Any) -> None:
        self.device = device
        self.method = ""

    def reset(self, trim: bool = True) -> float:
        """Reset the high-water mark and return the memory in use now, in MiB; `trim` first frees glibc's heap."""
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.method = "cuda_max_memory_allocated"
            return torch.cuda.memory_allocated(self.device) / _MIB
        trimmed = _malloc_trim() if trim else "malloc_trim" in self.method
        try:
            Path("/proc/self/clear_refs").write_text("5")
            self.method = "vmhwm_after_clear_refs" + ("+malloc_trim" if trimmed else "")
            return _proc_status_kib("VmRSS") / 1024
        except OSError:
            self.method = "ru_maxrss_since_start (clear_refs not writable: includes model loading)"
            return self._ru_maxrss_mb()

    def peak_mb(self) -> float:
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            return torch.cuda.max_memory_allocated(self.device) / _MIB
        if self.method.startswith("vmhwm"):
            return _proc_status_kib("VmHWM") / 1024
        return self._ru_maxrss_mb()

    @staticmethod
    def _ru_maxrss_mb() -> float:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak / _MIB if sys.platform == "darwin" else peak / 1024  # bytes on macOS, KiB on Linux
