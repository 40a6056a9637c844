"""Runs each (method, prompt length) in a fresh worker process (`worker.worker_main`) and collects the report."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, fields
from datetime import datetime
from pathlib import Path
from typing import Any

from .. import errors
from ..errors import ExplainerError
from .config import BenchConfig
from .probes import BUSY_WARNING
from .report import BenchRow, with_ratios

_REPO_ROOT = Path(__file__).resolve().parents[2]
_WORKER_CODE = "import sys; from explainer.bench.worker import worker_main; sys.exit(worker_main(sys.argv[1:]))"


def _spawn(spec: dict[str, Any]) -> dict[str, Any]:
    """Run `worker.measure` of one pair (`spec`: the config as JSON, the method and the prompt length) in a fresh
    interpreter; re-raise its user-facing errors here."""
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


def _log_row(log: Callable[[str], None], counter: str, row: BenchRow, seconds: float) -> None:
    """One line per measured configuration, and a warning when other processes took the CPUs meanwhile."""
    log(
        f"{counter} {row.method:>8} @ {row.prompt_tokens:>5} prompt tokens: {row.tokens_per_s:8.2f} tokens/s, "
        f"peak {row.peak_mem_mb:8.1f} MiB ({seconds:.0f} s with loading)"
    )
    busy = max((f for f in row.other_cpu_frac_all if f is not None), default=0.0)
    if busy > BUSY_WARNING:
        log(
            f"  warning: other processes used up to {busy:.0%} of the CPUs during the timed runs; "
            "these timings are slowed by contention (see other_cpu_frac_all in --json)"
        )


def run_bench(config: BenchConfig, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Measure every (prompt length, method) pair of `config`, each in its own process, which gets the config whole.

    Args:
        config: what to measure and how (`BenchConfig`, checked when it was built).
        log: gets one line per measured pair (and a warning when other processes took the CPUs meanwhile).

    Returns:
        The report: {"rows": [...], "machine": {...}, "model", "dtype", "text_source", "new_tokens", "quiet_wait_s",
        "date"}.
    """
    date = datetime.now().astimezone().isoformat(timespec="seconds")
    rows: list[BenchRow] = []
    info: dict[str, Any] = {}
    pairs = [(n, m) for n in config.prompt_lengths for m in config.methods]
    for i, (n, m) in enumerate(pairs, 1):
        t0 = time.perf_counter()
        result = _spawn({"config": config.to_json(), "method": m, "prompt_tokens": n})
        row = BenchRow(**{f.name: result["row"][f.name] for f in fields(BenchRow)})
        rows.append(row)
        info = result
        if log:
            _log_row(log, f"[{i}/{len(pairs)}]", row, time.perf_counter() - t0)
    return {
        "rows": [asdict(r) for r in with_ratios(rows)],
        "machine": machine_info(info.get("device", config.device or ""), info.get("torch_threads")),
        "model": info.get("model", config.model),
        "dtype": info.get("dtype", config.dtype),
        "text_source": info.get("text_source"),
        "new_tokens": config.new_tokens,
        "quiet_wait_s": config.quiet_wait,
        "date": date,
    }
