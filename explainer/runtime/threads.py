"""Torch's CPU threads from the container's CPU quota, not the host's core count.

On a Space (or any container) `os.cpu_count()` reports the host's cores, while the container may use only 2 vCPUs:
torch then starts a thread per host core, and they fight over the quota. `cpu_quota` reads the cgroup v2 `cpu.max`
(quota / period), then v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`, then the affinity mask, then `os.cpu_count()`;
`configure_threads` sets torch's intra-op threads to it.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import torch


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def cgroup_cpus(root: str | Path = "/sys/fs/cgroup") -> float | None:
    """CPUs the cgroup's quota allows (e.g. 2.0), or None without a quota."""
    root = Path(root)
    v2 = _read(root / "cpu.max")
    if v2:
        quota, _, period = v2.partition(" ")
        if quota != "max" and quota.isdigit() and period.isdigit() and int(period) > 0:
            return int(quota) / int(period)
        return None
    quota, period = _read(root / "cpu" / "cpu.cfs_quota_us"), _read(root / "cpu" / "cpu.cfs_period_us")
    if quota and period and quota.lstrip("-").isdigit() and period.isdigit() and int(quota) > 0 and int(period) > 0:
        return int(quota) / int(period)
    return None


def cpu_quota(root: str | Path = "/sys/fs/cgroup") -> int:
    """Whole CPUs this process may use: the cgroup quota (rounded up), else the affinity mask, else the CPU count."""
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = cgroup_cpus(root)
    return max(1, min(affinity, math.ceil(quota))) if quota else max(1, affinity)


def configure_threads(root: str | Path = "/sys/fs/cgroup") -> int:
    """Set torch's intra-op thread count to `cpu_quota()` and return it."""
    n = cpu_quota(root)
    torch.set_num_threads(n)
    return n
