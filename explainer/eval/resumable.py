"""Runs that survive being stopped: rows appended to a JSON-lines file as they are measured, and read back so that a
rerun skips what is there (`eval`, `agreement`)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import Cancelled, ExplainerError, InputError
from ..runtime.session import hold

PROMPT_KEYS = ("n_prompt_tokens", "n_sentences")  # joined rows agree on these where both record them


def check_joinable(seen: dict[str, Any], row: dict[str, Any]) -> None:
    """Refuse to join two results rows of one id that do not describe the same generation: another precision or
    answer (another model or settings), or another prompt, seen by its length in tokens or sentences (`PROMPT_KEYS`;
    the same answer can come from another prompt, e.g. a long context or haystack whose distractor passages came from
    another selection of rows). A precision or prompt length that one of the rows does not record is not compared.

    Raises:
        InputError: what differs, naming the row.
    """
    if None not in (seen.get("dtype"), row.get("dtype")) and seen["dtype"] != row["dtype"]:
        raise InputError(
            f"Sample {row['id']!r} was evaluated in {seen['dtype']} and in {row['dtype']}; results of different "
            "precisions cannot be combined."
        )
    if seen.get("answer") != row.get("answer"):
        raise InputError(
            f"Sample {row['id']!r} has different answers in the results files; they come from different models or "
            "settings and cannot be combined."
        )
    clash = [key for key in PROMPT_KEYS if None not in (seen.get(key), row.get(key)) and seen[key] != row[key]]
    if clash:
        raise InputError(
            f"Sample {row['id']!r} was run on different prompts in the results files ({', '.join(clash)} differ: a "
            "haystack built from another selection of rows?); they cannot be combined."
        )


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


def measure_rows(
    rows: list[dict[str, Any]],
    measure: Callable[[dict[str, Any]], dict[str, Any]],
    done: dict[str, dict[str, Any]],
    path: str | Path | None,
    model: Any,
    log: Callable[[str], None] | None = None,
    cancel: Any = None,
) -> list[dict[str, Any]]:
    """`measure` every row whose id is not in `done`, holding `model` for each (one row is one request) and appending
    each result to `path` as it finishes; a row the library refuses (`ExplainerError`) is kept as `{id, error}`.

    Returns:
        The results of `rows` that are done, in row order (`done` is updated).

    Raises:
        Cancelled: `cancel` fired (finished rows are already in `path`, so a rerun resumes).
    """
    todo = [r for r in rows if r["id"] not in done]
    results = ResultsLog(path, len(todo), log)
    for row in todo:
        try:
            with hold(model, cancel):
                result = measure(row)
        except Cancelled:
            raise
        except ExplainerError as e:
            result = {"id": row["id"], "error": str(e)}
        done[row["id"]] = result
        results.add(result)
    return [done[r["id"]] for r in rows if r["id"] in done]


def measure_and_summarise(
    rows: list[dict[str, Any]],
    measure: Callable[[dict[str, Any]], dict[str, Any]],
    summarise: Callable[[list[dict[str, Any]]], dict[str, Any]],
    path: str | Path | None,
    model: Any,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """A resumable task's run: `measure_rows` over the rows not yet in `path` (each appended as it finishes), then
    `{**summarise(every result), "samples": every result}`."""
    done = {r["id"]: r for r in read_results(path)}
    samples = measure_rows(rows, measure, done, path, model, log)
    return {**summarise(samples), "samples": samples}


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
