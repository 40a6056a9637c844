"""A crowd through the library, without the app: N visitors' text requests at once on one model (issue #34's GPU rows;
the front end is `python -m explainer crowd`).

Each visitor is a thread calling `explain_request` with the batched decode on (`decoding.enable_batching()`, as the app
runs it): the same prompt (with `distinct` each visitor's own, its number at the end, so no two rows share a prefill),
MACS + Rollout, a given answer of `new_tokens` token ids (teacher-forced, so every request runs all its steps whatever
random weights would generate). Before the crowds a request runs once to warm up, one crowd of the largest size runs
uncounted (a process's first crowds also grow its memory, `explainer/runtime/malloc.py`), and each distinct request
runs alone: its reference. Each crowd size runs `rounds` times, alternating (1, 8, 1, 8, ...); the report gives each
round's time until all were served, the medians (`summary`), the median of each size over the median of the
1-visitor rounds, and the visitors whose token ids, raw maps or step scores differ from their reference in any bit,
with by how much (`difference`).

Where `scripts/load_test.py --crowd` measures the app with real clients, this measures what the batched decode itself
gives on a device, for the GPU session (`scripts/gpu_check.sh crowd`), where the app and its clients cannot run beside
the model. `at_once` and `summary` are what both crowd tests share: visitors who start at one instant, and the medians
of alternating rounds (no gradio here: the library's crowd runs on GPU machines that have none).
"""

from __future__ import annotations

import json
import statistics
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np

SENTENCE = "The harbour lighthouse was built from granite, and its keeper wrote a daily log of every ship. "


@dataclass
class CrowdConfig:
    visitors: tuple[int, ...] = (1, 8)  # crowd sizes, run in turn
    rounds: int = 3  # rounds of each size, alternating
    prompt_tokens: int = 150
    new_tokens: int = 32  # a given answer of this many token ids
    distinct: bool = False  # each visitor its own prompt: no two share a prefill


@contextmanager
def deterministic_algorithms(on: bool) -> Iterator[set[str]]:
    """With `on`, torch's deterministic algorithms for the block, warn-only (`torch.use_deterministic_algorithms`),
    restored after it; yields a set that then holds the first line of each distinct warning torch gave for an operation
    that has no deterministic implementation. The GPU probe of a row whose bits differ from run to run: it names the
    operations, and whether the mismatches go with them on (docs/gpu.md). Torch also fills new memory with NaN in
    this mode, so a read of memory never written shows too. Warnings from every thread are caught (the module-wide
    filters), so run it around the whole crowd, not beside other work."""
    import torch

    seen: set[str] = set()
    if not on:
        yield seen
        return
    was = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield seen
    finally:
        torch.use_deterministic_algorithms(was[0], warn_only=was[1])
    found = (str(w.message).strip().splitlines() for w in caught)
    seen.update(lines[0] for lines in found if lines and "deterministic implementation" in " ".join(lines))


def at_once(n: int, visit: Callable[[int], Any]) -> tuple[list[Any], float]:
    """`visit(i)` for i < n, each in its own thread, all released at one instant: (what each returned, or the exception
    it raised; the seconds until the last one ended)."""
    out: list[Any] = [RuntimeError("no result")] * n
    start = threading.Barrier(n + 1)

    def run(i: int) -> None:
        start.wait()
        try:
            out[i] = visit(i)
        except BaseException as e:  # counted as an error by the caller
            out[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    return out, time.perf_counter() - t0


def summary(rows: list[dict]) -> list[dict]:
    """Per crowd size: the median time until all were served over its rounds, and that median over the median of
    the 1-visitor rounds of the same run (the ratio the goal names; a busy or noisy machine moves single rounds by
    tens of percent, so the rounds alternate and the medians are compared)."""
    by_size: dict[int, list[float]] = {}
    for row in rows:
        by_size.setdefault(row["visitors"], []).append(row["all_served_s"])
    one = statistics.median(by_size[1]) if 1 in by_size else None
    return [
        {
            "visitors": n, "rounds": len(times), "all_served_median_s": statistics.median(times),
            "vs_one_alone_median": None if one is None else statistics.median(times) / one,
        }
        for n, times in sorted(by_size.items())
    ]  # fmt: skip


def crowd_request(bundle, prompt_tokens: int, new_tokens: int, visitor: int | None = None):
    """The request every visitor sends, or with `visitor` that visitor's own (its number ends the prompt)."""
    import torch

    from ..request import ExplainRequest

    words = (SENTENCE * (prompt_tokens // 16 + 1)).split()
    prompt = " ".join(words[: max(1, prompt_tokens * 3 // 4)]) + ("" if visitor is None else f" Visitor {visitor}.")
    vocab = bundle.model.config.get_text_config().vocab_size
    answer = torch.randint(10, min(vocab, 30_000), (new_tokens,), generator=torch.Generator().manual_seed(0))
    return ExplainRequest.build(prompt, ["macs", "rollout"], new_tokens, answer=tuple(answer.tolist()))


def same(a, b) -> bool:
    """Bit for bit: token ids, every method's raw map, step probabilities and entropies."""
    return (
        a.generated_token_ids == b.generated_token_ids
        and a.methods.keys() == b.methods.keys()
        and all(np.array_equal(a.methods[m].raw, b.methods[m].raw, equal_nan=True) for m in a.methods)
        and json.dumps(a.step_scores) == json.dumps(b.step_scores)
    )


def _gap(x, y) -> dict | None:
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if x.shape != y.shape:
        return None
    both = np.isfinite(x) & np.isfinite(y)
    d = float(np.abs(x - y)[both].max(initial=0.0))
    scale = float(np.abs(y)[both].max(initial=0.0))
    return {"max_abs": d, "relative": d / scale if scale else None}


def _first_row(x, y) -> int | None:
    """The first index along the first axis where `x` and `y` differ in any bit (NaN equal to NaN); None where they
    do not, or where their shapes differ."""
    x, y = np.asarray(x), np.asarray(y)
    if x.shape != y.shape or x.ndim == 0 or len(x) == 0:
        return None
    equal = (x == y) | (np.isnan(x) & np.isnan(y)) if x.dtype.kind == "f" else x == y
    rows = np.flatnonzero(~equal.reshape(len(x), -1).all(axis=1))
    return int(rows[0]) if len(rows) else None


def first_step(a, b) -> int | None:
    """The first answer step at which `a` and `b` differ: a token, a map's row or a step score (step 0 comes from the
    prefill's pass, so a difference there is the prefill's, not the batch's steps'); None where none does."""
    ta, tb = a.generated_token_ids, b.generated_token_ids
    firsts = [_first_row(ta[: len(tb)], tb[: len(ta)])] + ([min(len(ta), len(tb))] if len(ta) != len(tb) else [])
    firsts += [_first_row(a.methods[m].raw, b.methods[m].raw) for m in a.methods.keys() & b.methods.keys()]
    firsts += [_first_row(a.step_scores[k], b.step_scores[k]) for k in a.step_scores.keys() & b.step_scores.keys()]
    return min((f for f in firsts if f is not None), default=None)


def difference(a, b) -> dict:
    """How a visitor's result `a` differs from its reference `b` (for a mismatch found by `same`): whether the token
    ids are equal, the first step that differs (`first_step`), and the largest absolute difference of each method's
    raw map and of each step score (relative to the reference's largest magnitude too), where their shapes agree."""
    return {
        "tokens_equal": a.generated_token_ids == b.generated_token_ids,
        "first_step": first_step(a, b),
        "maps": {m: _gap(a.methods[m].raw, b.methods[m].raw) for m in sorted(a.methods.keys() & b.methods.keys())},
        "step_scores": {
            k: _gap(a.step_scores[k], b.step_scores[k]) for k in sorted(a.step_scores.keys() & b.step_scores.keys())
        },
    }


def crowd_round(bundle, requests: list, n: int, references: list | None) -> dict:
    """One crowd of `n`: visitor i sends requests[i]; its result is compared with references[i] (None: not
    compared)."""
    from ..explain import explain_request

    out, wall = at_once(n, lambda i: explain_request(bundle, requests[i]))
    done = [(i, r) for i, r in enumerate(out) if not isinstance(r, BaseException)]
    differ = None if references is None else [(i, r) for i, r in done if not same(r, references[i])]
    return {
        "visitors": n,
        "all_served_s": wall,
        "tokens_per_s": sum(len(r.generated_token_ids) for _, r in done) / wall,
        "errors": [f"{type(r).__name__}: {r}" for r in out if isinstance(r, BaseException)],
        "mismatched_visitors": None if differ is None else len(differ),
        "differences": None if differ is None else [{"visitor": i, **difference(r, references[i])} for i, r in differ],
        "largest_batch": max((r.meta["decode"]["batch_size"] for _, r in done), default=0),
        "shared_prefill": max((r.meta["decode"]["prefill_rows"] for _, r in done), default=0),
    }


def run_crowd(bundle, cfg: CrowdConfig) -> dict:
    """The warm-up, the uncounted first crowd, each request alone (the references), then `cfg.rounds` rounds of every
    crowd size, alternating; the report without the machine (the caller knows its device)."""
    from ..decoding import enable_batching
    from ..decoding.batched.engine import finish
    from ..explain import explain_request

    sizes = list(cfg.visitors)
    if cfg.distinct:
        requests = [crowd_request(bundle, cfg.prompt_tokens, cfg.new_tokens, i) for i in range(1, max(sizes) + 1)]
    else:
        requests = [crowd_request(bundle, cfg.prompt_tokens, cfg.new_tokens)] * max(sizes)
    enable_batching()
    try:
        explain_request(bundle, requests[0])  # warm-up
        crowd_round(bundle, requests, max(sizes), None)  # a first crowd, uncounted
        alone = {id(r): explain_request(bundle, r) for r in requests}  # alone in the batcher: what each must get
        references = [alone[id(r)] for r in requests]
        rows = [crowd_round(bundle, requests, n, references) for _ in range(cfg.rounds) for n in sizes]
    finally:
        finish(bundle.model, timeout=60)  # the batcher's thread ends before the interpreter does (no abort at exit)
    reference = references[0]
    return {
        "model": bundle.name, "date": datetime.now().strftime("%Y-%m-%d"),
        "prompt_tokens": reference.num_prompt_tokens, "new_tokens": cfg.new_tokens,
        "decode": reference.meta["decode"]["path"], "decode_reason": reference.meta["decode"]["reason"],
        "distinct_prompts": cfg.distinct, "rounds": rows, "medians": summary(rows),
    }  # fmt: skip
