"""Threads from the container's CPU quota (cgroup v2, v1), then the affinity mask."""

from __future__ import annotations

import os

import torch

from explainer.runtime.threads import cgroup_cpus, configure_threads, cpu_quota


def test_cgroup_v2_quota(tmp_path):
    (tmp_path / "cpu.max").write_text("200000 100000\n")
    assert cgroup_cpus(tmp_path) == 2.0
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert cpu_quota(tmp_path) == min(2, len(os.sched_getaffinity(0)))  # 1.5 CPUs -> 2 threads, within the mask
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpus(tmp_path) is None and cpu_quota(tmp_path) == len(os.sched_getaffinity(0))


def test_cgroup_v1_quota(tmp_path):
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("100000")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000")
    assert cgroup_cpus(tmp_path) == 1.0 and cpu_quota(tmp_path) == 1
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1")  # no quota
    assert cgroup_cpus(tmp_path) is None


def test_configure_threads_sets_torch(tmp_path):
    before = torch.get_num_threads()
    (tmp_path / "cpu.max").write_text("100000 100000\n")
    try:
        assert configure_threads(tmp_path) == 1 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
