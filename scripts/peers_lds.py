"""The external references' LDS (ContextCite 0.0.4, AT2 0.0.1) on the rows the `lds` command measures, written as
rows of its results file so that `python -m explainer lds --report LDS.jsonl,PEERS.jsonl` shows them beside the methods
(explainer/eval/peers.py says what each peer is handed and what is compared).

Needs the optional extras: pip install .[peers]. AT2 is first trained by its own trainer on --train-limit rows of
--train-data from --train-offset on (default: the rows after the evaluated ones in --data; never the evaluated rows),
--at2-steps steps. Resumable: each row is appended to --results as it finishes, and a rerun skips the rows there;
with --at2-work DIR, AT2's features of its training rows are kept there and a rerun reuses them.

Usage: python scripts/peers_lds.py --data squad2-dev.json --limit 39 --results peers.jsonl
       [--train-data squad-train.json --train-offset 0 --train-limit 8 --at2-steps 50] [--dtype float32]
       [--model ID_OR_FOLDER]
Each row also records the peers' own LDS ("lds_theirs") and the largest per-token log-probability difference between
their ablations and ours ("max_abs_logp_diff"); the summary lines print both. Join with an `lds` run of the same
--dtype and --max-new-tokens (the report refuses rows whose answers or precisions differ).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shlex
import sys
import tempfile
import zlib
from collections.abc import Iterator
from pathlib import Path

from explainer.eval.datasets import resolve_data
from explainer.eval.evaluate import load_squad
from explainer.eval.lds_eval import format_table, summarise
from explainer.eval.peers import PEERS, PeerConfig, run_peers
from explainer.models.loading import load_model
from explainer.runtime.precision import parse_dtype


def agreement_lines(rows: list[dict]) -> list[str]:
    """One line per peer: its mean LDS by its own code and by ours, their largest difference, and the largest
    per-token log-probability difference of its ablations from ours."""
    lines = []
    for name in dict.fromkeys(n for r in rows for n in r.get("peers", {})):
        entries = [r["peers"][name] for r in rows if name in r.get("peers", {})]
        pairs = [(e["lds"], e["lds_theirs"]) for e in entries if None not in (e["lds"], e["lds_theirs"])]
        ours = sum(p[0] for p in pairs) / max(len(pairs), 1)
        theirs = sum(p[1] for p in pairs) / max(len(pairs), 1)
        gap = max((abs(a - b) for a, b in pairs), default=float("nan"))
        logp = max(e["max_abs_logp_diff"] for e in entries)
        lines.append(f"{name}: LDS ours {ours:.4f}, theirs {theirs:.4f} (largest row difference {gap:.2e}); "
                     f"largest per-token log p difference {logp:.2e} over {len(entries)} rows")  # fmt: skip
    return lines


@contextlib.contextmanager
def at2_folder(root: str | None, train: list[dict], args: argparse.Namespace) -> Iterator[str]:
    """AT2's trainer folder: a temporary one, or one under `root` named after what its stored features depend on
    (training rows, masks, precision, answer length, model), so that a rerun with the same training reuses them."""
    if root is None:
        with tempfile.TemporaryDirectory() as work:
            yield work
        return
    key = json.dumps([[r["id"] for r in train], args.masks, args.dtype, args.max_new_tokens, args.model])
    work = Path(root) / f"at2-{zlib.crc32(key.encode('utf-8')):08x}"
    work.mkdir(parents=True, exist_ok=True)
    yield str(work)


def add_peer_options(p: argparse.ArgumentParser, train_data_help: str, row: str) -> None:
    """The options `peers_lds.py` and `peers_hitratio.py` share: which peers, AT2's training, the model, the results
    file (one row per `row`)."""
    p.add_argument("--train-data", default=None, help=train_data_help)
    p.add_argument("--train-offset", type=int, default=None,
                   help="first row of --train-data AT2 is trained on (default: 0; without --train-data, the row "
                   "after the evaluated ones)")  # fmt: skip
    p.add_argument("--train-limit", type=int, default=4, help="rows AT2 is trained on (a check, not a result)")
    p.add_argument("--at2-steps", type=int, default=PeerConfig.at2_steps)
    p.add_argument("--max-new-tokens", type=int, default=PeerConfig.max_new_tokens)
    p.add_argument("--masks", type=int, default=PeerConfig.masks, help="masks per row (LDS; AT2's training)")
    p.add_argument("--context-cite-ablations", type=int, default=PeerConfig.context_cite_ablations,
                   help="ablations ContextCite fits its surrogate on (its default: 64)")  # fmt: skip
    p.add_argument("--peers", default=",".join(PEERS),
                   help=f"comma-separated references to run (default: {','.join(PEERS)})")  # fmt: skip
    p.add_argument("--model", default=None, help="hub id or local folder (default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default="float32", help="as the lds command's --dtype (auto, float32, bfloat16, ...)")
    p.add_argument("--at2-work", default=None,
                   help="folder kept for AT2's trainer (its features of the training rows, which a rerun reuses); "
                   "default: a temporary folder")  # fmt: skip
    p.add_argument("--results", required=True,
                   help=f"JSON-lines file, one row per {row}, appended as each finishes; a rerun skips the {row}s "
                   "already in it")  # fmt: skip


def parse_peers(p: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[str, ...]:
    peers = tuple(dict.fromkeys(n.strip() for n in args.peers.split(",") if n.strip()))
    if not peers or set(peers) - set(PEERS):
        p.error(f"--peers: choose from {', '.join(PEERS)}, got {args.peers!r}")
    return peers


def peer_config(args: argparse.Namespace, peers: tuple[str, ...], script: str, argv: list[str] | None) -> PeerConfig:
    command = f"python scripts/{script} " + shlex.join(sys.argv[1:] if argv is None else argv)
    return PeerConfig(max_new_tokens=args.max_new_tokens, masks=args.masks, at2_steps=args.at2_steps,
                      context_cite_ablations=args.context_cite_ablations, peers=peers, command=command)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="SQuAD JSON file (as for the lds command)")
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--offset", type=int, default=0)
    add_peer_options(p, "SQuAD file AT2 is trained on (default: --data, after the rows)", "evaluated row")
    args = p.parse_args(argv)
    peers = parse_peers(p, args)
    rows = load_squad(resolve_data(args.data), args.limit, offset=args.offset)
    if args.train_data:
        train = load_squad(resolve_data(args.train_data), args.train_limit, offset=args.train_offset or 0)
    else:
        start = args.offset + len(rows) if args.train_offset is None else args.train_offset
        train = load_squad(resolve_data(args.data), args.train_limit, offset=start)
    evaluated = {r["id"] for r in rows}
    train = [r for r in train if r["id"] not in evaluated]
    cfg = peer_config(args, peers, "peers_lds.py", argv)
    bundle = load_model(args.model, device=args.device, dtype=parse_dtype(args.dtype))
    with at2_folder(args.at2_work, train, args) as work:
        results = run_peers(bundle, rows, train, cfg, work, args.results, log=lambda m: print(m, file=sys.stderr))
    print(format_table(summarise(results)))
    print("\n".join(["", *agreement_lines(results)]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
