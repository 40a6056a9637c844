"""Long-context source finding: does a method's top sentence hold the answer, in a haystack of paragraphs?

Prompts come from `datasets.haystack_rows`: a SQuAD question's own paragraph among 9 paragraphs of other articles
(~1,500-2,000 tokens). The model answers the MACS paper's QA prompt (`evaluate.QA_PROMPT`) greedily while the methods
explain it. A method's map over the answer is the mean of its per-step z-scores over the answer's content steps
(a trailing end-of-sequence token left out), re-standardised over the context tokens; the context's sentences
(`segments.sentence_groups`, as in the app's sentence view) are ranked by the mean score of their tokens. Per sample
and method:

- `sentence_hit`: the top sentence holds the (first) gold answer: one of its tokens overlaps the answer's characters;
- `paragraph_hit`: the top sentence lies in the gold paragraph (most of its characters);
- `sentence_hit3`: the sentence holding the answer is among the top 3.

The chance levels of a sample (one sentence out of `n_sentences`; the gold paragraph's share of them) are kept too,
and `random` is the empirical baseline. Rates come with 95% Wilson intervals. Rows are appended to a JSON-lines file
as they finish, so a stopped run resumes (`resumable`). Front end: `python -m explainer haystack`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError
from ..explain import explain
from ..result.segments import Group, sentence_groups
from ..result.spans import group_scores, span_scores
from ..result.steps import last_content_step
from .evaluate import context_positions, qa_prompt
from .resumable import check_joinable, measure_and_summarise

HITS = ("sentence_hit", "paragraph_hit", "sentence_hit3")


@dataclass
class HaystackConfig:
    methods: tuple[str, ...] = ("macs", "rollout", "random")
    max_new_tokens: int = 16  # SQuAD answers are short; the prompt asks for a short response
    method_options: dict[str, dict[str, Any]] = field(default_factory=dict)


def _overlaps(spans: Sequence[tuple[int, int]], start: int, end: int) -> bool:
    return any(s < end and e > start for s, e in spans)


def _inside(spans: Sequence[tuple[int, int]], start: int, end: int) -> float:
    """The share of the characters of `spans` that lie in [start, end)."""
    total = sum(e - s for s, e in spans)
    inside = sum(max(0, min(e, end) - max(s, start)) for s, e in spans)
    return inside / total if total else 0.0


def rank_sentences(
    z: np.ndarray, sentences: list[Group], char_spans: dict[int, tuple[int, int]], row: dict[str, Any]
) -> dict[str, Any]:
    """Hits of one method's map for one haystack row.

    Args:
        z: (N,) token scores (NaN where none), e.g. `span_scores` over the context positions.
        sentences: the context's sentence groups (other kinds are not ranked).
        char_spans: prompt position -> its characters in the row's context.
        row: the haystack row (`answers`, `gold_paragraph`).

    Returns:
        `{"sentence_hit", "paragraph_hit", "sentence_hit3", "top": the top sentence's text, "gold_rank": 1-based rank
        of the sentence holding the answer (None if no sentence holds it)}`.
    """
    ranked = [g for g in sentences if g.kind == "sentence"]
    scores = group_scores(z, ranked)  # (G,)
    order = [i for i in np.argsort(-np.nan_to_num(scores, nan=-np.inf), kind="stable") if math.isfinite(scores[i])]
    spans = [[char_spans[p] for p in g.positions if p in char_spans] for g in ranked]
    answer = row["answers"][0]
    a_start, a_end = answer["answer_start"], answer["answer_start"] + len(answer["text"])
    holds = [_overlaps(s, a_start, a_end) for s in spans]
    rank = next((r for r, i in enumerate(order, start=1) if holds[i]), None)
    if not order:
        return {"sentence_hit": False, "paragraph_hit": False, "sentence_hit3": False, "top": None, "gold_rank": rank}
    top = order[0]
    return {
        "sentence_hit": bool(holds[top]),
        "paragraph_hit": _inside(spans[top], *row["gold_paragraph"]) > 0.5,
        "sentence_hit3": rank is not None and rank <= 3,
        "top": ranked[top].text,
        "gold_rank": rank,
    }


def method_label(name: str, options: dict[str, Any] | None) -> str:
    """A method's key in the results: its name, with the options given as on the command line
    (`sources:scope=all`), so variants of one method run into separate files join as separate rows."""
    return ":".join([name, *(f"{k}={v}" for k, v in (options or {}).items())])


def evaluate_haystack_sample(bundle, row: dict[str, Any], cfg: HaystackConfig) -> dict[str, Any]:
    """One haystack row: the answer, and every method's hits (one JSON-able dict)."""
    t0 = time.perf_counter()
    prompt, context_start = qa_prompt(row)
    attr = explain(
        bundle, prompt, methods=list(cfg.methods), max_new_tokens=cfg.max_new_tokens,
        method_options=cfg.method_options,
    )  # fmt: skip
    encoded = bundle.encode(prompt, max_new_tokens=cfg.max_new_tokens)
    positions, spans = context_positions(bundle, encoded, prompt, context_start)
    if not positions or attr.num_steps == 0:
        raise InputError(f"Row {row['id']!r}: no context tokens or no answer.")
    char_spans = dict(zip(positions, spans))
    sentences = sentence_groups(attr.prompt_tokens, positions)
    last = last_content_step(attr)
    in_gold = [g for g in sentences if g.kind == "sentence"]
    share = [_inside([char_spans[p] for p in g.positions], *row["gold_paragraph"]) > 0.5 for g in in_gold]
    out: dict[str, Any] = {
        "id": row["id"], "answer": attr.generated_text, "n_prompt_tokens": attr.num_prompt_tokens,
        "n_context_tokens": len(positions), "n_sentences": len(in_gold), "n_gold_paragraph_sentences": sum(share),
        "dtype": attr.meta.get("dtype"), "methods": {},
    }  # fmt: skip
    for name, scores in attr.methods.items():
        z = span_scores(attr, name, 0, last, positions)  # (N,), over the context tokens
        label = method_label(name, cfg.method_options.get(name))
        out["methods"][label] = {**rank_sentences(z, sentences, char_spans, row), "seconds": scores.seconds}
    out["seconds"] = time.perf_counter() - t0
    return out


def merge_rows(files: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Rows of several results files joined by prompt id: methods run separately on the same prompts (e.g. Sources
    later) become one row per prompt; only prompts every file finished are kept, so the methods are compared on the
    same prompts.

    Raises:
        InputError: two files disagree on a prompt's precision, answer or prompt length (`resumable.check_joinable`).
    """
    merged: dict[str, dict[str, Any]] = {}
    for i, rows in enumerate(files):
        for row in rows:
            if "methods" not in row:
                continue
            seen = merged.get(row["id"])
            if seen is None:
                merged[row["id"]] = {**row, "methods": dict(row["methods"]), "files": {i}}
            else:
                check_joinable(seen, row)
                seen["methods"].update(row["methods"])
                seen["files"].add(i)
    return [{k: v for k, v in r.items() if k != "files"} for r in merged.values() if len(r["files"]) == len(files)]


def wilson(hits: int, n: int, z: float = 1.96) -> tuple[float, float, float]:
    """(rate, low, high): the 95% Wilson score interval of a proportion (nan when n = 0)."""
    if n == 0:
        return float("nan"), float("nan"), float("nan")
    p = hits / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return p, centre - half, centre + half


def summarise(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """`{"n", "chance": {...}, "methods": {name: {hit: (rate, low, high), ...}}}` over finished samples."""
    ok = [s for s in samples if "methods" in s]
    names = list(dict.fromkeys(m for s in ok for m in s["methods"]))
    methods = {}
    for name in names:
        rows = [s["methods"][name] for s in ok if name in s["methods"]]
        methods[name] = {hit: wilson(sum(bool(r[hit]) for r in rows), len(rows)) for hit in HITS}
        methods[name]["n"] = len(rows)
    chance = {
        "sentence_hit": float(np.mean([1 / s["n_sentences"] for s in ok])) if ok else float("nan"),
        "paragraph_hit": float(np.mean([s["n_gold_paragraph_sentences"] / s["n_sentences"] for s in ok]))
        if ok
        else float("nan"),
    }
    return {"n": len(ok), "chance": chance, "methods": methods}


def format_table(summary: dict[str, Any]) -> str:
    """The results table: per method, each hit rate with its 95% interval, and the chance levels."""
    head = f"N = {summary['n']} haystack prompts; rates with 95% Wilson intervals"
    w = max([14, *(len(name) + 2 for name in summary["methods"])])  # method names with options are long
    lines = [head, "", f"{'method':<{w}}{'top sentence holds answer':>30}{'top sentence in gold paragraph':>34}"
             f"{'answer sentence in top 3':>30}"]  # fmt: skip
    for name, e in summary["methods"].items():
        cells = "".join(
            f"{f'{100 * e[h][0]:.1f}% [{100 * e[h][1]:.1f}, {100 * e[h][2]:.1f}]':>{w}}"
            for h, w in zip(HITS, (30, 34, 30))
        )
        lines.append(f"{name:<{w}}{cells}")
    sentence, paragraph = (f"{100 * summary['chance'][h]:.1f}%" for h in ("sentence_hit", "paragraph_hit"))
    lines.append(f"{'chance':<{w}}{sentence:>30}{paragraph:>34}")
    return "\n".join(lines)


def run_haystack(
    bundle,
    rows: list[dict[str, Any]],
    cfg: HaystackConfig,
    results_path: str | Path | None = None,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Evaluate every row not yet in `results_path` (appending each), and summarise all of them."""
    measure = lambda row: evaluate_haystack_sample(bundle, row, cfg)  # noqa: E731
    return measure_and_summarise(rows, measure, summarise, results_path, bundle.model, log)
