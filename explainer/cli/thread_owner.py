"""The `thread-owner` command: `explain` after the caller's own torch work against a fresh process, in alternating
processes (`explainer/bench/thread_owner.py`), optionally of another checkout's library."""

from __future__ import annotations

import argparse
import json
from datetime import datetime
from pathlib import Path

from ..bench.runner import machine_info
from ..bench.thread_owner import ThreadOwnerConfig, compare
from ..errors import InputError


def thread_owner_config(args: argparse.Namespace) -> ThreadOwnerConfig:
    """The comparison the options ask for, checked before any process starts."""
    if args.json and not Path(args.json).resolve().parent.is_dir():
        raise InputError(f"Cannot write {args.json!r}: its folder does not exist.")
    return ThreadOwnerConfig(
        args.model, args.prompt_tokens, args.new_tokens, args.repeats, args.rounds, args.dtype, args.library
    )


def cmd_thread_owner(args: argparse.Namespace) -> int:
    config = thread_owner_config(args)
    date = datetime.now().astimezone().isoformat(timespec="seconds")
    summary = compare(config, log=lambda line: print(line, flush=True))
    summary = {
        **summary, "date": date, "machine": machine_info(summary["device"], summary["torch_threads"]),
        "command": args.command_line,
    }  # fmt: skip
    fresh, after, ratio = summary["fresh_s"], summary["after_generate_s"], summary["ratio"]
    print(f"median fresh {fresh:.2f} s, after a generate {after:.2f} s: ratio {ratio:.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1), encoding="utf-8")
        print(f"wrote {args.json}")
    return 0


def add_thread_owner_parser(sub) -> None:
    """Register `python -m explainer thread-owner` on the CLI's subparsers."""
    defaults = ThreadOwnerConfig
    p = sub.add_parser(
        "thread-owner",
        help="explain with MACS in a fresh process against after one model.generate on the caller's thread, in "
        "alternating processes: the medians and their ratio (issue #54: one owner of torch's threads)",
    )
    p.add_argument("--model", default=None, help="hub id or local folder (default: the embedded model)")
    p.add_argument("--prompt-tokens", type=int, default=defaults.prompt_tokens, help="prompt length (bench text)")
    p.add_argument("--new-tokens", type=int, default=defaults.new_tokens)
    p.add_argument("--repeats", type=int, default=defaults.repeats, help="timed calls per process")
    p.add_argument("--rounds", type=int, default=defaults.rounds, help="processes of each kind, alternating")
    p.add_argument("--dtype", default=defaults.dtype)
    p.add_argument(
        "--library", default=None,
        help="a checkout (e.g. a worktree of an older commit) whose explainer the processes measure (default: this)",
    )  # fmt: skip
    p.add_argument("--json", help="write the seconds, the medians and their ratio here")
    p.set_defaults(func=cmd_thread_owner)
