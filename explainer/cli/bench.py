"""The `bench` command: its options, then measure (or merge saved reports), print the tables, write JSON and plots."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from .. import bench
from ..bench import (
    DEFAULT_TEXT_NAME,
    BenchConfig,
    BenchRow,
    format_efficiency,
    format_markdown,
    format_table,
    load_reports,
    markdown_caption,
    run_bench,
)
from ..decoding.choice import OVERRIDES
from ..errors import InputError
from ..eval.datasets import SQUAD_V2_DEV, resolve_data
from .options import add_device_map_option, dtype_option, methods_help, placement


def _split(text: str) -> list[str]:
    return [v.strip() for v in text.split(",") if v.strip()]


_DECODE_HELP = (
    "the library's decode loop in every worker (rows say which ran): auto (CUDA graphs on a GPU where they apply), "
    "solo (the per-token loop), static (the static-cache step, eagerly), cuda-graph (that step as a CUDA graph); "
    "$EXPLAINER_DECODE in each worker"
)


def _parse_lengths(text: str) -> list[int]:
    try:
        return [int(v) for v in _split(text)]
    except ValueError as e:
        raise InputError(f"--prompt-tokens must be comma-separated integers, got {text!r}.") from e


def write_plot(rows: list[dict[str, Any]], path: str, title: str = "") -> None:
    """Throughput and peak memory vs prompt length as interactive HTML (`.html`) or a static image (`.png`)."""
    from visuals.efficiency import efficiency_figure, efficiency_png  # the views load only when a plot is asked for

    suffix = Path(path).suffix.lower()
    try:
        if suffix == ".html":
            efficiency_figure(rows, title).write_html(path, include_plotlyjs=True)
        elif suffix == ".png":
            efficiency_png(rows, title).save(path)
        else:
            raise InputError(f"--plot must end in .html or .png, got {path!r}.")
    except OSError as e:
        raise InputError(f"Cannot write {path!r}: {e}") from e


def cmd_bench(args: argparse.Namespace) -> int:
    for path in (args.json, args.plot):
        if path and not Path(path).resolve().parent.is_dir():
            raise InputError(f"Cannot write {path!r}: its folder does not exist.")
    if args.plot and Path(args.plot).suffix.lower() not in (".html", ".png"):
        raise InputError(f"--plot must end in .html or .png, got {args.plot!r}.")
    if args.report:
        report = load_reports([p.strip() for p in args.report.split(",") if p.strip()])
    else:
        report = _measure_from_args(args)
    rows = [BenchRow(**r) for r in report["rows"]]
    m = report["machine"]
    print(
        f"model: {report['model']}   dtype: {report.get('dtype', '?')}   device: {m['device']}   "
        f"torch threads: {m['torch_threads']}   text: {report['text_source']}   date: {report['date']}"
    )
    print(format_table(rows))
    print()
    print("Table 3 layout (MACS paper): means over the prompt lengths listed, change vs plain generation")
    print(format_efficiency(rows))
    if args.markdown:
        print()
        print(format_markdown(rows, markdown_caption(report)))
        print()
        print(format_efficiency(rows, markdown=True))
    if args.json:
        try:
            Path(args.json).write_text(json.dumps(report, indent=2), encoding="utf-8")
        except OSError as e:
            raise InputError(f"Cannot write {args.json!r}: {e}") from e
        print(f"wrote {args.json}")
    if args.plot:
        write_plot(report["rows"], args.plot, f"{report['model']}, {report['new_tokens']} new tokens, {m['device']}")
        print(f"wrote {args.plot}")
    return 0


def bench_config(args: argparse.Namespace) -> BenchConfig:
    """The run the options ask for, checked before any worker starts (`BenchConfig`)."""
    data = resolve_data(args.data) if args.data else None  # squad_v2-dev: downloaded once, then the cached copy
    return BenchConfig(
        model=args.model, prompt_lengths=_parse_lengths(args.prompt_tokens), new_tokens=args.new_tokens,
        methods=_split(args.methods), repeats=args.repeats, **placement(args), dtype=args.dtype, data_path=data,
        prompt_file=args.prompt_file, quiet_wait=args.quiet_wait, threads=args.threads, live_mem=args.live_mem,
        decode=args.decode,
    )  # fmt: skip


def _measure_from_args(args: argparse.Namespace) -> dict[str, Any]:
    return run_bench(bench_config(args), log=lambda line: print(line, file=sys.stderr, flush=True))


def _text_options(p: argparse.ArgumentParser) -> None:
    """Where the prompt text comes from: a text file or a SQuAD file, not both (default: the shipped essays)."""
    text = p.add_mutually_exclusive_group()
    text.add_argument(
        "--prompt-file",
        default=None,
        help=f"plain text file whose tokens are repeated and cut to each prompt length (default: the essays in "
        f"{DEFAULT_TEXT_NAME})",
    )
    text.add_argument(
        "--data",
        default=None,
        help=f"SQuAD JSON file whose contexts are the prompt text, or {SQUAD_V2_DEV} (downloaded once into the cache)",
    )


def add_bench_parser(sub: Any) -> None:
    """Register `bench` on the CLI's subparsers."""
    p = sub.add_parser(
        "bench",
        help="tokens/s and peak memory of attribution methods against plain generate",
        description=bench.__doc__.splitlines()[0],
    )
    p.add_argument("--model", default=None, help="hub id or local folder (default: embedded SmolLM2-135M-Instruct)")
    defaults = BenchConfig  # the dataclass's defaults, one place for them
    lengths = ",".join(map(str, defaults.prompt_lengths))
    p.add_argument("--prompt-tokens", default=lengths, help="comma-separated prompt lengths in tokens")
    p.add_argument(
        "--new-tokens", type=int, default=defaults.new_tokens, help="tokens generated per run (EOS does not stop early)"
    )
    p.add_argument(
        "--methods",
        default=",".join(defaults.methods),
        help=methods_help(
            "comma-separated: none (plain generate), plain (the library's loop, no method) and registered method "
            "names, each optionally with options as name:key=value:key=value (e.g. macs:alpha=0.5)"
        ),
    )
    p.add_argument(
        "--repeats", type=int, default=defaults.repeats, help="timed runs per configuration; the median is reported"
    )
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda if available)")
    dtype_option(p)
    add_device_map_option(p)
    _text_options(p)
    p.add_argument("--decode", choices=OVERRIDES, help=_DECODE_HELP)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads in every worker (default: torch's)")
    p.add_argument(
        "--quiet-wait",
        type=float,
        default=0.0,
        help="before each timed run, wait up to this many seconds for other processes to leave the CPUs idle "
        "(useful on shared machines; 0 = do not wait)",
    )
    p.add_argument(
        "--live-mem",
        action="store_true",
        help="CPU: after the timed runs, one more untimed run with glibc's caching of blocks >= 64 KiB off, whose "
        "peak follows live tensors more closely (peak_mem_mb carries a few percent of allocator noise)",
    )
    p.add_argument("--json", help="write the rows and machine details as JSON to this path")
    p.add_argument("--markdown", action="store_true", help="also print Markdown tables for the README")
    p.add_argument("--plot", help="write throughput and peak memory vs prompt length to this .html or .png file")
    p.add_argument(
        "--report",
        help="comma-separated --json files of earlier runs: combine and print them (tables, --plot) without measuring",
    )
    p.set_defaults(func=cmd_bench)
