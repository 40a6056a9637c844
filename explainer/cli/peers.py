"""`--peers context-cite,at2` of the `lds` and `hitratio` commands: the external references (ContextCite, AT2;
`explainer/eval/peers.py`) run on the same rows and prompts, written as rows that `--report` joins with the methods'.
The references are optional extras, imported only when `--peers` is given (`peers.parse_peers` says what to install
when they are absent)."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import zlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from ..eval.datasets import resolve_data, select_rows
from ..eval.evaluate import load_squad
from ..eval.peers import PEERS, PeerConfig, run_peers


def add_peer_options(p: argparse.ArgumentParser) -> None:
    """--peers and AT2's training options (--masks and --max-new-tokens come from the command itself)."""
    g = p.add_argument_group("references (optional extras: pip install '.[peers]')")
    g.add_argument("--peers", default=None,
                   help=f"run these references instead of the methods, comma-separated ({','.join(PEERS)}), into "
                   "their own --results file; join it with the methods' by --report A,B")  # fmt: skip
    g.add_argument("--train-data", default=None,
                   help="SQuAD file (or squad_v2-dev) AT2 is trained on (lds default: --data, after the rows)")
    g.add_argument("--train-ids", default=None,
                   help="ids file choosing the questions of --train-data, in order, before --train-offset and "
                   "--train-limit (as --ids of `lds`)")  # fmt: skip
    g.add_argument("--train-offset", type=int, default=None, help="first row of the training data AT2 is trained on")
    g.add_argument("--train-limit", type=int, default=4, help="rows AT2 is trained on")
    g.add_argument("--at2-steps", type=int, default=PeerConfig.at2_steps, help="AT2's training steps")
    g.add_argument("--context-cite-ablations", type=int, default=PeerConfig.context_cite_ablations,
                   help="ablations ContextCite fits its surrogate on (its default: 64)")  # fmt: skip
    g.add_argument("--at2-work", default=None,
                   help="folder kept for AT2's trainer (its features, which a rerun reuses); default: a temporary one")


def training_rows(args: argparse.Namespace, default_rows: Callable[[int], list[dict]] | None,
                  evaluated: set[str]) -> list[dict]:  # fmt: skip
    """AT2's training rows: --train-limit rows of --train-data (those of --train-ids, in its order, when given) from
    --train-offset on, or of `default_rows(offset)`
    (the `lds` command's own data after its evaluated rows); never an evaluated row."""
    if args.train_data:
        rows = load_squad(resolve_data(args.train_data))
        rows = select_rows(rows, args.train_ids) if args.train_ids else rows
        start = args.train_offset or 0
        rows = rows[start : start + args.train_limit]
    elif default_rows is not None:
        rows = default_rows(args.train_offset)[: args.train_limit]
    else:
        rows = []
    return [r for r in rows if r["id"] not in evaluated]


def run_peer_rows(args: argparse.Namespace, bundle, rows: list[dict], train: list[dict], peers: tuple[str, ...],
                  masks: int, measure=None) -> list[dict]:  # fmt: skip
    """The references on `rows` (resumable into --results), AT2 trained first on `train` when it is asked for."""
    cfg = PeerConfig(max_new_tokens=args.max_new_tokens, masks=masks, at2_steps=args.at2_steps,
                     context_cite_ablations=args.context_cite_ablations, peers=peers, command=args.command_line)
    key = [masks, args.dtype, args.max_new_tokens, args.model]
    with at2_folder(args.at2_work, train, key) as work:
        return run_peers(bundle, rows, train, cfg, work, args.results, log=lambda m: print(m, file=sys.stderr),
                         measure=measure)  # fmt: skip


@contextlib.contextmanager
def at2_folder(root: str | None, train: list[dict], key: Sequence[Any]) -> Iterator[str]:
    """AT2's trainer folder: a temporary one, or one under `root` named after its training rows and `key` (what its
    stored features depend on: masks, precision, answer length, model), so that a rerun with the same training
    reuses them."""
    if root is None:
        with tempfile.TemporaryDirectory() as work:
            yield work
        return
    digest = json.dumps([[r["id"] for r in train], *key])
    work = Path(root) / f"at2-{zlib.crc32(digest.encode('utf-8')):08x}"
    work.mkdir(parents=True, exist_ok=True)
    yield str(work)


def agreement_lines(rows: list[dict]) -> list[str]:
    """One line per peer: its mean LDS by its own code and by ours, their largest difference, and the largest
    per-token log-probability difference of its ablations from ours."""
    lines = []
    for name in dict.fromkeys(n for r in rows for n in r.get("peers", {})):
        entries = [r["peers"][name] for r in rows if "lds_theirs" in r.get("peers", {}).get(name, {})]
        if not entries:
            continue
        pairs = [(e["lds"], e["lds_theirs"]) for e in entries if None not in (e["lds"], e["lds_theirs"])]
        ours = sum(p[0] for p in pairs) / max(len(pairs), 1)
        theirs = sum(p[1] for p in pairs) / max(len(pairs), 1)
        gap = max((abs(a - b) for a, b in pairs), default=float("nan"))
        logp = max(e["max_abs_logp_diff"] for e in entries)
        lines.append(f"{name}: LDS ours {ours:.4f}, theirs {theirs:.4f} (largest row difference {gap:.2e}); "
                     f"largest per-token log p difference {logp:.2e} over {len(entries)} rows")  # fmt: skip
    return lines
