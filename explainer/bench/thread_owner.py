"""Whether `explain` after the caller's own torch work runs as fast as in a fresh process (issue #54, item 9): the
`thread-owner` command.

Each measurement is a fresh process: it loads the model, for the kind "after-generate" first runs one
`model.generate` on its main thread (a notebook user's own torch work), warms `explain` up once, then times `repeats`
calls of `explain` with MACS (`prompt_tokens` of the bench's text, `new_tokens` generated). The two kinds alternate
`rounds` times, so a shared machine's load falls on both alike; `compare` gives each kind's median and their ratio.

The processes run this file by its path with `library` (a checkout) first on their path, so one command measures
another commit's `explain`, e.g. the commit before a change. That is why the file names the library's modules by
absolute names, and only those every version has had.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from explainer.bench.prompts import prompt_ids
from explainer.errors import ExplainerError, InputError
from explainer.explain import explain
from explainer.models.loading import load_model

FRESH, AFTER_GENERATE = "fresh", "after-generate"
KINDS = (FRESH, AFTER_GENERATE)
_THIS_CHECKOUT = Path(__file__).resolve().parents[2]
# The file by its path, as a script whose argv[0] it is, without its folder on the path (bench/ would shadow modules)
_RUN_THIS_FILE = "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"


@dataclasses.dataclass(frozen=True)
class ThreadOwnerConfig:
    """One comparison; checked when built (`InputError`)."""

    model: str | None = None  # hub id or folder; None: the embedded model
    prompt_tokens: int = 581  # the measurement
    new_tokens: int = 32
    repeats: int = 2  # timed calls per process
    rounds: int = 3  # processes of each kind, alternating
    dtype: str = "float32"
    library: str | None = None  # a checkout whose `explainer` the processes measure; None: this one

    def __post_init__(self) -> None:
        for name in ("prompt_tokens", "new_tokens", "repeats", "rounds"):
            if getattr(self, name) < 1:
                raise InputError(f"--{name.replace('_', '-')} must be 1 or more, got {getattr(self, name)}.")
        if self.library is not None:
            if not (Path(self.library) / "explainer" / "__init__.py").is_file():
                raise InputError(f"--library must be a checkout holding explainer/, got {self.library!r}.")
            object.__setattr__(self, "library", str(Path(self.library).resolve()))  # the processes run there


def measure(kind: str, config: ThreadOwnerConfig) -> dict[str, Any]:
    """In this process: `config.repeats` timed `explain` calls, after a `model.generate` on this thread first when
    `kind` is "after-generate". Returns {"seconds": [...], "device", "torch_threads"}."""
    if kind not in KINDS:
        raise InputError(f"The kind must be one of {', '.join(KINDS)}, got {kind!r}.")
    bundle = load_model(config.model, dtype=config.dtype, max_prompt_tokens=config.prompt_tokens)
    ids, _ = prompt_ids(bundle.tokenizer, config.prompt_tokens, None, None)
    prompt = bundle.tokenizer.decode(ids)
    if kind == AFTER_GENERATE:  # the caller's own torch work, on its main thread
        with torch.inference_mode():
            first = torch.tensor([ids[:64]], device=bundle.model.device)  # (1, 64)
            bundle.model.generate(first, max_new_tokens=4, do_sample=False)
    options = {"methods": ["macs"], "chat_template": False, "answer": None}
    explain(bundle, prompt, max_new_tokens=2, **options)  # warm-up
    seconds = []
    for _ in range(config.repeats):
        t0 = time.perf_counter()
        explain(bundle, prompt, max_new_tokens=config.new_tokens, **options)
        seconds.append(time.perf_counter() - t0)
    return {"seconds": seconds, "device": str(bundle.model.device), "torch_threads": torch.get_num_threads()}


def compare(config: ThreadOwnerConfig, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """`config.rounds` processes of each kind, alternating (`measure` in each).

    Returns:
        {"fresh_s", "after_generate_s" (the medians), "ratio" (after / fresh), "runs" (every call's seconds by
        kind), "args" (the config), "device", "torch_threads" (the processes')}.
    """
    runs: dict[str, list[float]] = {kind: [] for kind in KINDS}
    seen: dict[str, Any] = {}
    for _ in range(config.rounds):
        for kind in KINDS:
            seen = spawn(kind, config)
            runs[kind] += seen["seconds"]
            if log:
                log(f"{kind} {seen['seconds']}")
    fresh, after = statistics.median(runs[FRESH]), statistics.median(runs[AFTER_GENERATE])
    return {
        "fresh_s": fresh, "after_generate_s": after, "ratio": after / fresh, "runs": runs,
        "args": dataclasses.asdict(config), "device": seen["device"], "torch_threads": seen["torch_threads"],
    }  # fmt: skip


def spawn(kind: str, config: ThreadOwnerConfig) -> dict[str, Any]:
    """`measure(kind, config)` in a fresh process, with `config.library` (else this checkout) first on its path."""
    root = Path(config.library) if config.library else _THIS_CHECKOUT
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p)}
    spec = json.dumps(dataclasses.asdict(config))
    proc = subprocess.run(
        [sys.executable, "-c", _RUN_THIS_FILE, __file__, kind, spec],
        cwd=root, env=env, capture_output=True, text=True, check=False,  # the exit status is read below
    )  # fmt: skip
    if proc.returncode != 0:
        tail = [line for line in proc.stderr.splitlines() if line.strip()][-1:] or ["no output"]
        raise ExplainerError(f"the {kind} process failed (exit {proc.returncode}): {tail[0]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


if __name__ == "__main__":  # a measuring process (`spawn`): argv = [kind, the config as JSON]
    print(json.dumps(measure(sys.argv[1], ThreadOwnerConfig(**json.loads(sys.argv[2])))))
