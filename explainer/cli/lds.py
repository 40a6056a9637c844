"""The `lds` command: LDS and top-k log-probability drop over the context's sentences on SQuAD rows
(`explainer/eval/lds_eval.py`), resumable, and data-parallel under `torchrun` as `eval` is; with `--peers`, the
external references on the same rows instead (`cli/peers.py`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import InputError
from ..eval.datasets import SQUAD_V2_DEV, haystack_rows, resolve_data, select_rows
from ..eval.evaluate import load_squad, merge_results
from ..eval.lds import KEEP_PROBABILITY, MASKS, TOP_K
from ..eval.lds_eval import LdsConfig, format_table, paired_lines, run_lds, sentence_bins, summarise
from ..eval.parallel import rank_from_env
from ..eval.peer_rescore import rescore_lines, rescore_peers
from ..eval.peers import PeerConfig, parse_peers
from ..methods import available_methods, parse_methods
from ..models.loading import load_model
from ..runtime.precision import parse_dtype
from .options import comparisons, held_out, methods_help, model_options, placement, rank_share, sentence_edges
from .peers import add_peer_options, agreement_lines, run_peer_rows, training_rows

DEFAULT_METHODS = ",".join(available_methods())  # every registered method


def chosen_rows(args: argparse.Namespace) -> list[dict]:
    """The SQuAD rows of --data, those of --ids only (in its order) when given, then --offset and --limit."""
    if args.ids is None:
        return load_squad(resolve_data(args.data), args.limit, offset=args.offset)
    rows = select_rows(load_squad(resolve_data(args.data)), args.ids)
    return load_squad_rows_slice(rows, args.offset, args.limit)


def load_squad_rows_slice(rows: list[dict], offset: int, limit: int | None) -> list[dict]:
    """rows[offset : offset + limit] (limit None: to the end), refusing negative values as `load_squad` does."""
    if offset < 0 or (limit is not None and limit < 0):
        raise InputError(f"--offset and --limit must be 0 or more, got {offset} and {limit}.")
    return rows[offset : offset + limit] if limit is not None else rows[offset:]


def cmd_lds(args: argparse.Namespace) -> int:
    rank = rank_from_env()
    if args.report:
        if rank.rank > 0:
            return 0  # launched data-parallel: one report is enough
        samples = merge_results(_paths(args.report))
        if args.rows:
            kept = {row["id"] for row in merge_results(_paths(args.rows))}
            samples = [s for s in samples if s["id"] in kept]
        print(format_table(summarise(samples)))
        for line in paired_lines(samples, comparisons(args.compare)):
            print(line)
        for label, kept in sentence_bins(samples, sentence_edges(args.by_sentences)) if args.by_sentences else ():
            for line in paired_lines(kept, comparisons(args.compare)):
                print(f"{label}: {line}")
        return 0
    if args.rows or args.by_sentences:
        raise InputError("--rows and --by-sentences read a --report; give --report too.")
    if not args.data:
        raise InputError(f"Give --data: a SQuAD JSON file or {SQUAD_V2_DEV} (or --report to summarise results).")
    peers = parse_peers(args.peers) if args.peers else ()  # before loading a model: a clear message when absent
    names, method_options = parse_methods(args.methods)  # fail on a bad name or option before loading a model
    if args.results and not Path(args.results).resolve().parent.is_dir():
        raise InputError(f"Cannot write {args.results!r}: its folder does not exist.")
    if rank.world > 1 and not args.results:
        raise InputError(
            f"This is rank {rank.rank} of {rank.world} processes: give --results PATH, to which each rank writes "
            "its own file (PATH with .rankR-of-W before the suffix); join them with --report PATH."
        )
    rows = chosen_rows(args)  # long contexts are built as `surrogate --paragraphs` builds them (the same rows, ids)
    rows = haystack_rows(rows, args.paragraphs) if args.paragraphs > 1 else held_out(rows)
    if rank.world > 1:
        rows, args = rank_share(rows, argparse.Namespace(**{**vars(args), "json": None}), rank)
    if peers:
        return _run_peers(args, rows, peers)
    cfg = LdsConfig(methods=tuple(names), max_new_tokens=args.max_new_tokens, masks=args.masks, seed=args.seed,
                    batch_size=args.batch_size, method_options=method_options, command=args.command_line)  # fmt: skip
    bundle = load_model(args.model, **placement(args), dtype=parse_dtype(args.dtype))
    summary = run_lds(bundle, rows, cfg, args.results, log=lambda m: print(m, file=sys.stderr))
    print(format_table(summary))
    return 0


def _paths(text: str) -> list[str]:
    """The paths of a comma-separated --report or --rows."""
    return [p.strip() for p in text.split(",") if p.strip()]


def _run_peers(args: argparse.Namespace, rows: list[dict], peers: tuple[str, ...]) -> int:
    """`--peers`: the references on the rows, AT2 trained on rows after them (or on --train-data)."""
    after = len(rows) + args.offset

    def default_rows(offset: int | None) -> list[dict]:
        start = after if offset is None else offset
        return load_squad_rows_slice(chosen_rows(argparse.Namespace(**{**vars(args), "offset": 0, "limit": None})),
                                     start, None)  # fmt: skip

    if args.rescore:
        return _rescore(args, rows, peers)
    train = training_rows(args, default_rows, {r["id"] for r in rows})
    bundle = load_model(args.model, **placement(args), dtype=parse_dtype(args.dtype))
    results = run_peer_rows(args, bundle, rows, train, peers, args.masks)
    print(format_table(summarise(results)))
    print("\n".join(["", *agreement_lines(results)]))
    return 0


def _rescore(args: argparse.Namespace, rows: list[dict], peers: tuple[str, ...]) -> int:
    """`--rescore FILE`: the peers' rows of FILE measured again from their stored scores (raw and centred LDS)."""
    if not Path(args.rescore).is_file():
        raise InputError(f"--rescore: {args.rescore!r} is not a results file of `lds --peers`.")
    cfg = PeerConfig(max_new_tokens=args.max_new_tokens, masks=args.masks, peers=peers, command=args.command_line,
                     context_cite_ablations=args.context_cite_ablations)  # fmt: skip
    bundle = load_model(args.model, **placement(args), dtype=parse_dtype(args.dtype))
    results = rescore_peers(bundle, rows, args.rescore, cfg, args.results, log=lambda m: print(m, file=sys.stderr))
    print(format_table(summarise(results)))
    print("\n".join(["", *rescore_lines(results)]))
    return 0


def add_lds_parser(sub) -> None:
    """Register `python -m explainer lds` on the CLI's subparsers."""
    p = sub.add_parser(
        "lds",
        help=f"LDS ({MASKS} random ablations of the context's sentences, each kept with probability "
        f"{KEEP_PROBABILITY}) and top-{'/'.join(map(str, TOP_K))} log-probability drop on a SQuAD file",
    )
    p.add_argument("--data", help=f"SQuAD JSON file (as for eval) or {SQUAD_V2_DEV}, downloaded once into the cache")
    p.add_argument(
        "--ids", default=None,
        help="file naming the questions to use, in order (lines 'ID' or 'ID KEY', see datasets.select_rows), e.g. "
        "docs/results/squad-dev-350.ids with --data squad_v2-dev; --offset and --limit count within them",
    )  # fmt: skip
    p.add_argument("--methods", default=DEFAULT_METHODS, help=methods_help("comma-separated methods with options"))
    p.add_argument("--limit", type=int, default=None, help="evaluate only the first N rows (from --offset on)")
    p.add_argument("--offset", type=int, default=0, help="skip the first N rows")
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--masks", type=int, default=MASKS, help="random ablation masks per row")
    p.add_argument("--seed", type=int, default=0, help="seed of the masks (with each row's id)")
    p.add_argument("--batch-size", type=int, default=0, help="most ablation runs per forward (0: from the device)")
    p.add_argument("--paragraphs", type=int, default=0,
                   help="long contexts: this many paragraphs joined, as `surrogate --paragraphs` (0: none)")
    model_options(p)
    p.add_argument("--results", help="JSON-lines file, one row per sample; a rerun skips the rows already in it")
    p.add_argument(
        "--report",
        help="comma-separated --results files (e.g. methods run separately on the same rows): join them by row id "
        "and print the tables without measuring; a path also joins the rank files of a data-parallel run",
    )
    p.add_argument("--compare", default=None,
                   help="with --report: paired differences to print, e.g. sources/context-cite (A - B, same rows); a "
                   "side A1+A2 is each row's mean of A1 and A2")
    p.add_argument("--rows", default=None,
                   help="with --report: keep only the rows whose ids these comma-separated results files hold (e.g. "
                   "a re-run of some questions, joined with earlier files that hold more)")
    p.add_argument("--by-sentences", default=None,
                   help="with --report and --compare: the paired differences again for the rows in each bin of "
                   "sentence counts, split at these ascending counts (e.g. 20,24,28)")
    add_peer_options(p)
    p.add_argument("--rescore", default=None,
                   help="with --peers: measure the rows of this `lds --peers` results file again from the scores it "
                   "stores (raw and centred LDS on each peer's own masks; the peers do not run)")  # fmt: skip
    p.set_defaults(func=cmd_lds)
