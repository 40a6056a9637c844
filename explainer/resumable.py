"""Runs that survive being stopped: rows appended to a JSON-lines file as they are measured, and read back so that a
rerun skips what is there (`eval`, `agreement`)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def read_results(path: str | Path | None) -> list[dict[str, Any]]:
    """Rows of a JSON-lines results file (a torn last line from an interrupted run is ignored)."""
    if not path or not Path(path).is_file():
        return []
    rows = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


class ResultsLog:
    """Appends each finished row to `path` (None: keeps nothing) and logs progress with an ETA."""

    def __init__(self, path: str | Path | None, total: int, log: Callable[[str], None] | None) -> None:
        self.path, self.total, self.log = path, total, log
        self.start, self.count = time.perf_counter(), 0

    def add(self, row: dict[str, Any]) -> None:
        """Write `row` (flushed at once, so a stopped run keeps it) and log "[i/total] id, elapsed, ETA"."""
        self.count += 1
        if self.path:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")
        if self.log:
            elapsed = time.perf_counter() - self.start
            eta = elapsed / self.count * (self.total - self.count)
            self.log(f"[{self.count}/{self.total}] {row.get('id')}  {elapsed:.0f} s elapsed, ETA {eta:.0f} s")
