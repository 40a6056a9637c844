"""The `agreement` command: per-step agreement of each method's low-precision maps with its float32 maps.

The method and the statistics live in `explainer.eval.agreement`; this module reads the options, loads the prompts and
both models once, and prints the table.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import InputError
from ..eval.agreement import (
    POSITIONS,
    AgreementConfig,
    example_prompts,
    format_table,
    run_agreement,
    squad_prompts,
    summarise,
)
from ..eval.datasets import SQUAD_V2_DEV, resolve_data
from ..eval.evaluate import load_squad, read_results
from ..methods import parse_methods
from ..models.loading import load_model
from ..runtime.precision import dtype_name, parse_dtype


def cmd_agreement(args: argparse.Namespace) -> int:
    if args.report:
        rows: dict[str, dict] = {}  # by prompt id: a later file's row wins
        for path in (p.strip() for p in args.report.split(",") if p.strip()):
            if not Path(path).is_file():
                raise InputError(f"Results file {path!r} does not exist.")
            rows.update((r["id"], r) for r in read_results(path) if "id" in r)
        print(_table(list(rows.values()), args.positions))
        return 0
    names, method_options = parse_methods(args.methods)  # fail on a bad name or option before loading a model
    low = parse_dtype(args.dtype)
    if low is None or dtype_name(low) == "float32":
        raise InputError("--dtype must name the precision compared with float32: bfloat16 or float16.")
    if not args.results:
        raise InputError("--results FILE.jsonl is required: one row per prompt, so a long run can resume.")
    if not Path(args.results).resolve().parent.is_dir():
        raise InputError(f"Cannot write {args.results!r}: its folder does not exist.")
    prompts = [] if args.no_examples else example_prompts()
    if args.data:
        prompts += squad_prompts(load_squad(resolve_data(args.data), args.limit, offset=args.offset))
    if not prompts:
        raise InputError("No prompts: give --data with a SQuAD file, or leave out --no-examples.")
    cfg = AgreementConfig(methods=tuple(names), max_new_tokens=args.max_new_tokens, method_options=method_options)
    reference = load_model(args.model, device=args.device, dtype="float32")
    other = load_model(args.model, device=args.device, dtype=low)
    rows = run_agreement(reference, other, prompts, cfg, args.results, log=lambda m: print(m, file=sys.stderr))
    print(_table(rows, args.positions))
    return 0


def _table(rows: list[dict], positions: str) -> str:
    errors = [r for r in rows if "error" in r]
    ok = [r for r in rows if "error" not in r]
    pairs = sorted({f"{r.get('dtype')} vs {r.get('reference_dtype')}" for r in ok})
    head = f"{', '.join(pairs) or 'no results'}; {len(ok)} prompts; over the {positions} tokens"
    if errors:
        head += f"; {len(errors)} prompts failed: " + "; ".join(f"{r['id']}: {r['error']}" for r in errors)
    return head + "\n\n" + format_table(summarise(ok, positions))


def add_agreement_parser(sub) -> None:
    """Register `python -m explainer agreement` on the CLI's subparsers."""
    p = sub.add_parser(
        "agreement",
        help="per-step Spearman and top-5 overlap of each method's bfloat16 (or float16) maps with its float32 maps",
    )
    p.add_argument(
        "--methods", default="macs,rollout,atman,attnlrp,grad_ellm,input_x_gradient", help="comma-separated methods"
    )
    p.add_argument(
        "--data", help=f"SQuAD JSON file (as for eval) or {SQUAD_V2_DEV}; its questions follow the app's examples"
    )
    p.add_argument("--limit", type=int, default=50, help="SQuAD questions to use (from --offset on)")
    p.add_argument("--offset", type=int, default=0, help="skip the first N SQuAD questions")
    p.add_argument("--no-examples", action="store_true", help="leave out the app's example prompts")
    p.add_argument("--model", default=None, help="hub id or local folder (default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--device", default=None, help="cpu, cuda, ... (default: cuda if available)")
    p.add_argument("--dtype", default="bfloat16", help="the precision compared with float32: bfloat16 or float16")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--results", help="JSON-lines file, one row per prompt; a rerun skips the prompts already in it")
    p.add_argument(
        "--positions", choices=POSITIONS, default="prompt",
        help="compare over all prompt tokens or only the user's text (chat template tokens left out)",
    )  # fmt: skip
    p.add_argument("--report", help="comma-separated --results files: print their table without measuring")
    p.set_defaults(func=cmd_agreement)
