"""The CUDA peak report's replay (`tests/cuda_peak.py`), on a trace written by hand: it runs on any machine."""

from __future__ import annotations

from .cuda_peak import describe, live_at_peak, where


def _frame(path: str, line: int, name: str) -> dict:
    return {"filename": path, "line": line, "name": name}


def test_the_replay_keeps_the_blocks_live_at_the_highest_sum():
    weights = _frame("/site/torch/nn/modules/linear.py", 125, "forward")
    mine = _frame("/repo/explainer/methods/rollout.py", 88, "step")
    trace = [
        {"action": "alloc", "addr": 1, "size": 100, "frames": [weights]},
        {"action": "alloc", "addr": 2, "size": 300, "frames": [weights, mine]},
        {"action": "free_requested", "addr": 1, "size": 100},  # not freed until its streams are done
        {"action": "alloc", "addr": 3, "size": 50, "frames": []},  # 450 live: the peak
        {"action": "free_completed", "addr": 1, "size": 100},
        {"action": "free_completed", "addr": 2, "size": 300},
        {"action": "alloc", "addr": 2, "size": 400, "frames": [weights]},  # 450 again: not higher
        {"action": "free_completed", "addr": 99, "size": 7},  # made before the history began: ignored
        {"action": "segment_alloc", "addr": 1000, "size": 2**21},  # reserved, not allocated
    ]
    peak, blocks = live_at_peak(trace)
    assert peak == 450
    assert [b["size"] for b in blocks] == [300, 100, 50]  # largest first
    assert where(blocks[0]) == "methods/rollout.py:88 step"  # the project's frame before torch's
    assert where(blocks[1]) == "/site/torch/nn/modules/linear.py:125 forward"
    assert where(blocks[2]) == "no stack"
    text = describe(peak, blocks, top=2)
    assert text.splitlines()[0].startswith("0.0 MB live at the peak, 3 blocks")
    assert len(text.splitlines()) == 3 and "methods/rollout.py:88" in text


def test_an_empty_trace_has_no_peak():
    assert live_at_peak([]) == (0, [])
