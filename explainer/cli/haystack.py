"""The `haystack` command: long-context source finding on SQuAD haystack prompts (`explainer/haystack.py`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import InputError
from ..eval.datasets import HAYSTACK_PARAGRAPHS, SQUAD_V2_DEV, haystack_rows, resolve_data
from ..eval.evaluate import load_squad
from ..eval.haystack import HaystackConfig, format_table, merge_rows, run_haystack, summarise
from ..eval.resumable import read_results
from ..methods import parse_methods
from ..models.loading import load_model
from ..runtime.precision import parse_dtype
from .options import methods_help, model_options, placement


def cmd_haystack(args: argparse.Namespace) -> int:
    if args.report:
        paths = [p.strip() for p in args.report.split(",") if p.strip()]
        missing = [p for p in paths if not Path(p).is_file()]
        if missing:
            raise InputError(f"Results file {missing[0]!r} does not exist.")
        print(format_table(summarise(merge_rows([read_results(p) for p in paths]))))
        return 0
    if not args.data:
        raise InputError(f"Give --data: a SQuAD JSON file or {SQUAD_V2_DEV}.")
    names, method_options = parse_methods(args.methods)
    if args.results and not Path(args.results).resolve().parent.is_dir():
        raise InputError(f"Cannot write {args.results!r}: its folder does not exist.")
    squad = load_squad(resolve_data(args.data))  # every row: distractors come from the whole file
    rows = haystack_rows(squad, args.paragraphs, args.seed)[args.offset : args.offset + args.limit]
    cfg = HaystackConfig(methods=tuple(names), max_new_tokens=args.max_new_tokens, method_options=method_options)
    bundle = load_model(args.model, **placement(args), dtype=parse_dtype(args.dtype), max_prompt_tokens=8192)
    summary = run_haystack(bundle, rows, cfg, args.results, log=lambda m: print(m, file=sys.stderr))
    print(format_table(summary))
    return 0


def add_haystack_parser(sub) -> None:
    """Register `python -m explainer haystack` on the CLI's subparsers."""
    p = sub.add_parser(
        "haystack",
        help="long-context source finding: a SQuAD paragraph among 9 others; does the top sentence hold the answer?",
    )
    p.add_argument("--data", help=f"SQuAD JSON file (as for eval) or {SQUAD_V2_DEV}")
    p.add_argument("--methods", default="macs,rollout,random", help=methods_help("comma-separated methods"))
    p.add_argument("--limit", type=int, default=100, help="haystack prompts to evaluate (from --offset on)")
    p.add_argument("--offset", type=int, default=0, help="skip the first N prompts")
    p.add_argument("--paragraphs", type=int, default=HAYSTACK_PARAGRAPHS, help="paragraphs per prompt, gold included")
    p.add_argument("--seed", type=int, default=0, help="seed of the distractors and the gold paragraph's position")
    p.add_argument("--max-new-tokens", type=int, default=16)
    model_options(p, device_map=False)
    p.add_argument("--results", help="JSON-lines file, one row per prompt; a rerun skips the prompts already in it")
    p.add_argument("--report", help="comma-separated --results files: print their table without measuring")
    p.set_defaults(func=cmd_haystack)
