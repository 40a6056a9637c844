"""ABO's hit ratio ("The Fragile Truth of Saliency: Improving LLM Input Attribution via Attention Bias Optimization"):
on a needle-in-a-haystack prompt with a made-up password, the share of a method's positive saliency that falls on
the system prompt, the needle and the query, averaged over needle depths.

A prompt (`needle_rows`) is one user message, since the library sends one user turn: the system prompt's text
(`SYSTEM`) leads it, then a haystack of whole sentences of real prose (the shipped essays, or the contexts of a SQuAD
file) cut so that the prompt has about `length` tokens, with the needle ("The secret password is ...") placed at the
sentence boundary nearest `depth` of the haystack's characters, then the query (`QUERY`). The password is made up from
seeded syllables and digits, so no model knows it beforehand. The model answers greedily while the methods explain it.

A method's map is the sum of its raw scores over the answer's content steps (a trailing end-of-sequence token left
out): the same whole-answer surrogate as for LDS (`lds.py`). Its hit ratio is `lds.hit_ratio` over the user's text
tokens (chat-template tokens left out): positive scores on the system prompt, needle and query tokens over positive
scores on all of them. Per row we keep it with the row's chance level (the hit tokens' share of the text tokens, what
a uniform map gets) and whether the answer holds the password. Rows are appended to a JSON-lines file as they finish
(`resumable`). Front end: `python -m explainer hitratio`.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..explain import explain
from ..result.segments import sentence_starts
from ..result.steps import last_content_step
from .evaluate import context_positions
from .haystack import method_label
from .lds import hit_ratio
from .metrics import mean_ci
from .resumable import measure_and_summarise

SYSTEM = "You are a helpful assistant. Read the text below and answer the question after it."
NEEDLE = "The secret password is {password}."
QUERY = "Question: What is the secret password? Answer with the password only."
LENGTHS = (1024, 4096)  # prompt tokens (ABO's 1k and 4k)
DEPTHS = (10, 30, 50, 70, 90)  # needle depth, % of the haystack
_SYLLABLES = "ka lo mi ru ze ta vo ni pe su ga ri do fe ly xo".split()


@dataclass
class HitRatioConfig:
    methods: tuple[str, ...] = ("macs", "rollout", "random")
    max_new_tokens: int = 16  # a password and an end-of-sequence token
    method_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    command: str | None = None  # the command line that runs it, kept in every row for the report


def password(seed: Sequence[int]) -> str:
    """A made-up password: three seeded syllables and four digits, e.g. "Vorumi-4821"."""
    rng = np.random.default_rng(list(seed))
    word = "".join(rng.choice(_SYLLABLES, 3))
    return f"{word.capitalize()}-{int(rng.integers(1000, 10000))}"


def _sentences(paragraphs: list[str]) -> list[str]:
    """Every sentence of the paragraphs, in order, stripped."""
    out = []
    for text in paragraphs:
        cuts = [0, *sentence_starts(text), len(text)]
        out += [text[a:b].strip() for a, b in zip(cuts, cuts[1:]) if text[a:b].strip()]
    return out


def needle_row(tokenizer, sentences: list[str], length: int, depth: int, sample: int, seed: int = 0) -> dict[str, Any]:
    """One needle prompt of about `length` tokens (the user message's text, before the chat template).

    Args:
        tokenizer: counts tokens (without special tokens).
        sentences: the haystack's sentences, cycled from a place that depends on `sample`.
        depth: where the needle goes, in % of the haystack's characters (the nearest sentence boundary).

    Returns:
        `{"id", "prompt", "password", "length", "depth", "spans": {"system", "needle", "query": [start, end]}}`,
        character spans in `prompt`.
    """
    secret = password([seed, length, depth, sample])
    needle = NEEDLE.format(password=secret)
    fixed = len(tokenizer(f"{SYSTEM}\n\n{needle}\n\n{QUERY}", add_special_tokens=False)["input_ids"])
    start = int(np.random.default_rng([seed, sample]).integers(len(sentences)))
    chosen, used = [], fixed
    for sentence in itertools.islice(itertools.cycle(sentences[start:] + sentences[:start]), 100_000):
        if used >= length:
            break
        chosen.append(sentence)
        used += len(tokenizer(" " + sentence, add_special_tokens=False)["input_ids"])
    bounds = np.cumsum([0, *(len(s) + 1 for s in chosen)])  # character where each sentence starts
    where = int(np.argmin(np.abs(bounds - depth / 100 * bounds[-1])))  # the boundary nearest the depth
    before, after = " ".join(chosen[:where]), " ".join(chosen[where:])
    head = f"{SYSTEM}\n\n" + (f"{before} " if before else "")
    prompt = head + needle + (f" {after}" if after else "") + f"\n\n{QUERY}"
    spans = {"system": [0, len(SYSTEM)], "needle": [len(head), len(head) + len(needle)],
             "query": [len(prompt) - len(QUERY), len(prompt)]}  # fmt: skip
    return {"id": f"needle:{length}:{depth}:{sample}", "prompt": prompt, "password": secret, "length": length,
            "depth": depth, "spans": spans}  # fmt: skip


def needle_specs(lengths=LENGTHS, depths=DEPTHS, samples: int = 1) -> list[tuple[int, int, int]]:
    """Every (length, depth, sample) of a run, lengths first, then samples, then depths: `--limit` keeps whole sweeps
    over the depths."""
    return [(length, depth, i) for length in lengths for i in range(samples) for depth in depths]


def needle_rows(tokenizer, paragraphs: list[str], specs: Sequence[tuple[int, int, int]], seed: int = 0) -> list[dict]:
    """The needle prompts of `specs` (see `needle_specs`), their haystacks cut from `paragraphs`."""
    sentences = _sentences(paragraphs)
    return [needle_row(tokenizer, sentences, length, depth, i, seed) for length, depth, i in specs]


def needle_positions(bundle, encoded, row: dict[str, Any]) -> tuple[list[int], list[int]]:
    """The user's text tokens of a needle prompt (chat-template tokens left out) and those of them on the system
    prompt, the needle or the query: what `lds.hit_ratio` shares the saliency over and what it counts as hits."""
    text, chars = context_positions(bundle, encoded, row["prompt"], 0)  # the user's text tokens, their characters
    hits = [p for p, (s, e) in zip(text, chars) if any(s < b and e > a for a, b in row["spans"].values())]
    return text, hits


def needle_result(row: dict[str, Any], attr, text: list[int], hits: list[int]) -> dict[str, Any]:
    """A needle row's result before its methods: the answer, whether it holds the password, the chance level."""
    return {
        "id": row["id"], "length": row["length"], "depth": row["depth"], "n_prompt_tokens": attr.num_prompt_tokens,
        "answer": attr.generated_text, "found": row["password"].lower() in attr.generated_text.lower(),
        "chance": len(hits) / max(len(text), 1), "dtype": attr.meta.get("dtype"), "methods": {},
    }  # fmt: skip


def evaluate_needle(bundle, row: dict[str, Any], cfg: HitRatioConfig) -> dict[str, Any]:
    """One needle prompt: the answer, whether it holds the password, and every method's hit ratio."""
    t0 = time.perf_counter()
    attr = explain(bundle, row["prompt"], methods=list(cfg.methods), max_new_tokens=cfg.max_new_tokens,
                   method_options=cfg.method_options)  # fmt: skip
    text, hits = needle_positions(bundle, bundle.encode(row["prompt"], max_new_tokens=cfg.max_new_tokens), row)
    k = (last_content_step(attr) or 0) + 1
    out = needle_result(row, attr, text, hits)
    for name, scores in attr.methods.items():
        whole = np.nan_to_num(np.asarray(scores.raw[:k], dtype=np.float64)).sum(axis=0)  # (N,) the answer's map
        label = method_label(name, cfg.method_options.get(name))
        out["methods"][label] = {"hit_ratio": hit_ratio(whole, hits, text), "seconds": scores.seconds}
    out["seconds"], out["command"] = time.perf_counter() - t0, cfg.command
    return out


def summarise(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Per prompt length: N, the found rate, the chance level, and per method the hit ratio (mean, 95% half-width,
    n) over its rows (every depth, so the mean is over depths); and the command lines that measured them."""
    ok = [s for s in samples if "methods" in s]
    commands = list(dict.fromkeys(c for s in ok for c in s.get("commands") or [s.get("command")] if c))  # joined files'
    out: dict[str, Any] = {"lengths": {}, "commands": commands}
    for length in sorted({s["length"] for s in ok}):
        rows = [s for s in ok if s["length"] == length]
        names = list(dict.fromkeys(m for s in rows for m in s["methods"]))
        methods = {}
        for name in names:
            values = [s["methods"][name]["hit_ratio"] for s in rows if name in s["methods"]]
            defined = [v for v in values if v is not None]
            methods[name] = (*mean_ci(defined), len(defined))
        out["lengths"][length] = {
            "n": len(rows), "depths": sorted({s["depth"] for s in rows}),
            "found": float(np.mean([s["found"] for s in rows])), "chance": mean_ci([s["chance"] for s in rows]),
            "methods": methods,
        }  # fmt: skip
    return out


def format_table(summary: dict[str, Any]) -> str:
    """Hit ratio per method (rows) and prompt length (columns), mean ± 95% half-width, with N, depths and chance."""
    lengths = summary["lengths"]
    names = list(dict.fromkeys(m for e in lengths.values() for m in e["methods"]))
    w = max([14, *(len(n) + 2 for n in names)])
    lines = ["Hit ratio (ABO): share of positive saliency on the system prompt, the needle and the query", ""]
    lines.append(f"{'method':<{w}}" + "".join(f"{f'~{length} tokens':>24}" for length in lengths))
    for name in names:
        cells = ""
        for e in lengths.values():
            mean, half, n = e["methods"].get(name, (float("nan"), float("nan"), 0))
            cells += f"{'-' if n == 0 else f'{mean:.3f} ± {half:.3f}':>24}"
        lines.append(f"{name:<{w}}{cells}")
    lines.append(f"{'chance':<{w}}" + "".join(f"{e['chance'][0]:>24.3f}" for e in lengths.values()))
    lines += ["", "N (prompts), needle depths (%), answers holding the password:"]
    for length, e in lengths.items():
        lines.append(f"  ~{length} tokens: N = {e['n']}, depths {e['depths']}, found {100 * e['found']:.0f}%")
    lines += ["", *(f"command: {c}" for c in summary.get("commands", []))]
    return "\n".join(lines)


def run_hitratio(
    bundle,
    rows: list[dict[str, Any]],
    cfg: HitRatioConfig,
    results_path: str | Path | None = None,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Evaluate every row not yet in `results_path` (appending each), and summarise all of them."""
    measure = lambda row: evaluate_needle(bundle, row, cfg)  # noqa: E731
    return measure_and_summarise(rows, measure, summarise, results_path, bundle.model, log)
