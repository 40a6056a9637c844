"""The `hitratio` command: the needle test (ABO's hit ratio, made harder) on needle-in-a-haystack prompts with a made-up
password (`explainer/eval/hitratio.py`), resumable, and data-parallel under `torchrun` as `eval` is; with `--peers`, the
external references on the same prompts instead (`cli/peers.py`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..bench.prompts import DEFAULT_TEXT_NAME, prompt_text
from ..errors import InputError
from ..eval.datasets import SQUAD_V2_DEV, resolve_data
from ..eval.evaluate import merge_results
from ..eval.hitratio import (
    DEPTHS,
    LENGTHS,
    VARIANTS,
    HitRatioConfig,
    format_table,
    needle_rows,
    needle_specs,
    run_hitratio,
)
from ..eval.hitratio import summarise as summarise_hits
from ..eval.parallel import rank_from_env
from ..eval.peers import PeerConfig, parse_peers, peer_needle_row
from ..methods import parse_methods
from ..models.loading import load_model
from ..runtime.precision import parse_dtype
from .lds import DEFAULT_METHODS
from .options import comparisons, methods_help, model_options, placement, rank_share
from .peers import add_peer_options, run_peer_rows, training_rows


def _whole_numbers(text: str, what: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError as e:
        raise InputError(f"{what} must be comma-separated whole numbers, got {text!r}.") from e
    if not values or min(values) < 0:
        raise InputError(f"{what} must be comma-separated whole numbers of 0 or more, got {text!r}.")
    return values


def needle_plan(lengths: str, depths: str, samples: int, limit: int | None,
                variants: str = "plain") -> list[tuple[int, int, int, str]]:  # fmt: skip
    """The (length, depth, sample, variant) needle prompts of --lengths, --depths, --samples, --variants and --limit
    (`needle_specs`).

    Raises:
        InputError: a length or depth is not a whole number of 0 or more, a depth is over 100 (%), or a variant is
            unknown.
    """
    depth_values = _whole_numbers(depths, "--depths")
    if max(depth_values) > 100:
        raise InputError(f"--depths are percentages of the haystack (0 to 100), got {depths!r}.")
    chosen = tuple(dict.fromkeys(v.strip() for v in variants.split(",") if v.strip()))
    if not chosen or set(chosen) - set(VARIANTS):
        raise InputError(f"--variants: choose from {', '.join(VARIANTS)}, got {variants!r}.")
    return needle_specs(_whole_numbers(lengths, "--lengths"), depth_values, samples, chosen)[:limit]


def cmd_hitratio(args: argparse.Namespace) -> int:
    rank = rank_from_env()
    if args.report:
        if rank.rank == 0:  # launched data-parallel: one report is enough
            rows = merge_results([p.strip() for p in args.report.split(",") if p.strip()])
            print(format_table(summarise_hits(rows, comparisons(args.compare))))
        return 0
    peers = parse_peers(args.peers) if args.peers else ()  # before loading a model: a clear message when absent
    if "at2" in peers and not args.train_data:
        raise InputError("--peers at2 is trained on SQuAD rows first: give --train-data (a SQuAD file, squad_v2-dev).")
    names, method_options = parse_methods(args.methods)  # fail on a bad name or option before loading a model
    specs = needle_plan(args.lengths, args.depths, args.samples, args.limit, args.variants)
    pairs = comparisons(args.compare)
    if args.results and not Path(args.results).resolve().parent.is_dir():
        raise InputError(f"Cannot write {args.results!r}: its folder does not exist.")
    if rank.world > 1:
        if not args.results:
            raise InputError(f"This is rank {rank.rank} of {rank.world} processes: give --results PATH.")
        specs, args = rank_share(specs, argparse.Namespace(**{**vars(args), "json": None}), rank)
    paragraphs, source = prompt_text(resolve_data(args.data) if args.data else None, args.text)
    print(f"haystack text: {source}", file=sys.stderr)
    bundle = load_model(args.model, **placement(args), dtype=parse_dtype(args.dtype), max_prompt_tokens=8192)
    rows = needle_rows(bundle.tokenizer, paragraphs, specs, args.seed)
    if peers:
        train = training_rows(args, None, set())
        results = run_peer_rows(args, bundle, rows, train, peers, PeerConfig.masks, measure=peer_needle_row)
        print(format_table(summarise_hits(results, pairs)))
        return 0
    cfg = HitRatioConfig(
        methods=tuple(names),
        max_new_tokens=args.max_new_tokens,
        method_options=method_options,
        command=args.command_line,
    )
    print(format_table(run_hitratio(bundle, rows, cfg, args.results, lambda m: print(m, file=sys.stderr), pairs)))
    return 0


def add_hitratio_parser(sub) -> None:
    """Register `python -m explainer hitratio` on the CLI's subparsers."""
    p = sub.add_parser(
        "hitratio",
        help="needle test (ABO's hit ratio, made harder): each map's mass share and AP on the needle of needle prompts",
    )
    p.add_argument("--methods", default=DEFAULT_METHODS, help=methods_help("comma-separated methods with options"))
    p.add_argument("--lengths", default=",".join(map(str, LENGTHS)), help="prompt lengths in tokens, about")
    p.add_argument("--depths", default=",".join(map(str, DEPTHS)), help="needle depths, %% of the haystack")
    p.add_argument("--samples", type=int, default=4, help="prompts per length and depth (other text and password)")
    p.add_argument("--variants", default="plain",
                   help=f"comma-separated needle variants: {', '.join(VARIANTS)} (default: plain)")  # fmt: skip
    p.add_argument("--compare", default=None,
                   help="paired differences to print, e.g. macs_calibrated/macs,sources/macs (A - B on the same rows)")
    p.add_argument("--limit", type=int, default=None, help="run only the first N prompts (whole depth sweeps first)")
    p.add_argument(
        "--data", default=None,
        help=f"haystack text from the contexts of a SQuAD file or {SQUAD_V2_DEV} (default: {DEFAULT_TEXT_NAME})",
    )  # fmt: skip
    p.add_argument("--text", default=None, help="haystack text from a plain UTF-8 file instead")
    p.add_argument("--seed", type=int, default=0, help="seed of the passwords and of where each haystack starts")
    p.add_argument("--max-new-tokens", type=int, default=16)
    model_options(p)
    p.add_argument("--results", help="JSON-lines file, one row per prompt; a rerun skips the prompts already in it")
    p.add_argument("--report", help="comma-separated --results files (rank files joined): print the table only")
    add_peer_options(p)
    p.set_defaults(func=cmd_hitratio)
