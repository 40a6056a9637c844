"""Timing inside a worker process: load the model, warm up, then time `repeats` runs of one (method, prompt length)."""

from __future__ import annotations

import gc
import json
import os
import statistics
import time
import weakref
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..decoding.choice import DECODE_ENV
from ..decoding.dispatch import generate_steps
from ..decoding.job import DecodeJob
from ..errors import ExplainerError, InputError
from ..explain import decode_choice
from ..methods import GenerationRun, answer_logprobs
from ..methods import method_from_spec as from_spec
from ..models.loading import load_model
from ..runtime.precision import dtype_name
from ..runtime.session import hold
from .config import BenchConfig
from .probes import ContentionProbe, MemoryProbe, live_peak_mb
from .prompts import prompt_ids
from .report import BASELINE, PLAIN, BenchRow

_last_paths: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> the path its last run's steps took
WARMUP_NEW_TOKENS = 2  # enough to run the prefill and one cached decode step
# Post-hoc methods (AtMan) cost about as much for 2 new tokens as for 32 (their cost grows with the prompt), so they
# warm up on a short prefix of the prompt: the one-time costs are the same, minutes of untimed work are not spent.
WARMUP_POSTHOC_PROMPT_TOKENS = 64


def warmup_new_tokens(device_type: str, k: int) -> int:
    """New tokens of the untimed warm-up run: `WARMUP_NEW_TOKENS` on a CPU; all K on an accelerator, where every
    new cache length can meet kernels not yet loaded (CUDA loads them lazily) and the allocator grows: on an H200 a
    2-token warm-up left the first timed run of 32 tokens up to 3 times slower than the next ones."""
    return min(WARMUP_NEW_TOKENS, k) if device_type == "cpu" else k


def method_from_spec(spec: str):
    """A method from its spec (see `methods.method_from_spec`)."""
    return from_spec(spec)


def make_runner(
    model: Any, method_name: str, tokens: list[str] | None = None, work: dict[str, float] | None = None
) -> Callable[[Any, int], int]:
    """A callable `run(input_ids (1, N), K) -> tokens generated` for the baseline or a registered method.

    The kind of run depends only on the method's `streaming` flag, so newly registered methods are benchmarked as
    they are. `tokens`: the readable tokens of the longest prompt the runner gets (Sources cuts them into
    sentences; a shorter prompt is their prefix). `work`, if given, gets the forward positions of each run where
    they are counted: plain generation's (N + K - 1) and those a method's meta reports (its `*_positions` entries,
    e.g. Sources against leave-one-sentence-out and ContextCite), and the phases it timed (its `*_seconds`
    entries; `record_work` puts both on the row). Every run holds the model (`session.hold`), like any request.
    """
    runner = _make_runner(model, method_name, tokens, {} if work is None else work)

    def held(input_ids, k: int) -> int:
        with hold(model):
            return runner(input_ids, k)

    return held


def _make_runner(
    model: Any, method_name: str, prompt_tokens: list[str] | None, work: dict[str, float]
) -> Callable[[Any, int], int]:
    import torch

    if method_name == BASELINE:

        def run_plain(input_ids: torch.Tensor, k: int) -> int:
            with torch.inference_mode():
                out = model.generate(input_ids, max_new_tokens=k, min_new_tokens=k, do_sample=False)  # (1, N + K)
            work["forward_positions"] = out.shape[1] - 1  # the prefill's N, then one per decoded token but the last
            return out.shape[1] - input_ids.shape[1]

        return run_plain

    if method_name == PLAIN:

        def run_library(input_ids: torch.Tensor, k: int) -> int:
            return sum(1 for _ in _steps(model, DecodeJob(input_ids, [], k)))

        return run_library

    method = method_from_spec(method_name)
    method.prepare(model)
    if method.streaming:

        def run_streaming(input_ids: torch.Tensor, k: int) -> int:
            # Keep the score rows as the app does, so their cost is counted.
            rows = [s.scores[method.name] for s in _steps(model, DecodeJob(input_ids, [method], k))]
            return len(rows)

        return run_streaming

    def run_posthoc(input_ids: torch.Tensor, k: int) -> int:
        steps = list(_steps(model, DecodeJob(input_ids, [], k)))
        tokens = [s.token_id for s in steps]
        generated = torch.tensor([tokens], dtype=input_ids.dtype, device=input_ids.device)  # (1, K)
        full = torch.cat([input_ids, generated], dim=1)  # (1, N + K)
        n = input_ids.shape[1]
        shown = prompt_tokens[:n] if prompt_tokens is not None else None
        logp = answer_logprobs([s.probability for s in steps], len(steps))  # as the app's requests carry them
        method.explain(GenerationRun(model, full, n, prompt_tokens=shown, answer_logprobs=logp))
        work.update({key: v for key, v in method.meta().items() if key.endswith(("_positions", "_seconds"))})
        return len(tokens)

    return run_posthoc


def record_work(row: BenchRow, work: dict[str, float]) -> None:
    """The last timed run's counts onto its row: forward positions (`positions`) and the phases a method timed
    (`phase_seconds`, e.g. Sources' removal passes and fit)."""
    row.positions = {key: int(v) for key, v in work.items() if key.endswith("_positions")} or None
    row.phase_seconds = {key: float(v) for key, v in work.items() if key.endswith("_seconds")} or None


def measure(config: BenchConfig, method: str, prompt_tokens: int) -> dict[str, Any]:
    """Load the model, warm up, time `config.repeats` runs of one (method, prompt length) pair of `config`; runs
    inside a fresh worker process.

    Returns:
        A `BenchRow` as a dict plus `model`, `device`, `dtype`, `torch_threads` and `text_source`.
    """
    import torch

    n, k = prompt_tokens, config.new_tokens
    if config.threads:
        torch.set_num_threads(config.threads)
    if config.decode:
        os.environ[DECODE_ENV] = config.decode  # this worker's own environment: its decode policy
    bundle = load_model(
        config.model, device=config.device, device_map=config.device_map, dtype=config.dtype, max_prompt_tokens=n
    )
    context = bundle.context_length
    if context is not None and n + k > context:
        raise InputError(
            f"{n} prompt tokens + {k} new tokens exceed the context of {bundle.name} ({context} tokens). "
            "Ask for shorter prompts or fewer new tokens."
        )
    ids, source = prompt_ids(bundle.tokenizer, n, config.data_path, config.prompt_file)
    input_ids = torch.tensor([ids], dtype=torch.long, device=bundle.device)  # (1, N)
    work: dict[str, float] = {}
    run = make_runner(bundle.model, method, bundle.readable(ids), work)
    posthoc = method not in (BASELINE, PLAIN) and not method_from_spec(method).streaming
    run(input_ids[:, :WARMUP_POSTHOC_PROMPT_TOKENS] if posthoc else input_ids, warmup_new_tokens(bundle.device.type, k))
    gc.collect()

    work.clear()  # the warm-up's counts were over a shorter prompt
    row = timed_runs(config, method, bundle.device, run, input_ids)
    row.decode_path = decode_path(bundle.model, method, input_ids)
    record_work(row, work)
    if config.live_mem and bundle.device.type == "cpu":
        row.live_peak_mem_mb = live_peak_mb(run, input_ids, k)
    return {
        "row": asdict(row),
        "model": bundle.name,
        "device": str(bundle.device),
        "dtype": dtype_name(bundle.model.dtype),
        "torch_threads": torch.get_num_threads(),
        "text_source": source,
    }


def timed_runs(config: BenchConfig, method: str, device: Any, run: Any, input_ids: Any) -> BenchRow:
    """`config.repeats` timed runs of `run` over `input_ids` (1, N) with K new tokens each, with their memory peaks
    and the CPU time other processes took meanwhile."""
    import torch

    probe = MemoryProbe(device)
    seconds, cpu_seconds, other_cpu, peaks, bases = [], [], [], [], []
    contention = ContentionProbe()
    k = config.new_tokens
    for i in range(config.repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        contention.wait_quiet(config.quiet_wait)
        # Trimming only once: a trim before every run would make each run fault its pages in again, inside the timing.
        bases.append(probe.reset(trim=i == 0))
        with contention:
            t0, c0 = time.perf_counter(), time.process_time()
            produced = run(input_ids, k)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            seconds.append(time.perf_counter() - t0)
            cpu_seconds.append(time.process_time() - c0)
        other_cpu.append(contention.fraction)
        peaks.append(probe.peak_mb())
        if produced != k:
            raise RuntimeError(f"{method} generated {produced} tokens instead of {k}")
    return BenchRow(
        method=method, prompt_tokens=int(input_ids.shape[1]), new_tokens=k,
        tokens_per_s=statistics.median(k / s for s in seconds), peak_mem_mb=max(peaks), repeats=len(seconds),
        seconds_all=seconds, peak_mem_mb_all=peaks, mem_method=probe.method, base_mem_mb=bases[0],
        cpu_seconds_all=cpu_seconds, other_cpu_frac_all=other_cpu, live_peak_mem_mb=None,
    )  # fmt: skip


def decode_path(model: Any, method_name: str, input_ids: Any = None) -> str:
    """The loop a configuration generated with: "generate" for the baseline, else the path its last run's steps
    took (`Step.decode_path`: a CUDA graph that failed to record reads as the eager static path it fell back to).
    `input_ids` is not read (kept for callers of the earlier signature)."""
    if method_name == BASELINE:
        return "generate"
    return _last_paths[model]


def _steps(model: Any, job: DecodeJob):
    """`generate_steps` on the path the request path chooses for the job (`explain.decode_choice`), each step's path
    remembered for `decode_path`."""
    for step in generate_steps(model, job, decode_choice(model, job)):
        _last_paths[model] = step.decode_path
        yield step


def worker_main(argv: list[str]) -> int:
    """Entry point of a worker process: `argv` = [spec JSON, output path], the spec holding the whole config
    (`BenchConfig.to_json`), the method and the prompt length. Writes the result or the error there."""
    spec, out_path = json.loads(argv[0]), Path(argv[1])
    try:
        config = BenchConfig.from_json(spec["config"])
        result = measure(config, spec["method"], int(spec["prompt_tokens"]))
    except ExplainerError as e:
        out_path.write_text(json.dumps({"error": str(e), "error_type": type(e).__name__}), encoding="utf-8")
        return 2
    out_path.write_text(json.dumps(result), encoding="utf-8")
    return 0
