"""Throughput and peak-memory benchmark: attribution methods against plain `model.generate` with SDPA.

`python -m explainer bench` measures generated tokens per second and peak memory for every (method, prompt length)
pair. Each pair runs in a fresh Python process that loads the model, does one short untimed warm-up generation (for
post-hoc methods on a short prefix of the prompt, see `WARMUP_POSTHOC_PROMPT_TOKENS`), resets the memory high-water
mark and then times `repeats` generations of exactly K tokens (end-of-sequence never stops either side). Because
every process loads the same model the same way, peak memory is comparable across methods. Rows report the median
tokens/s and their ratio to the baseline `none` at the same prompt length.

How a method is timed follows from its registry entry alone, so new methods need no change here:

- `none`: `model.generate(input_ids, max_new_tokens=K, min_new_tokens=K, do_sample=False)`.
- streaming methods (e.g. `macs`): `generate_steps` with that method, the MACS path of the app.
- post-hoc methods (e.g. `random`): `generate_steps` without methods, then `method.explain(...)`; the time covers both.

On a shared machine other processes slow the timed runs badly (two torch threads on two busy cores can take 10x
longer): every run records the share of the CPUs others used (`other_cpu_frac_all`), flagged rows are warned about,
and `--quiet-wait` holds each timed run until the machine is idle.

Prompts are real text: SQuAD 2.0 contexts from `../shared/data/squad2-dev-350.json`, tokenised without chat template
and cut to exactly N tokens; without that file, seeded English-like filler text is used and the report says so.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import platform
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, fields, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from .. import errors
from ..errors import ExplainerError, InputError, UnknownMethodError
from ..session import hold

BASELINE = "none"
_REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_DATA = _REPO_ROOT.parent / "shared/data/squad2-dev-350.json"
SQUAD_SOURCE = "squad2-dev-350"
GENERATED_SOURCE = "generated"
BUSY_WARNING = 0.10  # share of the CPUs used by other processes above which timings are flagged
WARMUP_NEW_TOKENS = 2  # enough to run the prefill and one cached decode step
# Post-hoc methods (AtMan) cost about as much for 2 new tokens as for 32 (their cost grows with the prompt), so they
# warm up on a short prefix of the prompt: the one-time costs are the same, minutes of untimed work are not spent.
WARMUP_POSTHOC_PROMPT_TOKENS = 64
_MIB = 1024 * 1024

# Plain English-ish vocabulary for the fallback prompt: real words tokenise like real text, random ids do not.
_WORD_LIST = (
    "the of and to in is was for on that with as by at from his her their this which an be are were it not or "
    "have has had one all new more first year city river people time world state school music water history "
    "during after before between under through early later most many other several large small known called "
    "built founded became began remained used named part north south central western eastern government army "
    "church university company century war region island population language family team season album "
    "record film series book king queen law court power trade market energy system"
)
_WORDS = _WORD_LIST.split()


# Prompts ---------------------------------------------------------------------------------------------------------


def _squad_contexts(path: Path | None) -> list[str] | None:
    """Distinct contexts in file order, or None when the file is absent."""
    if path is None or not Path(path).is_file():
        return None
    try:
        rows = json.loads(Path(path).read_text(encoding="utf-8"))["rows"]
        contexts = list(dict.fromkeys(str(r["context"]) for r in rows if str(r.get("context", "")).strip()))
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as e:
        raise InputError(f"Cannot read benchmark text from {str(path)!r}: {e.__class__.__name__}: {e}") from e
    return contexts or None


def _generated_paragraphs(seed: int) -> Iterator[str]:
    """Endless deterministic paragraphs of eight sentences built from `_WORDS`."""
    rng = random.Random(seed)
    while True:
        sentences = []
        for _ in range(8):
            words = [rng.choice(_WORDS) for _ in range(rng.randint(6, 14))]
            sentences.append(" ".join(words).capitalize() + ".")
        yield " ".join(sentences)


def prompt_ids(
    tokenizer: Any, num_tokens: int, data_path: Path | None = DEFAULT_DATA, seed: int = 0
) -> tuple[list[int], str]:
    """Exactly `num_tokens` token ids of real text.

    Contexts of the SQuAD file are joined with blank lines (cycling when the file is too short) and the tokens of
    the joined text, without chat template or special tokens, are cut to `num_tokens`.

    Args:
        tokenizer: a transformers tokenizer.
        num_tokens: N >= 1.
        data_path: SQuAD-style JSON (`{"rows": [{"context": ...}]}`); when absent, seeded filler text is used.
        seed: seed of the filler text.

    Returns:
        (ids, text_source): a list of N ints and "squad2-dev-350" or "generated".
    """
    if num_tokens < 1:
        raise InputError(f"Prompt length must be at least 1 token, got {num_tokens}.")
    contexts = _squad_contexts(data_path)
    if contexts is not None:
        paragraphs, source = itertools.cycle(contexts), SQUAD_SOURCE
    else:
        paragraphs, source = _generated_paragraphs(seed), GENERATED_SOURCE
    text = ""
    ids: list[int] = []
    # Re-tokenising the whole text keeps the cut exact: tokens at paragraph joins depend on both sides.
    while len(ids) < num_tokens:
        text = f"{text}\n\n{next(paragraphs)}" if text else next(paragraphs)
        ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    return ids[:num_tokens], source


# Rows, ratios and tables ---------------------------------------------------------------------------------------


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
        mem_method: how peak memory was measured (see `_MemoryProbe`).
        base_mem_mb: memory in use when the high-water mark was first reset (after loading and warm-up).
        cpu_seconds_all: CPU time (all threads) of this process in every timed run.
        live_peak_mem_mb: with `--live-mem` on CPU, peak resident memory of one extra untimed run in which glibc
            returns every freed block of 64 KiB or more at once, so residency follows live tensors more closely than
            in `peak_mem_mb` (less allocator noise, not none). Slows that run, so it is not timed.
        other_cpu_frac_all: per timed run, the share of the machine's CPU capacity that *other* processes used
            (0 = quiet machine); runs above ~0.1 are slowed by contention. None where /proc/stat is unreadable.
        tokens_per_s_ratio, peak_mem_ratio, live_peak_mem_ratio: relative to `none` at the same prompt and
            new-token lengths.
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


def _columns(rows: list[BenchRow]) -> tuple:
    return _COLUMNS + (_LIVE_COLUMNS if any(r.live_peak_mem_mb is not None for r in rows) else ())


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
    return (
        f"{report['model']} on {m['device']} ({m['cpu_model']}, {m['cpu_count']} cores, {m['torch_threads']} torch "
        f"threads), torch {m['torch']}, transformers {m['transformers']}; median of {'/'.join(map(str, repeats))} "
        f"runs; prompt text: {report['text_source']}; {report['date']}."
    )


# Timing inside a worker process --------------------------------------------------------------------------------


def make_runner(model: Any, method_name: str) -> Callable[[Any, int], int]:
    """A callable `run(input_ids (1, N), K) -> tokens generated` for the baseline or a registered method.

    The kind of run depends only on the method's `streaming` flag, so newly registered methods are benchmarked as
    they are. Every run holds the model (`session.hold`), like any request.
    """
    runner = _make_runner(model, method_name)

    def held(input_ids, k: int) -> int:
        with hold(model):
            return runner(input_ids, k)

    return held


def _make_runner(model: Any, method_name: str) -> Callable[[Any, int], int]:
    import torch

    from ..explain import generate_steps
    from ..methods import GenerationRun

    if method_name == BASELINE:

        def run_plain(input_ids: torch.Tensor, k: int) -> int:
            with torch.inference_mode():
                out = model.generate(input_ids, max_new_tokens=k, min_new_tokens=k, do_sample=False)  # (1, N + K)
            return out.shape[1] - input_ids.shape[1]

        return run_plain

    method = method_from_spec(method_name)
    if method.streaming:

        def run_streaming(input_ids: torch.Tensor, k: int) -> int:
            # Keep the score rows as the app does, so their cost is counted.
            rows = [s.scores[method.name] for s in generate_steps(model, input_ids, [method], k, eos_token_ids=())]
            return len(rows)

        return run_streaming

    def run_posthoc(input_ids: torch.Tensor, k: int) -> int:
        tokens = [s.token_id for s in generate_steps(model, input_ids, [], k, eos_token_ids=())]
        generated = torch.tensor([tokens], dtype=input_ids.dtype, device=input_ids.device)  # (1, K)
        full = torch.cat([input_ids, generated], dim=1)  # (1, N + K)
        method.explain(GenerationRun(model=model, input_ids=full, num_prompt_tokens=input_ids.shape[1]))
        return len(tokens)

    return run_posthoc


class _ContentionProbe:
    """CPU time the rest of the machine spends while we time: system busy time from /proc/stat minus our own."""

    def __init__(self) -> None:
        self.tick = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01
        self.cpus = os.cpu_count() or 1
        self.fraction: float | None = None  # of the last `with` block

    def _busy_seconds(self) -> float | None:
        try:
            values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        except (OSError, ValueError, IndexError):
            return None
        idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
        guest = sum(values[8:10])  # already counted in user and nice
        return (sum(values) - idle - guest) * self.tick

    def wait_quiet(self, max_seconds: float, window: float = 1.0) -> None:
        """Sleep in `window`-second samples until other processes use at most `BUSY_WARNING` of the CPUs."""
        deadline = time.perf_counter() + max_seconds
        while time.perf_counter() < deadline:
            with self:
                time.sleep(window)
            if self.fraction is None or self.fraction <= BUSY_WARNING:
                return

    def __enter__(self) -> _ContentionProbe:
        self._busy0, self._own0, self._t0 = self._busy_seconds(), time.process_time(), time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        busy1, own1, t1 = self._busy_seconds(), time.process_time(), time.perf_counter()
        if self._busy0 is None or busy1 is None or t1 <= self._t0:
            self.fraction = None
            return
        other = max(0.0, (busy1 - self._busy0) - (own1 - self._own0))
        self.fraction = min(1.0, other / ((t1 - self._t0) * self.cpus))


def _proc_status_kib(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise OSError(f"{key} missing from /proc/self/status")


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc mallopt parameters
_LIVE_MMAP_THRESHOLD = 64 * 1024  # blocks this size or larger are mmap-ed and unmapped on free


def _live_peak_mb(run: Callable[[Any, int], int], input_ids: Any, k: int) -> float | None:
    """Peak RSS (MiB) of one run with glibc caching switched off for blocks >= 64 KiB; None off glibc/Linux.

    Changes the allocator of this process for good, so it must be the last thing a worker measures.
    """
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(_M_MMAP_THRESHOLD, _LIVE_MMAP_THRESHOLD)
        libc.mallopt(_M_TRIM_THRESHOLD, 2 * _LIVE_MMAP_THRESHOLD)
        gc.collect()
        libc.malloc_trim(0)
        Path("/proc/self/clear_refs").write_text("5")
    except (OSError, AttributeError):
        return None
    run(input_ids, k)
    return _proc_status_kib("VmHWM") / 1024


def _malloc_trim() -> bool:
    """Return freed heap memory to the kernel (glibc only); True when it ran."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
        return True
    except (OSError, AttributeError):
        return False


class _MemoryProbe:
    """Peak memory of the code run between `reset()` and `peak_mb()`.

    CUDA: peak allocated memory (`vmhwm` is meaningless there). CPU: the kernel's resident-set high-water mark,
    reset by writing "5" to /proc/self/clear_refs; where that is not allowed, `ru_maxrss`, which cannot be reset and
    so also covers model loading (the row's `mem_method` says so). Before the reset glibc's free heap is handed back
    (`malloc_trim`): otherwise whatever the warm-up left cached counts as resident, and that varies by tens of MiB
    between otherwise identical processes.
    """

    def __init__(self, device: Any) -> None:
        self.device = device
        self.method = ""

    def reset(self, trim: bool = True) -> float:
        """Reset the high-water mark and return the memory in use now, in MiB; `trim` first frees glibc's heap."""
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.method = "cuda_max_memory_allocated"
            return torch.cuda.memory_allocated(self.device) / _MIB
        trimmed = _malloc_trim() if trim else "malloc_trim" in self.method
        try:
            Path("/proc/self/clear_refs").write_text("5")
            self.method = "vmhwm_after_clear_refs" + ("+malloc_trim" if trimmed else "")
            return _proc_status_kib("VmRSS") / 1024
        except OSError:
            self.method = "ru_maxrss_since_start (clear_refs not writable: includes model loading)"
            return self._ru_maxrss_mb()

    def peak_mb(self) -> float:
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            return torch.cuda.max_memory_allocated(self.device) / _MIB
        if self.method.startswith("vmhwm"):
            return _proc_status_kib("VmHWM") / 1024
        return self._ru_maxrss_mb()

    @staticmethod
    def _ru_maxrss_mb() -> float:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak / _MIB if sys.platform == "darwin" else peak / 1024  # bytes on macOS, KiB on Linux


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    """Load the model, warm up, time `repeats` runs of one configuration; runs inside a fresh worker process.

    Args:
        spec: model, device, method, prompt_tokens, new_tokens, repeats, data (path or None), threads (None keeps
            torch's default), quiet_wait (seconds to wait, before each timed run, for other processes to leave the
            CPUs alone), live_mem (also measure `BenchRow.live_peak_mem_mb`).

    Returns:
        A `BenchRow` as a dict plus `model`, `device`, `torch_threads` and `text_source`.
    """
    import torch

    from ..models import load_model

    n, k = int(spec["prompt_tokens"]), int(spec["new_tokens"])
    if spec.get("threads"):
        torch.set_num_threads(int(spec["threads"]))
    bundle = load_model(spec["model"], device=spec["device"], max_prompt_tokens=n)
    context = bundle.context_length
    if context is not None and n + k > context:
        raise InputError(
            f"{n} prompt tokens + {k} new tokens exceed the context of {bundle.name} ({context} tokens). "
            "Ask for shorter prompts or fewer new tokens."
        )
    ids, source = prompt_ids(bundle.tokenizer, n, Path(spec["data"]) if spec.get("data") else None)
    input_ids = torch.tensor([ids], dtype=torch.long, device=bundle.device)  # (1, N)
    run = make_runner(bundle.model, spec["method"])
    posthoc = spec["method"] != BASELINE and not method_from_spec(spec["method"]).streaming
    run(input_ids[:, :WARMUP_POSTHOC_PROMPT_TOKENS] if posthoc else input_ids, min(WARMUP_NEW_TOKENS, k))
    gc.collect()

    probe = _MemoryProbe(bundle.device)
    seconds, cpu_seconds, other_cpu, peaks, bases = [], [], [], [], []
    contention = _ContentionProbe()
    for i in range(int(spec["repeats"])):
        if bundle.device.type == "cuda":
            torch.cuda.synchronize(bundle.device)
        contention.wait_quiet(float(spec.get("quiet_wait", 0.0)))
        # Trimming only once: a trim before every run would make each run fault its pages in again, inside the timing.
        bases.append(probe.reset(trim=i == 0))
        with contention:
            t0, c0 = time.perf_counter(), time.process_time()
            produced = run(input_ids, k)
            if bundle.device.type == "cuda":
                torch.cuda.synchronize(bundle.device)
            seconds.append(time.perf_counter() - t0)
            cpu_seconds.append(time.process_time() - c0)
        other_cpu.append(contention.fraction)
        peaks.append(probe.peak_mb())
        if produced != k:
            raise RuntimeError(f"{spec['method']} generated {produced} tokens instead of {k}")
    live_mb = _live_peak_mb(run, input_ids, k) if spec.get("live_mem") and bundle.device.type == "cpu" else None
    row = BenchRow(
        method=spec["method"],
        prompt_tokens=n,
        new_tokens=k,
        tokens_per_s=statistics.median(k / s for s in seconds),
        peak_mem_mb=max(peaks),
        repeats=len(seconds),
        seconds_all=seconds,
        peak_mem_mb_all=peaks,
        mem_method=probe.method,
        base_mem_mb=bases[0],
        cpu_seconds_all=cpu_seconds,
        other_cpu_frac_all=other_cpu,
        live_peak_mem_mb=live_mb,
    )
    return {
        "row": asdict(row),
        "model": bundle.name,
        "device": str(bundle.device),
        "torch_threads": torch.get_num_threads(),
        "text_source": source,
    }


def worker_main(argv: list[str]) -> int:
    """Entry point of a worker process: `argv` = [spec JSON, output path]. Writes the result or the error there."""
    spec, out_path = json.loads(argv[0]), Path(argv[1])
    try:
        result = measure(spec)
    except ExplainerError as e:
        out_path.write_text(json.dumps({"error": str(e), "error_type": type(e).__name__}), encoding="utf-8")
        return 2
    out_path.write_text(json.dumps(result), encoding="utf-8")
    return 0


_WORKER_CODE = "import sys; from explainer.bench import worker_main; sys.exit(worker_main(sys.argv[1:]))"


def _spawn(spec: dict[str, Any]) -> dict[str, Any]:
    """Run `measure(spec)` in a fresh interpreter; re-raise its user-facing errors here."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    with tempfile.TemporaryDirectory(prefix="explainer-bench-") as tmp:
        out_path = Path(tmp) / "result.json"
        proc = subprocess.run(
            [sys.executable, "-c", _WORKER_CODE, json.dumps(spec), str(out_path)],
            env=env,
            capture_output=True,
            check=False,  # the exit status and the result file are read below
            text=True,
        )
        result = json.loads(out_path.read_text(encoding="utf-8")) if out_path.is_file() else None
    if result is not None and "error" in result:
        error_type = getattr(errors, result.get("error_type", ""), ExplainerError)
        if not (isinstance(error_type, type) and issubclass(error_type, ExplainerError)):
            error_type = ExplainerError
        raise error_type(result["error"])
    if proc.returncode != 0 or result is None:
        tail = [line for line in (proc.stderr or "").strip().splitlines() if line.strip()][-1:] or ["no output"]
        raise ExplainerError(
            f"benchmark worker for {spec['method']} at {spec['prompt_tokens']} tokens failed "
            f"(exit {proc.returncode}): {tail[0]}"
        )
    return result


# Orchestration -------------------------------------------------------------------------------------------------


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info(device: str, torch_threads: int | None) -> dict[str, Any]:
    import torch
    import transformers

    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": affinity,
        "torch_threads": torch_threads,
        "device": device,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def run_bench(
    model: str | None,
    prompt_lengths: list[int],
    new_tokens: int,
    methods: list[str],
    repeats: int,
    device: str | None = None,
    data_path: Path | None = DEFAULT_DATA,
    quiet_wait: float = 0.0,
    threads: int | None = None,
    live_mem: bool = False,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Measure every (prompt length, method) pair, each in its own process.

    Returns:
        The report: {"rows": [...], "machine": {...}, "model", "date", "text_source", "new_tokens"}.
    """
    date = datetime.now().astimezone().isoformat(timespec="seconds")
    rows: list[BenchRow] = []
    info: dict[str, Any] = {}
    configs = [(n, m) for n in prompt_lengths for m in methods]
    for i, (n, m) in enumerate(configs, 1):
        spec = {
            "model": model,
            "device": device,
            "method": m,
            "prompt_tokens": n,
            "new_tokens": new_tokens,
            "repeats": repeats,
            "data": str(data_path) if data_path else None,
            "quiet_wait": quiet_wait,
            "threads": threads,
            "live_mem": live_mem,
        }
        t0 = time.perf_counter()
        result = _spawn(spec)
        row = BenchRow(**{f.name: result["row"][f.name] for f in fields(BenchRow)})
        rows.append(row)
        info = result
        if log:
            log(
                f"[{i}/{len(configs)}] {m:>8} @ {n:>5} prompt tokens: {row.tokens_per_s:8.2f} tokens/s, "
                f"peak {row.peak_mem_mb:8.1f} MiB ({time.perf_counter() - t0:.0f} s with loading)"
            )
            busy = max((f for f in row.other_cpu_frac_all if f is not None), default=0.0)
            if busy > BUSY_WARNING:
                log(
                    f"  warning: other processes used up to {busy:.0%} of the CPUs during the timed runs; "
                    "these timings are slowed by contention (see other_cpu_frac_all in --json)"
                )
    return {
        "rows": [asdict(r) for r in with_ratios(rows)],
        "machine": machine_info(info.get("device", device or ""), info.get("torch_threads")),
        "model": info.get("model", model),
        "text_source": info.get("text_source"),
        "new_tokens": new_tokens,
        "quiet_wait_s": quiet_wait,
        "date": date,
    }


def _parse_lengths(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError as e:
        raise InputError(f"--prompt-tokens must be comma-separated integers, got {text!r}.") from e
    if not values or min(values) < 1:
        raise InputError(f"--prompt-tokens needs positive lengths, got {text!r}.")
    return list(dict.fromkeys(values))


def method_from_spec(spec: str):
    """A method from its spec (see `methods.method_from_spec`)."""
    from ..methods import method_from_spec as from_spec

    return from_spec(spec)


def _parse_methods(text: str) -> list[str]:
    from ..methods import METHODS

    names = list(dict.fromkeys(m.strip().lower() for m in text.split(",") if m.strip()))
    if not names:
        raise InputError("--methods needs at least one name, e.g. none,macs.")
    for name in names:
        if name == BASELINE:
            continue
        try:
            method_from_spec(name)
        except UnknownMethodError as e:
            valid = ", ".join([BASELINE, *METHODS])
            raise UnknownMethodError(f"Unknown method {name!r}. Available for bench: {valid}.") from e
    return names


def load_reports(paths: list[str]) -> dict[str, Any]:
    """Merge saved `--json` reports into one (a later file's row replaces an earlier one of the same method, prompt
    length and new tokens); ratios are recomputed over the merged rows.

    Raises:
        InputError: unreadable files, or reports of different models or numbers of new tokens.
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
    for key in ("model", "new_tokens"):
        values = {str(r.get(key)) for r in reports}
        if len(values) > 1:
            raise InputError(f"Reports differ in {key} ({', '.join(sorted(values))}); combine only comparable runs.")
    last = reports[-1]
    names = list(dict.fromkeys(r.method for r in merged.values()))
    rank = {m: (m != BASELINE, i) for i, m in enumerate(names)}
    rows = sorted(merged.values(), key=lambda r: (r.prompt_tokens, rank[r.method]))  # as one run prints them
    return {**last, "rows": [asdict(r) for r in with_ratios(rows)],
            "date": ", ".join(dict.fromkeys(r["date"] for r in reports))}  # fmt: skip


def write_plot(rows: list[dict[str, Any]], path: str, title: str = "") -> None:
    """Throughput and peak memory vs prompt length as interactive HTML (`.html`) or a static image (`.png`)."""
    from visuals.efficiency import efficiency_figure, efficiency_png

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
        f"model: {report['model']}   device: {m['device']}   torch threads: {m['torch_threads']}   "
        f"text: {report['text_source']}   date: {report['date']}"
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


def _measure_from_args(args: argparse.Namespace) -> dict[str, Any]:
    lengths = _parse_lengths(args.prompt_tokens)
    methods = _parse_methods(args.methods)
    if args.new_tokens < 1:
        raise InputError(f"--new-tokens must be at least 1, got {args.new_tokens}.")
    if args.repeats < 1:
        raise InputError(f"--repeats must be at least 1, got {args.repeats}.")
    if args.threads is not None and args.threads < 1:
        raise InputError(f"--threads must be at least 1, got {args.threads}.")
    if args.quiet_wait < 0:
        raise InputError(f"--quiet-wait must be zero or more seconds, got {args.quiet_wait}.")
    if args.data is not None and not Path(args.data).is_file():
        raise InputError(f"Benchmark text file {args.data!r} does not exist.")
    return run_bench(
        args.model,
        lengths,
        args.new_tokens,
        methods,
        args.repeats,
        device=args.device,
        data_path=Path(args.data) if args.data else DEFAULT_DATA,
        quiet_wait=args.quiet_wait,
        threads=args.threads,
        live_mem=args.live_mem,
        log=lambda line: print(line, file=sys.stderr, flush=True),
    )


def add_bench_parser(sub: Any) -> None:
    """Register `bench` on the CLI's subparsers."""
    p = sub.add_parser(
        "bench",
        help="tokens/s and peak memory of attribution methods against plain generate",
        description=__doc__.splitlines()[0],
    )
    p.add_argument("--model", default=None, help="hub id or local folder (default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--prompt-tokens", default="256,1024,2048", help="comma-separated prompt lengths in tokens")
    p.add_argument("--new-tokens", type=int, default=32, help="tokens generated per run (EOS does not stop early)")
    p.add_argument(
        "--methods",
        default="none,macs",
        help="comma-separated: none (plain generate) and registered method names, each optionally with options "
        "as name:key=value:key=value (e.g. macs:alpha=0.5)",
    )
    p.add_argument("--repeats", type=int, default=3, help="timed runs per configuration; the median is reported")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda if available)")
    p.add_argument("--data", default=None, help=f"SQuAD-style JSON for prompt text (default: {DEFAULT_DATA})")
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
