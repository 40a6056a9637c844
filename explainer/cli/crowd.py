"""The `crowd` command: N visitors' text requests at once through the batched decode, each compared bit for bit with
its lone run (`explainer/bench/crowd.py`), on a saved model or a shipped configuration with random weights."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..bench.crowd import CrowdConfig, crowd_request, deterministic_algorithms, run_crowd
from ..bench.fingerprints import lone_runs
from ..bench.synthetic import bench_model, machine
from ..errors import InputError
from ..models.loading import bundle_from_objects
from ..runtime.malloc import keep_freed_memory


def _sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        sizes = ()
    if not sizes or min(sizes) < 1:
        raise InputError(f"--visitors must be comma-separated positive integers, got {text!r}.")
    return sizes


def cmd_crowd(args: argparse.Namespace) -> int:
    if not (args.model or args.folder):
        raise InputError("Give --model (a shipped configuration, random weights) or --folder (a saved model).")
    if args.rounds < 1:
        raise InputError(f"--rounds must be 1 or more, got {args.rounds}.")
    if not Path(args.json).resolve().parent.is_dir():
        raise InputError(f"Cannot write {args.json!r}: its folder does not exist.")
    cfg = CrowdConfig(_sizes(args.visitors), args.rounds, args.prompt_tokens, args.new_tokens, args.distinct)
    keep_freed_memory()  # as the app runs
    with deterministic_algorithms(args.deterministic) as alerts:
        model, tok, name, device = bench_model(args.model, args.folder, args.dtype, args.device, args.tiny)
        bundle = bundle_from_objects(model, tok, name=name)
        if args.fingerprints:
            return _fingerprints(args, bundle, cfg, device)
        report = run_crowd(bundle, cfg)
    report = {**report, "dtype": args.dtype, "machine": machine(device), "command": args.command_line}
    if args.deterministic:  # what torch named as having no deterministic implementation
        report["nondeterministic_operations"] = sorted(alerts)
    Path(args.json).write_text(json.dumps(report, indent=2), encoding="utf-8")
    for m in report["medians"]:
        ratio = "" if m["vs_one_alone_median"] is None else f", {m['vs_one_alone_median']:.2f}x one"
        print(f"{m['visitors']:>3} visitors: {m['all_served_median_s']:.2f} s{ratio}")
    bad = sum(r["mismatched_visitors"] + len(r["errors"]) for r in report["rounds"])
    print(f"mismatched or failed visitors: {bad}")
    return 0 if bad == 0 else 1


def _fingerprints(args: argparse.Namespace, bundle, cfg: CrowdConfig, device) -> int:
    """`--fingerprints`: one visitor's request alone, `max(2, rounds)` times; where each run parts from the first."""
    request = crowd_request(bundle, cfg.prompt_tokens, cfg.new_tokens, 1 if cfg.distinct else None)
    found = lone_runs(bundle, request, max(2, cfg.rounds))
    report = {"model": bundle.name, "prompt_tokens": cfg.prompt_tokens, "new_tokens": cfg.new_tokens, **found,
              "dtype": args.dtype, "machine": machine(device), "command": args.command_line}  # fmt: skip
    Path(args.json).write_text(json.dumps(report, indent=2), encoding="utf-8")
    for i, p in enumerate(found["partings"], start=2):
        where = "bit for bit the first" if p is None else f"parts from the first at step {p['step']}, {p['module']!r}"
        print(f"run {i}: {where}")
    return 0 if all(p is None for p in found["partings"]) else 1


def add_crowd_parser(sub) -> None:
    """Register `python -m explainer crowd` on the CLI's subparsers."""
    p = sub.add_parser(
        "crowd",
        help="N visitors at once through the batched decode (MACS + Rollout, a given answer), timed in alternating "
        "rounds and each compared bit for bit with its lone run; exit 1 on any mismatch or error",
    )
    which = p.add_mutually_exclusive_group()
    which.add_argument("--model", help="a shipped configuration's Hub id (explainer/data/configs), random weights")
    which.add_argument("--folder", help="a saved model's folder, or `embedded`")
    p.add_argument("--tiny", action="store_true", help="with --model: shrink its dimensions (CPU dry runs)")
    p.add_argument("--device", help="default: cuda when there is one")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--visitors", default="1,8", help="crowd sizes, comma-separated")
    p.add_argument("--rounds", type=int, default=3, help="rounds of each size, alternating")
    p.add_argument("--prompt-tokens", type=int, default=150)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--distinct", action="store_true", help="each visitor its own prompt: no two share a prefill")
    p.add_argument(
        "--deterministic",
        action="store_true",
        help="torch's deterministic algorithms, warn-only: the report lists the operations torch names as having "
        "none (set CUBLAS_WORKSPACE_CONFIG=:4096:8 too on CUDA)",
    )
    p.add_argument(
        "--fingerprints",
        action="store_true",
        help="no crowd: one visitor alone, --rounds times (2 at least), with a bitwise fingerprint of every module's "
        "output; the report names the first module and step where a run parts from the first (run the step "
        "eagerly: EXPLAINER_DECODE=batched:fixed-shape)",
    )
    p.add_argument("--json", required=True, help="write the report here")
    p.set_defaults(func=cmd_crowd)
