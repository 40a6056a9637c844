"""One benchmark run as one object: the model, the grid of (prompt length, method) pairs and how each is timed.

`BenchConfig` is checked once when it is built (by `explainer/cli/bench.py`), passed whole to `runner.run_bench`, and
sent whole, as JSON, to every worker process (`worker.worker_main`), which builds it again from that JSON.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..decoding.choice import OVERRIDES
from ..errors import InputError, UnknownMethodError
from .prompts import prompt_text
from .report import BASELINE, PLAIN


def _lengths(values: Sequence[int]) -> tuple[int, ...]:
    if isinstance(values, str) or not values or any(isinstance(v, bool) or not isinstance(v, int) for v in values):
        raise InputError(f"Prompt lengths must be a list of whole numbers of tokens, got {values!r:.60}.")
    if min(values) < 1:
        raise InputError(f"Prompt lengths must be positive numbers of tokens, got {min(values)}.")
    return tuple(dict.fromkeys(values))


def _methods(specs: Sequence[str]) -> tuple[str, ...]:
    """The method specs, lower-cased and each once; every one must parse (`methods.method_from_spec`)."""
    from ..methods import METHODS, method_from_spec

    if isinstance(specs, str):
        raise InputError(f"Methods must be a list of names, got the string {specs!r:.60}.")
    names = tuple(dict.fromkeys(m.strip().lower() for m in specs if m.strip()))
    if not names:
        raise InputError("Give at least one method to benchmark, e.g. none,macs.")
    for name in names:
        if name in (BASELINE, PLAIN):
            continue
        try:
            method_from_spec(name)
        except UnknownMethodError as e:
            valid = ", ".join([BASELINE, PLAIN, *METHODS])
            raise UnknownMethodError(f"Unknown method {name!r}. Available for bench: {valid}.") from e
    return names


@dataclass(frozen=True)
class BenchConfig:
    """What `run_bench` measures: every (prompt length, method) pair, each in a fresh process.

    Attributes:
        model: hub id or local folder (None: the embedded model).
        prompt_lengths: prompt lengths N in tokens, each once, in the order given.
        new_tokens: tokens K generated per timed run (end-of-sequence never stops a run early).
        methods: "none" (plain `model.generate`), "plain" (the library's own decode loop, no method) and method
            specs (`name:key=value`), lower-cased, each once.
        repeats: timed runs per pair; the median is reported.
        device, device_map: where the model goes (see `models.load_model`).
        dtype: the weights' dtype by name (see `precision.parse_dtype`; "auto": the device's default).
        data_path, prompt_file: the prompt text's source (see `prompts.prompt_ids`; neither: the shipped essays).
        quiet_wait: seconds to wait, before each timed run, for other processes to leave the CPUs alone.
        threads: `torch.set_num_threads` in every worker (None: torch's default).
        live_mem: also measure `BenchRow.live_peak_mem_mb` (CPU only).
        decode: the decode loop's policy in every worker (a `decoding.OVERRIDES` name; None: the default choice).
    """

    model: str | None = None
    prompt_lengths: tuple[int, ...] = (256, 1024, 2048)
    new_tokens: int = 32
    methods: tuple[str, ...] = (BASELINE, "macs")
    repeats: int = 3
    device: str | None = None
    dtype: str = "auto"
    device_map: str | dict[str, Any] | None = None
    data_path: Path | None = None
    prompt_file: Path | None = None
    quiet_wait: float = 0.0
    threads: int | None = None
    live_mem: bool = False
    decode: str | None = None

    def __post_init__(self) -> None:
        from ..runtime.precision import parse_dtype

        object.__setattr__(self, "prompt_lengths", _lengths(self.prompt_lengths))
        object.__setattr__(self, "methods", _methods(self.methods))
        if isinstance(self.new_tokens, bool) or not isinstance(self.new_tokens, int) or self.new_tokens < 1:
            raise InputError(f"New tokens must be a whole number, at least 1, got {self.new_tokens!r}.")
        if isinstance(self.repeats, bool) or not isinstance(self.repeats, int) or self.repeats < 1:
            raise InputError(f"Repeats must be a whole number, at least 1, got {self.repeats!r}.")
        if self.threads is not None and (not isinstance(self.threads, int) or self.threads < 1):
            raise InputError(f"Threads must be at least 1, got {self.threads!r}.")
        if self.quiet_wait < 0:
            raise InputError(f"The quiet wait must be zero or more seconds, got {self.quiet_wait}.")
        if self.decode is not None and self.decode not in OVERRIDES:
            raise InputError(f"The decode policy must be one of {', '.join(OVERRIDES)}, got {self.decode!r:.40}.")
        parse_dtype(self.dtype)  # a bad name fails here, before any worker starts; workers get the name
        for name in ("data_path", "prompt_file"):
            value = getattr(self, name)
            object.__setattr__(self, name, None if value is None else Path(value))
        if self.prompt_file is not None and not self.prompt_file.is_file():
            raise InputError(f"Benchmark text file {str(self.prompt_file)!r} does not exist.")
        prompt_text(self.data_path, self.prompt_file)  # an unreadable or empty file fails here, before any worker

    def to_json(self) -> dict[str, Any]:
        """The config as JSON-able values (paths as strings), as a worker process receives it."""
        out = asdict(self)
        out.update({k: str(v) for k in ("data_path", "prompt_file") if (v := out[k]) is not None})
        return out

    @classmethod
    def from_json(cls, values: dict[str, Any]) -> BenchConfig:
        """The config `to_json` wrote, checked again."""
        lists = ("prompt_lengths", "methods")
        return cls(**{k: tuple(v) if k in lists else v for k, v in values.items()})
