"""The `eval` command: the MACS paper's QA evaluation on a SQuAD file (the logic lives in `explainer.eval.evaluate`)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..eval.datasets import SQUAD_V2_DEV, resolve_data
from ..eval.evaluate import EvalConfig, format_tables, load_squad, merge_results, run_evaluation, summarise
from ..eval.parallel import rank_from_env
from ..methods import parse_methods
from ..models.loading import load_model
from ..runtime.precision import parse_dtype, precision_meta
from .options import held_out, methods_help, model_options, placement, rank_share


def cmd_eval(args: argparse.Namespace) -> int:
    names, method_options = parse_methods(args.methods)  # fail on a bad name or option before loading a model
    dtype = parse_dtype(args.dtype)
    methods = tuple(names)
    for path in (args.json, args.results):
        if path and not Path(path).resolve().parent.is_dir():
            raise InputError(f"Cannot write {path!r}: its folder does not exist.")
    rank = rank_from_env()
    if rank.world > 1 and not args.report and not args.results:
        raise InputError(
            f"This is rank {rank.rank} of {rank.world} processes: give --results PATH, to which each rank writes "
            "its own file (PATH with .rankR-of-W before the suffix); join them with --report PATH."
        )
    if args.report:
        if rank.rank > 0:
            return 0  # launched data-parallel: one report is enough
        samples = merge_results([p.strip() for p in args.report.split(",") if p.strip()])
        summary = {**summarise(samples), "samples": samples}
        summary["seconds"] = sum(s.get("seconds", 0.0) for s in samples)
        print(format_tables(summary))
        print(f"\ncompute recorded in the results: {summary['seconds']:.0f} s")
        return _write_summary(summary, args.json)
    if not args.data:
        raise InputError(
            f"--data is required: a SQuAD JSON file or {SQUAD_V2_DEV} (or --report to summarise earlier results)."
        )
    # squad_v2-dev: downloaded once, then the cached copy
    rows = held_out(load_squad(resolve_data(args.data), args.limit, offset=args.offset))
    if rank.world > 1:
        rows, args = rank_share(rows, args, rank)
    cfg = EvalConfig(
        methods=methods,
        max_new_tokens=args.max_new_tokens,
        faithfulness=not args.skip_faithfulness,
        ablation=args.ablation,
        seed=args.seed,
        method_options=method_options,
    )
    bundle = load_model(args.model, **placement(args), dtype=dtype)
    start = time.perf_counter()
    summary = run_evaluation(bundle, rows, cfg, args.results, log=lambda msg: print(msg, file=sys.stderr))
    summary["seconds"] = time.perf_counter() - start
    summary["config"] = {"model": bundle.name, **precision_meta(bundle.model), "data": str(args.data), **vars(cfg)}
    print(format_tables(summary))
    print(f"\nelapsed: {summary['seconds']:.1f} s")
    return _write_summary(summary, args.json)


def _write_summary(summary: dict[str, Any], path: str | None) -> int:
    if path:
        try:
            Path(path).write_text(json.dumps(summary, indent=2), encoding="utf-8")
        except OSError as e:
            raise InputError(f"Cannot write {path!r}: {e}") from e
        print(f"wrote {path}")
    return 0


def add_eval_parser(sub) -> None:
    """Register `python -m explainer eval` on the CLI's subparsers."""
    p = sub.add_parser("eval", help="AUC-PR and MIF/LIF/SRG on a SQuAD file (MACS paper Tables 2, 4, 5)")
    p.add_argument(
        "--data",
        help=f"SQuAD JSON file (rows as a list or {{'rows': [...]}}, or the official SQuAD 2.0 layout; answerable "
        f"questions are used), or {SQUAD_V2_DEV}: the official SQuAD 2.0 dev set, downloaded once into the cache",
    )
    p.add_argument("--limit", type=int, default=None, help="evaluate only the first N rows (from --offset on)")
    p.add_argument(
        "--offset", type=int, default=0, help="skip the first N rows: split a long run into parts, joined with --report"
    )
    p.add_argument(
        "--methods",
        default="macs,rollout,atman,random",
        help=methods_help("comma-separated methods with options: macs:alpha=0.5"),
    )
    p.add_argument("--max-new-tokens", type=int, default=64)
    model_options(p)
    p.add_argument("--json", help="write the summary and per-sample rows as JSON to this path")
    p.add_argument("--results", help="JSON-lines file of per-sample results; a rerun skips the ids already in it")
    p.add_argument("--skip-faithfulness", action="store_true", help="AUC-PR only (no removal runs)")
    p.add_argument("--ablation", action="store_true", help="run the MACS variants of Table 4 instead of --methods")
    p.add_argument("--seed", type=int, default=0, help="seed of the random baseline's orderings")
    p.add_argument(
        "--report",
        help="comma-separated --results files of earlier runs (e.g. different methods on the same samples): join "
        "them by sample id and print the tables without evaluating; a path also joins the rank files of a "
        "data-parallel run that wrote to it",
    )
    p.set_defaults(func=cmd_eval)
