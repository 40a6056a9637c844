"""What both crowd tests share (`load_test.py --crowd` through the app, `library_crowd.py` through the library):
visitors who start at one instant, and the medians of alternating rounds. No gradio here: the library's crowd runs on
GPU machines that have none."""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from typing import Any


def at_once(n: int, visit: Callable[[int], Any]) -> tuple[list[Any], float]:
    """`visit(i)` for i < n, each in its own thread, all released at one instant: (what each returned, or the exception
    it raised; the seconds until the last one ended)."""
    out: list[Any] = [RuntimeError("no result")] * n
    start = threading.Barrier(n + 1)

    def run(i: int) -> None:
        start.wait()
        try:
            out[i] = visit(i)
        except BaseException as e:  # counted as an error by the caller
            out[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    return out, time.perf_counter() - t0


def summary(rows: list[dict]) -> list[dict]:
    """Per crowd size: the median time until all were served over its rounds, and that median over the median of
    the 1-visitor rounds of the same run (the ratio the goal names; a busy or noisy machine moves single rounds by
    tens of percent, so the rounds alternate and the medians are compared)."""
    by_size: dict[int, list[float]] = {}
    for row in rows:
        by_size.setdefault(row["visitors"], []).append(row["all_served_s"])
    one = statistics.median(by_size[1]) if 1 in by_size else None
    return [
        {
            "visitors": n, "rounds": len(times), "all_served_median_s": statistics.median(times),
            "vs_one_alone_median": None if one is None else statistics.median(times) / one,
        }
        for n, times in sorted(by_size.items())
    ]  # fmt: skip
