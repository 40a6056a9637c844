"""The `surrogate` command: Sources' surrogate at several ablation counts (and pass kinds) on the rows the `lds`
command measures, written as rows of its results file (`explainer/eval/surrogate_lds.py`), resumable."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import InputError
from ..eval.datasets import SQUAD_V2_DEV, haystack_rows
from ..eval.lds_eval import format_table, summarise
from ..eval.resumable import measure_and_summarise
from ..eval.surrogate_lds import SurrogateLdsConfig, measure
from ..methods import parse_methods
from ..methods.sources import PASSES, SourcesConfig
from ..models.loading import load_model
from ..runtime.precision import parse_dtype
from .lds import chosen_rows
from .options import model_options, placement


def _counts(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(sorted({int(c) for c in text.split(",") if c.strip()}))
    except ValueError:
        counts = ()
    if not counts or min(counts) < 1:
        raise InputError(f"--counts takes whole numbers of 1 or more, comma-separated, e.g. 8,16,32; got {text!r}")
    return counts


def _passes(text: str) -> tuple[str, ...]:
    passes = tuple(dict.fromkeys(p.strip() for p in text.split(",") if p.strip()))
    if not passes or any(p not in PASSES for p in passes):
        raise InputError(f"--passes takes {' and/or '.join(PASSES)}, comma-separated; got {text!r}")
    return passes


def _options(text: str) -> dict:
    options = parse_methods("sources" + (":" + text if text else ""))[1].get("sources", {})
    for key in ("ablations", "passes", "fit"):
        if key in options:
            raise InputError(f"--options sets {key!r}: give --counts and --passes instead (the fit is the surrogate).")
    SourcesConfig(**options)  # a bad option fails here, before the model loads
    return options


def cmd_surrogate(args: argparse.Namespace) -> int:
    sets = [_options(text) for text in (args.options or [""])]
    cfg = SurrogateLdsConfig(counts=_counts(args.counts), options=sets[0], more_options=tuple(sets[1:]),
                             passes=_passes(args.passes), reference=args.reference, seed=args.seed,
                             max_new_tokens=args.max_new_tokens, command=args.command_line)  # fmt: skip
    if args.results and not Path(args.results).resolve().parent.is_dir():
        raise InputError(f"Cannot write {args.results!r}: its folder does not exist.")
    rows = chosen_rows(args)
    if args.paragraphs > 1:
        rows = haystack_rows(rows, args.paragraphs)
    bundle = load_model(args.model, **placement(args), dtype=parse_dtype(args.dtype))
    summary = measure_and_summarise(rows, lambda row: measure(bundle, row, cfg), summarise, args.results,
                                    bundle.model, lambda m: print(m, file=sys.stderr))  # fmt: skip
    print(format_table(summary))
    return 0


def add_surrogate_parser(sub) -> None:
    """Register `python -m explainer surrogate` on the CLI's subparsers."""
    p = sub.add_parser(
        "surrogate",
        help="Sources' surrogate at several ablation counts on the `lds` rows, scored by their LDS (rows join "
        "`lds --report`)",
    )
    p.add_argument("--data", required=True, help=f"SQuAD JSON file or {SQUAD_V2_DEV}")
    p.add_argument("--ids", default=None, help="ids file naming the questions, in order (as for `lds`)")
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--offset", type=int, default=0)
    p.add_argument("--counts", default="8,16,32,64", help="ablation counts k, each fitted on its own design")
    p.add_argument("--passes", default="removal", help=f"pass kinds, comma-separated: {', '.join(PASSES)}")
    p.add_argument("--options", action="append", help="Sources' other options as on the command line: context=Context; "
                   "repeat it for more variants on the same passes (e.g. regulariser=lasso)")
    p.add_argument("--paragraphs", type=int, default=0, help="long contexts: this many paragraphs joined (0: none)")
    p.add_argument("--reference", type=int, default=0, help="masks of a least-squares ContextCite fit (0: none)")
    p.add_argument("--seed", type=int, default=0, help="seed of the `lds` masks (with each row's id)")
    p.add_argument("--max-new-tokens", type=int, default=16)
    model_options(p)
    p.add_argument("--results", help="JSON-lines file; a rerun skips the rows already in it")
    p.set_defaults(func=cmd_surrogate)
