"""How far a method's maps in a low precision (bfloat16, float16) are from its float32 maps on the same model.

For every prompt the float32 model answers greedily while each method explains its tokens; the low-precision model
is then teacher-forced on exactly those answer tokens (`explain(..., answer=<token ids>)`), so both explain the same
K steps over the same N prompt tokens. Letting it generate instead would compare maps of different answers once the
greedy paths part. Per step and method, the two raw score rows are compared by

- Spearman's rank correlation (Spearman, 1904), with tied scores given their average rank: the Pearson
  correlation of the two rank vectors. Undefined (None) when either row is constant.
- the top-k overlap |top_k(float32) ∩ top_k(low)|, k = `TOP_K`: how many of the k tokens a reader sees first both
  maps share. Ties are broken by position (the earlier token first).

Both are computed over all prompt tokens and, separately, over the user's own text (no chat template tokens). One
JSON line per prompt keeps the per-step values (`measure_prompt`); `summarise` and `format_table` pool the steps of
all prompts per method. The command line is `python -m explainer agreement` (`explainer/cli/agreement.py`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ExplainerError, InputError
from ..explain import explain
from ..runtime.precision import precision_meta
from .evaluate import qa_prompt
from .metrics import spearman
from .resumable import ResultsLog, read_results

TOP_K = 5
GOOD_OVERLAP = 4  # a step whose top-5 sets share at least this many tokens counts as agreeing
EXAMPLES_FILE = Path(__file__).resolve().parents[2] / "assets" / "examples.json"  # the app's example prompts
POSITIONS = ("prompt", "user")  # the token sets the rows are compared over


def top_k(x: np.ndarray, k: int = TOP_K) -> list[int]:
    """Positions of the k highest finite values of `x` (n,), highest first; ties go to the earlier position."""
    x = np.asarray(x, dtype=np.float64)
    finite = np.flatnonzero(np.isfinite(x))
    order = finite[np.argsort(-x[finite], kind="stable")]
    return order[:k].tolist()


def top_k_overlap(a: np.ndarray, b: np.ndarray, k: int = TOP_K) -> int:
    """|top_k(a) ∩ top_k(b)| over the positions where both rows (n,) are finite (k is cut to their number)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    both = np.isfinite(a) & np.isfinite(b)
    a, b = np.where(both, a, np.nan), np.where(both, b, np.nan)
    return len(set(top_k(a, k)) & set(top_k(b, k)))


def compare_rows(reference: np.ndarray, other: np.ndarray, positions: Sequence[int] | None = None) -> dict[str, list]:
    """Per-step Spearman and top-k overlap of two score matrices (K, N), over `positions` (None: all N).

    Returns:
        {"spearman": [K floats or None], "top5": [K ints]} (the key names `TOP_K`).
    """
    reference, other = np.asarray(reference), np.asarray(other)
    if reference.shape != other.shape:
        raise ValueError(f"score matrices differ in shape: {reference.shape} vs {other.shape}")
    if positions is not None:
        reference, other = reference[:, list(positions)], other[:, list(positions)]
    return {
        "spearman": [spearman(r, o) for r, o in zip(reference, other)],
        f"top{TOP_K}": [top_k_overlap(r, o) for r, o in zip(reference, other)],
    }


def summarise(rows: list[dict[str, Any]], positions: str = "prompt") -> dict[str, dict[str, Any]]:
    """Per method, over the steps of all rows: median and 25th percentile of Spearman (defined steps), median top-5
    overlap, the fraction of steps with overlap >= `GOOD_OVERLAP`, and the numbers of prompts, steps and steps
    without a Spearman value (a constant row).

    Args:
        rows: results of `measure_prompt` (rows with an "error" are left out).
        positions: "prompt" (all prompt tokens) or "user" (the user's text).
    """
    if positions not in POSITIONS:
        raise InputError(f"positions must be one of {', '.join(POSITIONS)}, got {positions!r}.")
    key = "methods" if positions == "prompt" else "user_methods"
    out: dict[str, dict[str, Any]] = {}
    names = list(dict.fromkeys(m for r in rows if "error" not in r for m in r.get(key, {})))
    for name in names:
        per_prompt = [r[key][name] for r in rows if "error" not in r and name in r.get(key, {})]
        rho = [v for p in per_prompt for v in p["spearman"]]
        overlap = np.array([v for p in per_prompt for v in p[f"top{TOP_K}"]], dtype=np.float64)
        defined = np.array([v for v in rho if v is not None], dtype=np.float64)
        out[name] = {
            "median_spearman": float(np.median(defined)) if defined.size else None,
            "p25_spearman": float(np.percentile(defined, 25)) if defined.size else None,
            "median_top5": float(np.median(overlap)) if overlap.size else None,
            "frac_top5_good": float((overlap >= GOOD_OVERLAP).mean()) if overlap.size else None,
            "prompts": len(per_prompt),
            "steps": len(rho),
            "undefined": len(rho) - int(defined.size),
        }
    return out


def format_table(summary: dict[str, dict[str, Any]]) -> str:
    """A Markdown table, one row per method, of `summarise`'s figures."""

    def cell(value: float | None, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    lines = [
        f"| method | median Spearman | 25th pct Spearman | median top-{TOP_K} overlap | steps with overlap ≥ "
        f"{GOOD_OVERLAP} | prompts | steps | steps without Spearman |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, s in summary.items():
        good = cell(None if s["frac_top5_good"] is None else 100 * s["frac_top5_good"], ".1f")
        lines.append(
            f"| {name} | {cell(s['median_spearman'], '.4f')} | {cell(s['p25_spearman'], '.4f')} | "
            f"{cell(s['median_top5'], '.1f')} | {good}{'%' if good != '-' else ''} | {s['prompts']} | {s['steps']} | "
            f"{s['undefined']} |"
        )
    return "\n".join(lines)


@dataclass
class AgreementConfig:
    methods: tuple[str, ...] = ("macs", "rollout", "atman", "attnlrp", "grad_ellm", "input_x_gradient")
    max_new_tokens: int = 64  # as `eval`
    method_options: dict[str, dict[str, Any]] = field(default_factory=dict)


def example_prompts(path: Path = EXAMPLES_FILE) -> list[dict[str, str]]:
    """The app's text example prompts as rows {id: "example:<i>", source: "example", prompt} (image ones left out).

    Raises:
        InputError: the file cannot be read or holds no list of examples.
    """
    try:
        examples = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(f"Cannot read the example prompts {str(path)!r}: {e.__class__.__name__}: {e}") from e
    if not isinstance(examples, list):
        raise InputError(f"{str(path)!r} holds no list of examples.")
    return [
        {"id": f"example:{i}", "source": "example", "prompt": str(e["prompt"])}
        for i, e in enumerate(examples)
        if isinstance(e, dict) and e.get("prompt") and not e.get("image")
    ]


def squad_prompts(rows: list[dict[str, Any]]) -> list[dict[str, str]]:
    """SQuAD rows (`evaluate.load_squad`) as prompt rows {id, source: "squad", prompt}, with `eval`'s QA prompt."""
    return [{"id": str(r["id"]), "source": "squad", "prompt": qa_prompt(r)[0]} for r in rows]


def measure_prompt(reference, low, prompt: str, cfg: AgreementConfig) -> dict[str, Any]:
    """Explain `prompt` with the float32 bundle `reference` (generating), then with `low` teacher-forced on the same
    answer tokens, and compare every method's rows step by step (`compare_rows`).

    Returns:
        {"reference_dtype", "dtype", "prompt_tokens", "answer", "answer_tokens", "methods": {name: {"spearman",
        "top5"}}, "user_methods": the same over the user's text, "seconds": {"reference", "low"}}.
    """
    options = dict(methods=list(cfg.methods), max_new_tokens=cfg.max_new_tokens, method_options=cfg.method_options)
    t0 = time.perf_counter()
    ref = explain(reference, prompt, **options)
    t1 = time.perf_counter()
    other = explain(low, prompt, answer=list(ref.generated_token_ids), **options)
    t2 = time.perf_counter()
    if other.prompt_token_ids != ref.prompt_token_ids or other.generated_token_ids != ref.generated_token_ids:
        raise ExplainerError("The two models tokenised the prompt or the answer differently; they cannot be compared.")
    user = ref.user_positions or None
    return {
        "reference_dtype": ref.meta.get("dtype"),
        "dtype": other.meta.get("dtype"),
        "prompt_tokens": ref.num_prompt_tokens,
        "answer": ref.generated_text,
        "answer_tokens": ref.num_steps,
        "methods": {m: compare_rows(ref.methods[m].raw, other.methods[m].raw) for m in ref.methods},
        "user_methods": {m: compare_rows(ref.methods[m].raw, other.methods[m].raw, user) for m in ref.methods},
        "seconds": {"reference": t1 - t0, "low": t2 - t1},
    }


def run_agreement(
    reference,
    low,
    prompts: list[dict[str, str]],
    cfg: AgreementConfig,
    results_path: str | Path | None = None,
    log: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """Measure every prompt not yet in `results_path` (a JSON-lines file, appended one row per prompt, so a rerun
    resumes), and return the rows of all `prompts`.

    Raises:
        InputError: `results_path` holds rows of another model or precision pair.
    """
    expected = {"model": low.name, "reference_dtype": _dtype(reference), "dtype": _dtype(low)}
    done = {r["id"]: r for r in read_results(results_path) if "id" in r}
    for r in done.values():
        differing = {k: r[k] for k, v in expected.items() if k in r and r[k] != v}
        if differing:
            raise InputError(
                f"{str(results_path)!r} holds results of {differing}, this run is {expected}: write to another "
                "--results file."
            )
    todo = [p for p in prompts if p["id"] not in done]
    if log and len(todo) < len(prompts):
        log(f"resuming: {len(prompts) - len(todo)} of {len(prompts)} prompts already in {results_path}")
    results = ResultsLog(results_path, len(todo), log)
    for p in todo:
        try:
            row = {"id": p["id"], "source": p["source"], **expected, **measure_prompt(reference, low, p["prompt"], cfg)}
        except ExplainerError as e:
            row = {"id": p["id"], "source": p["source"], **expected, "error": str(e)}
        done[p["id"]] = row
        results.add(row)
    return [done[p["id"]] for p in prompts if p["id"] in done]


def _dtype(bundle) -> str | None:
    return precision_meta(bundle.model).get("dtype")
