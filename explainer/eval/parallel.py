"""Data-parallel evaluation: `eval` under `torchrun` / `accelerate launch`, one process (rank) per share of the rows.

No collective operation is needed: each rank reads its place from the launcher's environment (`RANK`, `WORLD_SIZE`,
`LOCAL_RANK`), evaluates its share and appends to its own results file; `eval --report` joins the files afterwards.

- Shares are contiguous blocks of the selected rows (after `--offset` / `--limit`): rank r of W takes rows
  [r·n/W, (r+1)·n/W). Read in rank order, the rank files hold the samples in the dataset's order, so the joined
  report lists them exactly as a single process does and its tables are the same.
- Rank r of W writes `<stem>.rank{r}-of-{W}<suffix>` beside the `--results` path (`results.jsonl` ->
  `results.rank0-of-2.jsonl`), created at the start even when its share is empty, so a missing file means a rank
  that never ran. A rerun with the same number of processes resumes each rank from its own file.
- `--report results.jsonl` finds the rank files of that path (`results_files`).
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from ..errors import InputError

T = TypeVar("T")


@dataclass(frozen=True)
class Rank:
    """This process's place in a data-parallel launch (rank 0 of 1 when not launched so).

    Attributes:
        rank: global rank, 0 .. world - 1 (`RANK`).
        world: number of processes (`WORLD_SIZE`).
        local_rank: rank on this machine (`LOCAL_RANK`), which picks its GPU.
        local_world: processes on this machine (`LOCAL_WORLD_SIZE`).
    """

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    local_world: int = 1


def rank_from_env(environ: Mapping[str, str] | None = None) -> Rank:
    """The rank the launcher set in the environment; missing variables mean a single process.

    Raises:
        InputError: values that are not whole numbers, or a rank outside 0 .. WORLD_SIZE - 1.
    """
    env = os.environ if environ is None else environ
    try:
        world = int(env.get("WORLD_SIZE", "1"))
        rank = int(env.get("RANK", "0"))
        local_rank = int(env.get("LOCAL_RANK", str(rank)))
        local_world = int(env.get("LOCAL_WORLD_SIZE", str(world)))
    except ValueError as e:
        raise InputError(f"RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE must be whole numbers: {e}.") from e
    if world < 1 or not 0 <= rank < world or not 0 <= local_rank < max(local_world, 1):
        raise InputError(
            f"RANK must lie in 0 .. WORLD_SIZE - 1 and LOCAL_RANK in 0 .. LOCAL_WORLD_SIZE - 1, got RANK={rank}, "
            f"WORLD_SIZE={world}, LOCAL_RANK={local_rank}, LOCAL_WORLD_SIZE={local_world}."
        )
    return Rank(rank, world, local_rank, local_world)


def shard(rows: Sequence[T], rank: int, world: int) -> list[T]:
    """Rank `rank`'s contiguous block of `rows` (the blocks of ranks 0 .. world - 1 concatenate to `rows`)."""
    n = len(rows)
    return list(rows[n * rank // world : n * (rank + 1) // world])


def rank_path(path: str | Path, rank: int, world: int) -> Path:
    """`results.jsonl` -> `results.rank{rank}-of-{world}.jsonl`; a path without a suffix gets the tag at its end."""
    path = Path(path)
    return path.with_name(f"{path.stem}.rank{rank}-of-{world}{path.suffix}")


def results_files(path: str | Path) -> list[Path]:
    """The files a `--report` entry names: the file itself when it exists, followed by the rank files of a
    data-parallel run that wrote to it (`rank_path`), by world size and rank.

    Raises:
        InputError: neither the file nor rank files exist, or a run's rank files are incomplete.
    """
    path = Path(path)
    pattern = re.compile(re.escape(path.stem) + r"\.rank(\d+)-of-(\d+)" + re.escape(path.suffix) + "$")
    found: dict[int, dict[int, Path]] = {}
    for candidate in path.parent.glob(f"{glob.escape(path.stem)}.rank*-of-*{glob.escape(path.suffix)}"):
        match = pattern.match(candidate.name)
        if match:
            found.setdefault(int(match[2]), {})[int(match[1])] = candidate
    out = [path] if path.is_file() else []
    for world, ranks in sorted(found.items()):
        missing = [r for r in range(world) if r not in ranks]
        if missing:
            names = ", ".join(rank_path(path, r, world).name for r in missing)
            raise InputError(f"The data-parallel run of {world} processes on {str(path)!r} lacks {names}.")
        out += [ranks[r] for r in range(world)]
    if not out:
        raise InputError(f"Results file {str(path)!r} does not exist (nor rank files of a data-parallel run).")
    return out
