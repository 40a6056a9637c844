"""Benchmark rows and their tables: ratios to plain generation, plain and Markdown tables, the MACS paper's Table 3
(efficiency rows), and merging saved `--json` reports."""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from ..errors import InputError

BASELINE = "none"
PLAIN = "plain"  # generation through the library's own decode loop without methods (`decoding.generate_steps`)


@dataclass
class BenchRow:
    """One (method, prompt length) measurement.

    Attributes:
        tokens_per_s: median over the timed runs of K / seconds.
        peak_mem_mb: peak resident memory (CPU) or peak allocated CUDA memory during the timed runs, in MiB. It
            includes the model weights, which every process holds alike. On CPU it carries allocator noise of a
            few percent (glibc keeps freed blocks resident by chance); `peak_mem_mb_all` shows the spread.
        peak_mem_mb_all: the peak of each timed run (the high-water mark is reset before every run).
        seconds_all: wall time of every timed run.
        mem_method: how peak memory was measured (see `MemoryProbe`).
        base_mem_mb: memory in use when the high-water mark was first reset (after loading and warm-up).
        cpu_seconds_all: CPU time (all threads) of this process in every timed run.
        live_peak_mem_mb: with `--live-mem` on CPU, peak resident memory of one extra untimed run in which glibc
            returns every freed block of 64 KiB or more at once, so residency follows live tensors more closely than
            in `peak_mem_mb` (less allocator noise, not none). Slows that run, so it is not timed.
        other_cpu_frac_all: per timed run, the share of the machine's CPU capacity that *other* processes used
            (0 = quiet machine); runs above ~0.1 are slowed by contention. None where /proc/stat is unreadable.
        tokens_per_s_ratio, peak_mem_ratio, live_peak_mem_ratio: relative to `none` at the same prompt and
            new-token lengths.
        decode_path: the loop that generated: "generate" (`model.generate`, the `none` baseline) or what
            `decoding.choose_path` chose ("solo", "static", "cuda-graph"; "dynamic" for the solo loop in reports saved
            before it); None in reports saved before that.
        positions: forward positions of the last timed run, where counted: `forward_positions` (computed; plain
            generation's N + K - 1) and, for Sources, what leave-one-sentence-out without a cache and ContextCite's
            64 ablations would compute (`leave_one_sentence_out_positions`, `contextcite_positions`). None elsewhere.
        phase_seconds: the phases a method timed in the last timed run (its meta's `*_seconds`: Sources' removal
            passes and fit, `passes_seconds` and `fit_seconds`), where it times any. None elsewhere.
    """

    method: str
    prompt_tokens: int
    new_tokens: int
    tokens_per_s: float
    peak_mem_mb: float
    repeats: int
    seconds_all: list[float] = field(default_factory=list)
    peak_mem_mb_all: list[float] = field(default_factory=list)
    mem_method: str = ""
    base_mem_mb: float | None = None
    cpu_seconds_all: list[float] = field(default_factory=list)
    other_cpu_frac_all: list[float | None] = field(default_factory=list)
    live_peak_mem_mb: float | None = None
    tokens_per_s_ratio: float | None = None
    peak_mem_ratio: float | None = None
    live_peak_mem_ratio: float | None = None
    positions: dict[str, int] | None = None
    decode_path: str | None = None
    phase_seconds: dict[str, float] | None = None


def with_ratios(rows: list[BenchRow]) -> list[BenchRow]:
    """Copies of `rows` with tokens/s and peak-memory ratios to the `none` row of the same lengths (None without)."""
    base = {(r.prompt_tokens, r.new_tokens): r for r in rows if r.method == BASELINE}
    out = []
    for r in rows:
        b = base.get((r.prompt_tokens, r.new_tokens))
        speed = r.tokens_per_s / b.tokens_per_s if b and b.tokens_per_s > 0 else None
        mem = r.peak_mem_mb / b.peak_mem_mb if b and b.peak_mem_mb > 0 else None
        live = None
        if b and r.live_peak_mem_mb is not None and b.live_peak_mem_mb:
            live = r.live_peak_mem_mb / b.live_peak_mem_mb
        out.append(replace(r, tokens_per_s_ratio=speed, peak_mem_ratio=mem, live_peak_mem_ratio=live))
    return out


def _fmt(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


_COLUMNS = (
    # (plain header, Markdown header, cell)
    ("method", "method", lambda r: r.method),
    ("prompt_tokens", "prompt tokens", lambda r: str(r.prompt_tokens)),
    ("new_tokens", "new tokens", lambda r: str(r.new_tokens)),
    ("tokens_per_s", "tokens/s", lambda r: _fmt(r.tokens_per_s, 2)),
    ("ratio", "tokens/s vs none", lambda r: _fmt(r.tokens_per_s_ratio, 3)),
    ("peak_mem_mb", "peak MiB", lambda r: _fmt(r.peak_mem_mb, 1)),
    ("mem_ratio", "peak mem vs none", lambda r: _fmt(r.peak_mem_ratio, 3)),
)


_LIVE_COLUMNS = (
    ("live_mem_mb", "live peak MiB", lambda r: _fmt(r.live_peak_mem_mb, 1)),
    ("live_ratio", "live peak vs none", lambda r: _fmt(r.live_peak_mem_ratio, 3)),
)


def _count(row: BenchRow, key: str) -> str:
    value = (row.positions or {}).get(key)
    return "-" if value is None else f"{value:,}"


_POSITION_COLUMNS = (
    ("forward_positions", "forward positions", lambda r: _count(r, "forward_positions")),
    ("loo_sentence_positions", "leave-one-sentence-out", lambda r: _count(r, "leave_one_sentence_out_positions")),
    ("contextcite_positions", "ContextCite (64)", lambda r: _count(r, "contextcite_positions")),
)


_PATH_COLUMNS = (("decode_path", "decode loop", lambda r: r.decode_path or "-"),)


def _columns(rows: list[BenchRow]) -> tuple:
    live = _LIVE_COLUMNS if any(r.live_peak_mem_mb is not None for r in rows) else ()
    counted = any(r.method != BASELINE and r.positions for r in rows)  # plain generation's alone says nothing
    paths = _PATH_COLUMNS if any(r.decode_path for r in rows) else ()  # none in reports saved before it
    return _COLUMNS + live + (_POSITION_COLUMNS if counted else ()) + paths


def format_table(rows: list[BenchRow]) -> str:
    """Aligned plain-text table; the method column is left-aligned, numbers right-aligned."""
    columns = _columns(rows)
    cells = [[c[0] for c in columns]] + [[c[2](r) for c in columns] for r in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    lines = []
    for line in cells:
        parts = [line[0].ljust(widths[0])] + [v.rjust(w) for v, w in zip(line[1:], widths[1:])]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def format_markdown(rows: list[BenchRow], caption: str = "") -> str:
    """GitHub Markdown table, numbers right-aligned, with an optional italic caption line below."""
    columns = _columns(rows)
    lines = [
        "| " + " | ".join(c[1] for c in columns) + " |",
        "|" + "|".join([" --- "] + [" ---: "] * (len(columns) - 1)) + "|",
    ]
    lines += ["| " + " | ".join(c[2](r) for c in columns) + " |" for r in rows]
    if caption:
        lines += ["", f"_{caption}_"]
    return "\n".join(lines)


@dataclass
class EfficiencyRow:
    """One line of the MACS paper's Table 3: a method's mean peak memory and throughput over the prompt lengths it
    was measured at, and plain generation's means over those same lengths (the paper averages AtMan and Rollout over
    the samples they completed, so each method is compared on its own subset)."""

    method: str
    lengths: list[int]
    mean_peak_mem_mb: float
    mean_tokens_per_s: float
    base_peak_mem_mb: float | None
    base_tokens_per_s: float | None

    @property
    def mem_change(self) -> float | None:
        """Relative change of mean peak memory vs plain generation (+0.11 = 11% more)."""
        return None if not self.base_peak_mem_mb else self.mean_peak_mem_mb / self.base_peak_mem_mb - 1

    @property
    def speed_change(self) -> float | None:
        """Relative change of mean throughput vs plain generation (-0.23 = 23% fewer tokens/s)."""
        return None if not self.base_tokens_per_s else self.mean_tokens_per_s / self.base_tokens_per_s - 1


def efficiency_rows(rows: list[BenchRow]) -> list[EfficiencyRow]:
    """Table 3 rows, plain generation first, from rows of one model and number of new tokens."""
    by_method: dict[str, dict[int, BenchRow]] = {}
    for r in rows:
        by_method.setdefault(r.method, {})[r.prompt_tokens] = r
    base = by_method.get(BASELINE, {})
    out = []
    for method in sorted(by_method, key=lambda m: (m != BASELINE, list(by_method).index(m))):
        own = by_method[method]
        shared = [n for n in sorted(own) if n in base]  # compare only where plain generation was measured too
        use = shared or sorted(own)
        out.append(
            EfficiencyRow(
                method=method,
                lengths=use,
                mean_peak_mem_mb=statistics.fmean(own[n].peak_mem_mb for n in use),
                mean_tokens_per_s=statistics.fmean(own[n].tokens_per_s for n in use),
                base_peak_mem_mb=statistics.fmean(base[n].peak_mem_mb for n in shared) if shared else None,
                base_tokens_per_s=statistics.fmean(base[n].tokens_per_s for n in shared) if shared else None,
            )
        )
    return out


def _pct(change: float | None) -> str:
    return "" if change is None else f" ({100 * change:+.0f}%)"


def format_efficiency(rows: list[BenchRow], markdown: bool = False) -> str:
    """The MACS paper's Table 3 layout: mean peak memory and mean throughput per method, % vs plain generation."""
    table = efficiency_rows(rows)
    head = ("Method", "Mean peak memory (MiB) ↓", "Mean throughput (tokens/s) ↑", "prompt tokens")
    cells = [
        (
            "Pure inference" if e.method == BASELINE else e.method,
            f"{e.mean_peak_mem_mb:.0f}" + ("" if e.method == BASELINE else _pct(e.mem_change)),
            f"{e.mean_tokens_per_s:.2f}" + ("" if e.method == BASELINE else _pct(e.speed_change)),
            ",".join(map(str, e.lengths)),
        )
        for e in table
    ]
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "| --- | ---: | ---: | --- |"]
        return "\n".join(lines + ["| " + " | ".join(c) + " |" for c in cells])
    widths = [max(len(line[i]) for line in [head, *cells]) for i in range(len(head))]
    out = []
    for line in [head, *cells]:
        out.append("  ".join([line[0].ljust(widths[0]), *(v.rjust(w) for v, w in zip(line[1:3], widths[1:3])),
                              line[3]]).rstrip())  # fmt: skip
    return "\n".join(out)


def markdown_caption(report: dict[str, Any]) -> str:
    m = report["machine"]
    repeats = sorted({r["repeats"] for r in report["rows"]})
    precision = f" in {report['dtype']}" if report.get("dtype") else ""  # reports before --dtype have none
    return (
        f"{report['model']}{precision} on {m['device']} ({m['cpu_model']}, {m['cpu_count']} cores, "
        f"{m['torch_threads']} torch threads), torch {m['torch']}, transformers {m['transformers']}; median of "
        f"{'/'.join(map(str, repeats))} runs; prompt text: {report['text_source']}; {report['date']}."
    )


def load_reports(paths: list[str]) -> dict[str, Any]:
    """Merge saved `--json` reports into one (a later file's row replaces an earlier one of the same method, prompt
    length and new tokens); ratios are recomputed over the merged rows.

    Raises:
        InputError: unreadable files, or reports of different models, precisions or numbers of new tokens.
    """
    merged: dict[tuple, BenchRow] = {}
    reports = []
    for path in paths:
        try:
            report = json.loads(Path(path).read_text(encoding="utf-8"))
            rows = [BenchRow(**{f.name: r[f.name] for f in fields(BenchRow) if f.name in r}) for r in report["rows"]]
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as e:
            raise InputError(f"Cannot read benchmark report {path!r}: {e.__class__.__name__}: {e}") from e
        reports.append(report)
        for r in rows:
            merged[(r.method, r.prompt_tokens, r.new_tokens)] = r
    for key in ("model", "new_tokens", "dtype"):
        values = {str(r.get(key)) for r in reports if key != "dtype" or key in r}  # reports before --dtype have none
        if len(values) > 1:
            raise InputError(f"Reports differ in {key} ({', '.join(sorted(values))}); combine only comparable runs.")
    last = reports[-1]
    names = list(dict.fromkeys(r.method for r in merged.values()))
    rank = {m: (m != BASELINE, i) for i, m in enumerate(names)}
    rows = sorted(merged.values(), key=lambda r: (r.prompt_tokens, rank[r.method]))  # as one run prints them
    return {**last, "rows": [asdict(r) for r in with_ratios(rows)],
            "date": ", ".join(dict.fromkeys(r["date"] for r in reports))}  # fmt: skip
