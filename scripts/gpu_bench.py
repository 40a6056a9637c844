"""`bench` in one process, resumable: the GPU session's Table 3 at real size and the static path's speed (issue #33).

`python -m explainer bench` loads the model afresh in one process per configuration, which keeps memory figures
independent but costs a load each time: for an 8B model ~10 s of a 15-minute GPU window per row. Here the model is
built once and every configuration runs in this process with bench's own runners and timing (`bench.make_runner`,
`worker.timed_runs`: a warm-up of all K tokens on an accelerator, the median of the timed runs, CUDA's peak allocated
memory reset before each run, so the weights count in every row alike). The report is bench's JSON
(`bench --report` reads it) with `model`, `date`, `machine` (and the GPU), plus `refused`: configurations that ran
out of memory.

The model: `--model` a shipped configuration (`explainer/data/configs`, e.g. meta-llama/Llama-3.1-8B-Instruct) built
with random weights on the device (cost depends only on shape; end-of-sequence never stops a bench run), with an
offline tokenizer (`explainer/bench/synthetic.py`); `--tiny` shrinks its dimensions (a CPU dry run). `--folder` loads
a saved model instead (a path, or `embedded`).

`--plan` lists the configurations in the order they run, most valuable first: groups `LENGTHS:METHODS[:REPEATS]`
separated by `;`, e.g. `512,1024,2048:none,plain,macs;8192:macs,rollout:1`. The JSON is rewritten after every
configuration and the ones it already holds are skipped, so a run cut short by `--deadline` (seconds, after which no
new configuration starts) or by a time box resumes where it stopped.

`--profile` runs each configuration once more under `torch.profiler` and adds its counts to the report's `profiles`
(`profile_counts`): host calls that launch work on the GPU (`cudaLaunchKernel`, `cudaGraphLaunch`, copies and
synchronisations), ATen operators, and the GPU kernels with their device time, the costliest first: what a missed
speed goal is explained from (issue #42).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from dataclasses import asdict
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's packages, wherever it runs from


def parse_plan(text: str, repeats: int) -> list[tuple[int, str, int]]:
    """`LENGTHS:METHODS[:REPEATS];...` -> [(prompt tokens, method, repeats)] in running order (a method may carry
    options after colons, `sources:passes=knockout`; a last part that is a whole number is REPEATS)."""
    out = []
    for group in filter(None, (g.strip() for g in text.split(";"))):
        parts = group.split(":")
        count = int(parts.pop()) if len(parts) > 2 and parts[-1].strip().isdigit() else repeats
        lengths, methods = [int(v) for v in parts[0].split(",")], ":".join(parts[1:]).split(",")  # options keep ':'
        out += [(n, m.strip(), count) for n in lengths for m in methods]
    return out


HOST_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cudaGraphLaunch", "cudaMemcpyAsync",
              "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")  # fmt: skip
TOP_KERNELS = 15


def _profiled(run, input_ids, k: int, device) -> tuple[list, int]:
    """One run of `run` (K new tokens) under `torch.profiler`: its averaged events and the tokens it generated."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        steps = run(input_ids, k)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    return prof.key_averages(), max(int(steps or k), 1)


def _device_us(e) -> float:
    return float(getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0) or 0)


def _totals(events) -> dict:
    """A profiled run's totals: GPU kernels and their device milliseconds, ATen operators, and each host call."""
    from torch.autograd import DeviceType

    kernels = [e for e in events if e.device_type == DeviceType.CUDA]
    return {
        "kernels": sum(e.count for e in kernels), "kernel_ms": sum(_device_us(e) for e in kernels) / 1000,
        "aten_ops": sum(e.count for e in events if e.key.startswith("aten::")),
        **{e.key: e.count for e in events if e.key in HOST_CALLS},
    }  # fmt: skip


def profile_counts(run, input_ids, k: int, device) -> dict:
    """`run` (K new tokens) under `torch.profiler`: per generated token, the host's launch, copy and
    synchronisation calls (`HOST_CALLS`), its ATen operators, and the GPU's kernels and their time; the kernels
    with the most device time, with their counts and milliseconds over the run. Then one run of 1 token (the
    prefill and its token): `per_decode_step` is the difference of the two runs over the steps between them, the
    decode steps' own counts with the prefill's taken out."""
    from torch.autograd import DeviceType

    events, per = _profiled(run, input_ids, k, device)
    full = _totals(events)
    try:  # a one-token run unprofiled first: whatever it records (a graph of its own shape) is not counted
        run(input_ids, 1)
        first, one = _profiled(run, input_ids, 1, device)
    except Exception as e:  # the K-token counts stand without the split
        print(f"the one-token profile failed ({type(e).__name__}: {e}); no per-step split", flush=True)
        first, one = [], per
    prefill = _totals(first)
    gap = max(per - one, 1)
    costliest = sorted((e for e in events if e.device_type == DeviceType.CUDA), key=_device_us, reverse=True)
    return {
        "new_tokens": per,
        "host_calls_per_token": {c: round(full[c] / per, 2) for c in HOST_CALLS if c in full},
        "aten_ops_per_token": round(full["aten_ops"] / per, 1),
        "kernels_per_token": round(full["kernels"] / per, 1),
        "kernel_ms_per_token": round(full["kernel_ms"] / per, 4),
        "prefill_and_first_token": {c: round(v, 4) for c, v in prefill.items()},
        "per_decode_step": None
        if not first
        else {c: round((full.get(c, 0) - prefill.get(c, 0)) / gap, 4) for c in full.keys() | prefill},
        "top_kernels": [
            {"name": e.key[:120], "count": e.count, "ms": round(_device_us(e) / 1000, 3)}
            for e in costliest[:TOP_KERNELS]
        ],
    }


def _measure(model, tok, device, n: int, method: str, k: int, repeats: int, profiled: list | None = None) -> dict:
    """One configuration's `BenchRow` as a dict (bench's runner, warm-up and timing); with `profiled` (a list) also
    one profiled run, appended to it (`profile_counts`)."""
    import torch

    from explainer import bundle_from_objects
    from explainer.bench.config import BenchConfig
    from explainer.bench.prompts import prompt_ids
    from explainer.bench.report import BASELINE, PLAIN
    from explainer.bench.worker import (
        WARMUP_POSTHOC_PROMPT_TOKENS,
        decode_path,
        make_runner,
        method_from_spec,
        record_work,
        timed_runs,
        warmup_new_tokens,
    )

    ids, _ = prompt_ids(tok, n)
    input_ids = torch.tensor([ids], dtype=torch.long, device=device)  # (1, N)
    work: dict[str, float] = {}
    readable = bundle_from_objects(model, tok, name="bench").readable(ids)  # Sources cuts them into sentences
    run = make_runner(model, method, readable, work)
    posthoc = method not in (BASELINE, PLAIN) and not method_from_spec(method).streaming
    run(input_ids[:, :WARMUP_POSTHOC_PROMPT_TOKENS] if posthoc else input_ids, warmup_new_tokens(device.type, k))
    work.clear()
    config = BenchConfig(prompt_lengths=(n,), new_tokens=k, methods=(method,), repeats=repeats)
    row = timed_runs(config, method, device, run, input_ids)
    record_work(row, work)
    row.decode_path = decode_path(model, method, input_ids)
    if profiled is not None:
        counts = profile_counts(run, input_ids, k, device)
        profiled.append({"method": method, "prompt_tokens": n, "decode_path": row.decode_path, **counts})
    return asdict(row)


def _write(path: Path, report: dict) -> None:
    from explainer.bench.report import BenchRow, with_ratios

    rows = with_ratios([BenchRow(**r) for r in report["rows"]])
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({**report, "rows": [asdict(r) for r in rows]}, indent=2), encoding="utf-8")
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="a shipped configuration's Hub id: random weights built on the device")
    src.add_argument("--folder", help="a saved model folder, or 'embedded'")
    p.add_argument("--tiny", action="store_true", help="shrink the configuration's dimensions (CPU dry runs)")
    p.add_argument("--max-positions", type=int, default=None, help="raise --model's position limit to this")
    p.add_argument("--json", required=True, help="the report; configurations it holds are skipped")
    p.add_argument("--plan", required=True, help="LENGTHS:METHODS[:REPEATS];... in running order")
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--device", default=None)
    p.add_argument("--decode", default=None, help="$EXPLAINER_DECODE: auto, solo, static, cuda-graph, batched")
    p.add_argument("--deadline", type=float, default=None, help="seconds after which no configuration starts")
    p.add_argument("--profile", action="store_true", help="also one profiled run a configuration (`profiles`)")
    a = p.parse_args(argv)
    t_start = time.perf_counter()
    if a.decode:
        os.environ["EXPLAINER_DECODE"] = a.decode
    path = Path(a.json)
    report = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
    done = {(r["method"], r["prompt_tokens"]) for r in (report or {}).get("rows", [])}
    done |= {(r["method"], r["prompt_tokens"]) for r in (report or {}).get("refused", [])}
    plan = [c for c in parse_plan(a.plan, a.repeats) if (c[1], c[0]) not in done]
    if not plan:
        print(f"{path}: every configuration is there")
        return 0
    return _run_plan(a, path, report, plan, t_start)


def _run_plan(a, path: Path, report: dict | None, plan: list, t_start: float) -> int:
    import torch

    from explainer.bench.prompts import prompt_text
    from explainer.bench.synthetic import bench_model, machine

    model, tok, name, device = bench_model(a.model, a.folder, a.dtype, a.device, a.tiny, a.max_positions)
    print(f"{name} on {device}: built/loaded in {time.perf_counter() - t_start:.1f} s", flush=True)
    report = report or {"rows": [], "refused": [], "model": name, "dtype": a.dtype, "new_tokens": a.new_tokens,
                        "text_source": prompt_text()[1], "decode": a.decode or "auto",
                        "note": "one process for every configuration (scripts/gpu_bench.py)"}  # fmt: skip
    report.update(machine=machine(device), date=datetime.now().astimezone().isoformat(timespec="seconds"))
    for n, method, repeats in plan:
        if a.deadline is not None and time.perf_counter() - t_start > a.deadline:
            print(f"deadline reached: {method} @ {n} and later configurations left for the next run", flush=True)
            break
        t0 = time.perf_counter()
        try:
            profiled = report.setdefault("profiles", []) if a.profile else None
            row = _measure(model, tok, device, n, method, a.new_tokens, repeats, profiled)
        except torch.cuda.OutOfMemoryError as e:
            report.setdefault("refused", []).append({"method": method, "prompt_tokens": n, "error": str(e)[:300]})
            print(f"{method:>9} @ {n:>6}: out of memory", flush=True)
        else:
            report["rows"].append(row)
            print(f"{method:>9} @ {n:>6}: {row['tokens_per_s']:8.2f} tokens/s, peak {row['peak_mem_mb']:9.1f} MiB, "
                  f"{row['decode_path']} ({time.perf_counter() - t0:.0f} s)", flush=True)  # fmt: skip
            if a.profile:
                c = report["profiles"][-1]
                step = c["per_decode_step"] or "not measured"
                print(
                    f"{'':>18} per token: {c['kernels_per_token']} kernels, {c['kernel_ms_per_token']} ms on the "
                    f"device, {c['aten_ops_per_token']} ATen ops, {c['host_calls_per_token']}; per decode step: {step}",
                    flush=True,
                )
        _write(path, report)
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
