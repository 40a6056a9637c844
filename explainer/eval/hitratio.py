"""The needle test (ABO's hit ratio, "The Fragile Truth of Saliency: Improving LLM Input Attribution via Attention Bias
Optimization", made harder): on a needle-in-a-haystack prompt with a made-up password, how much of a method's map lies
on the needle, and how well it ranks the needle's tokens first, over the steps that write the password.

A prompt (`needle_rows`) is one user message, since the library sends one user turn: the instruction (`SYSTEM`), a
haystack of whole sentences of real prose (the shipped essays, or the contexts of a SQuAD file) cut so that the
prompt has about `length` tokens, the needle placed at the sentence boundary nearest `depth` of the haystack's
characters, then the question. The password is made up from seeded syllables and digits, so no model knows it
beforehand. The model answers greedily while the streaming methods explain it; the post-hoc ones then explain the
same answer, only where it holds the password (`evaluate_needle`). Three variants (`VARIANTS`):

- `plain`: "The secret password is X." and "What is the secret password?" (ABO's needle);
- `paraphrased`: "The code word for the vault is X." and "What is the password?": the answer cannot copy the needle's
  frame, so a map that follows the answer's own words back into the prompt finds nothing to copy;
- `contradictory`: three plain needles with different passwords (at `depth`, and 27 and 53 points after it wrapped
  into 10-90%, away from the edges a blind first-k or last-k map covers); only the needle whose password the model
  wrote is the hit, the other two are scored tokens that are not.

Scoring (`hitscore.py` has the definitions): the scored tokens are the needles and the haystack (the instruction, the
question and the chat template left out); only rows whose answer holds a password are scored, and only the answer
steps whose tokens overlap the written password; each step's map is normalised over the scored tokens before the
steps are averaged. Per row and method: `mass` (the share on the needle) and `ap` (average precision of the needle's
tokens), beside the blind maps of `hitscore.blind_maps`, and the row's chance levels. Rows are appended to a
JSON-lines file as they finish (`resumable`). Front end: `python -m explainer hitratio`.
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
from ..methods import METHODS, method_options
from ..result.segments import sentence_starts
from .evaluate import context_positions
from .haystack import method_label
from .hitscore import blind_maps, chance_ap, score
from .intervals import interval_text, mean_t, paired_t
from .resumable import measure_and_summarise

SYSTEM = "You are a helpful assistant. Read the text below and answer the question after it."
PLAIN = ("The secret password is {password}.", "Question: What is the secret password? Answer with the password only.")
VARIANTS = {  # variant -> (needle frame, question)
    "plain": PLAIN,
    "paraphrased": ("The code word for the vault is {password}.",
                    "Question: What is the password? Answer with the password only."),  # fmt: skip
    "contradictory": PLAIN,
}
NEEDLE, QUERY = PLAIN
CONTRADICTORY_OFFSETS = (0, 27, 53)  # depth points of the three contradictory needles after `depth` (`other_depth`)
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


def _haystack(tokenizer, sentences: list[str], budget: int, start: int) -> list[str]:
    """Sentences cycled from `start` until their tokens reach `budget`."""
    chosen, used = [], 0
    for sentence in itertools.islice(itertools.cycle(sentences[start:] + sentences[:start]), 100_000):
        if used >= budget:
            break
        chosen.append(sentence)
        used += len(tokenizer(" " + sentence, add_special_tokens=False)["input_ids"])
    return chosen


def _places(chosen: list[str], depths: Sequence[float]) -> list[int]:
    """The sentence boundary nearest each depth (% of the haystack's characters), in the order of `depths`: distinct
    ones while there are enough (needles that share one follow each other)."""
    bounds = np.cumsum([0, *(len(s) + 1 for s in chosen)])  # character where each sentence starts
    places: list[int] = []
    for depth in depths:
        order = np.argsort(np.abs(bounds - depth / 100 * bounds[-1]), kind="stable")
        places.append(int(next((i for i in order if i not in places), order[0])))
    return places


def other_depth(depth: int, offset: int) -> int:
    """Where a contradictory needle `offset` points after the first goes: wrapped into 10-90% (the first stays)."""
    return depth if offset == 0 else 10 + (depth - 10 + offset) % 80


def needle_row(tokenizer, sentences: list[str], length: int, depth: int, sample: int, seed: int = 0,
               variant: str = "plain") -> dict[str, Any]:  # fmt: skip
    """One needle prompt of about `length` tokens (the user message's text, before the chat template).

    Args:
        tokenizer: counts tokens (without special tokens).
        sentences: the haystack's sentences, cycled from a place that depends on `sample` (the same haystack for
            every variant and depth of a sample, and the same password for every variant: rows pair across variants).
        depth: where the (first) needle goes, in % of the haystack's characters (the nearest sentence boundary).
        variant: one of `VARIANTS`.

    Returns:
        `{"id", "variant", "prompt", "passwords", "password" (the first), "length", "depth", "spans": {"system",
        "body" (haystack and needles), "query": [start, end], "needles": [[start, end], ...]}}`, character spans in
        `prompt`, needles in the order of `passwords`.
    """
    frame, query = VARIANTS[variant]
    n = len(CONTRADICTORY_OFFSETS) if variant == "contradictory" else 1
    secrets = [password([seed, length, depth, sample, *([i] if i else [])]) for i in range(n)]
    needles = [frame.format(password=s) for s in secrets]
    fixed = len(tokenizer(f"{SYSTEM}\n\n{' '.join(needles)}\n\n{query}", add_special_tokens=False)["input_ids"])
    chosen = _haystack(tokenizer, sentences, length - fixed, int(np.random.default_rng([seed, sample]).integers(
        len(sentences))))  # fmt: skip
    depths = [other_depth(depth, CONTRADICTORY_OFFSETS[i]) for i in range(n)]
    places = _places(chosen, depths)
    pieces: list[tuple[str, int | None]] = []  # (text, needle index or None)
    for i in range(len(chosen) + 1):
        pieces += [(needles[j], j) for j in range(n) if places[j] == i]
        pieces += [(chosen[i], None)] if i < len(chosen) else []
    prompt, spans = f"{SYSTEM}\n\n", [None] * n
    body_start = len(prompt)
    for k, (text, j) in enumerate(pieces):
        prompt += (" " if k else "") + text
        if j is not None:
            spans[j] = [len(prompt) - len(text), len(prompt)]
    body_end = len(prompt)
    prompt += f"\n\n{query}"
    return {"id": f"needle:{variant}:{length}:{depth}:{sample}", "variant": variant, "prompt": prompt,
            "passwords": secrets, "password": secrets[0], "length": length, "depth": depth, "needle_depths": depths,
            "spans": {"system": [0, len(SYSTEM)], "body": [body_start, body_end],
                      "query": [len(prompt) - len(query), len(prompt)], "needles": spans}}  # fmt: skip


def needle_specs(lengths=LENGTHS, depths=DEPTHS, samples: int = 1,
                 variants: Sequence[str] = ("plain",)) -> list[tuple[int, int, int, str]]:  # fmt: skip
    """Every (length, depth, sample, variant) of a run, lengths first, then samples, then variants, then depths:
    `--limit` keeps whole sweeps over the depths, and a stopped run has every variant about equally far."""
    return [(length, depth, i, v) for length in lengths for i in range(samples) for v in variants for depth in depths]


def needle_rows(tokenizer, paragraphs: list[str], specs: Sequence[tuple], seed: int = 0) -> list[dict]:
    """The needle prompts of `specs` (see `needle_specs`; a spec without a variant is `plain`), their haystacks cut
    from `paragraphs`."""
    sentences = _sentences(paragraphs)
    return [needle_row(tokenizer, sentences, *spec[:3], seed, *spec[3:]) for spec in specs]


@dataclass
class NeedleLayout:
    """Where a needle prompt's parts lie among the model input's positions."""

    scored: list[int]  # the needles' and the haystack's tokens
    needles: list[list[int]]  # each needle's tokens (a subset of `scored`)
    question: list[int]  # the question's tokens
    n: int  # the prompt's length N, chat template included


def _overlapping(positions, chars, span) -> list[int]:
    return [p for p, (s, e) in zip(positions, chars) if s < span[1] and e > span[0]]


def needle_layout(bundle, encoded, row: dict[str, Any]) -> NeedleLayout:
    """The scored, needle and question positions of a needle prompt in its encoded model input."""
    text, chars = context_positions(bundle, encoded, row["prompt"], 0)  # the user's text tokens, their characters
    spans = row["spans"]
    needles = [_overlapping(text, chars, s) for s in spans["needles"]]  # inside the body, so scored
    return NeedleLayout(_overlapping(text, chars, spans["body"]), needles, _overlapping(text, chars, spans["query"]),
                        len(encoded.input_ids[0]))  # fmt: skip


def written(passwords: Sequence[str], tokens: Sequence[str]) -> tuple[int | None, list[int]]:
    """Which password the answer wrote first (its index, None if none) and the answer steps whose tokens overlap it.

    Args:
        passwords: the row's passwords.
        tokens: the answer's tokens as text (`Attribution.generated_tokens`).
    """
    text = "".join(tokens).lower()
    found = [(text.find(p.lower()), i) for i, p in enumerate(passwords) if p.lower() in text]
    if not found:
        return None, []
    start, index = min(found)
    end = start + len(passwords[index])
    bounds = np.cumsum([0, *(len(t) for t in tokens)])
    return index, [k for k in range(len(tokens)) if bounds[k] < end and bounds[k + 1] > start]


def needle_result(row: dict[str, Any], attr, layout: NeedleLayout) -> dict[str, Any]:
    """A needle row's result before its methods: the answer, which password it holds and the steps writing it, and
    the chance levels of the scored tokens (a uniform map's mass share and a random ranking's AP)."""
    index, steps = written(row.get("passwords", [row["password"]]), attr.generated_tokens)
    hits = layout.needles[index] if index is not None else layout.needles[0]
    n, r = len(layout.scored), len(hits)
    return {
        "id": row["id"], "variant": row.get("variant", "plain"), "length": row["length"], "depth": row["depth"],
        "n_prompt_tokens": attr.num_prompt_tokens, "answer": attr.generated_text, "found": index is not None,
        "written": index, "steps": steps, "n_scored": n, "n_hits": r, "chance": r / max(n, 1),
        "chance_ap": chance_ap(n, r) if 0 < r <= n else None, "dtype": attr.meta.get("dtype"), "methods": {},
    }  # fmt: skip


def score_maps(out: dict[str, Any], layout: NeedleLayout, maps: dict[str, np.ndarray]) -> None:
    """Each (K, N) or (N,) map's mass share and AP into `out["methods"]` (None on a row whose answer holds no
    password), keeping what is there (a method's seconds)."""
    hits = layout.needles[out["written"]] if out["found"] else []
    for label, raw in maps.items():
        got = score(raw, out["steps"], layout.scored, hits) if out["found"] else {"mass": None, "ap": None}
        out["methods"][label] = {**out["methods"].get(label, {}), **got}


def evaluate_needle(bundle, row: dict[str, Any], cfg: HitRatioConfig, answer: str | None = None) -> dict[str, Any]:
    """One needle prompt: the answer, which password it holds, and every method's and blind map's scores.

    The streaming methods (and `random`) score while the answer is written. The other post-hoc methods (Sources,
    AtMan, the gradient methods) run after the answer is known, on the same answer ids teacher-forced, and only on a
    row whose answer holds the password: a row that holds none is never scored, so its ablations and backward passes
    would be wasted (3-5 of 20 prompts here). The methods with a `steps` option (the gradient methods: a backward pass
    per step) run only for the steps that write the password, the only steps scored: the same rows at about half the
    backward passes (7 of 12 on a typical answer).

    Args:
        answer: None to answer greedily; else the answer teacher-forced (the tests plant one with the password).
    """
    t0 = time.perf_counter()
    given = {} if answer is None else {"answer": answer}
    later = [m for m in cfg.methods if m != "random" and not METHODS[m].streaming]
    first = [m for m in cfg.methods if m not in later] or ["random"]  # a request names a method: the cheapest
    attr = explain(bundle, row["prompt"], methods=first, max_new_tokens=cfg.max_new_tokens,
                   method_options=cfg.method_options, **given)  # fmt: skip
    if "random" not in cfg.methods:
        attr.methods.pop("random", None)
    layout = needle_layout(bundle, bundle.encode(row["prompt"], max_new_tokens=cfg.max_new_tokens), row)
    out = needle_result(row, attr, layout)
    if later and out["found"]:
        steps = " ".join(str(k + 1) for k in out["steps"])  # 1-based
        stepped = {m for m in later if any(o.name == "steps" for o in method_options(m))}
        options = {m: {**cfg.method_options.get(m, {}), **({"steps": steps} if m in stepped else {})} for m in later}
        second = explain(bundle, row["prompt"], methods=later, answer=list(attr.generated_token_ids),
                         max_new_tokens=cfg.max_new_tokens, method_options=options)  # fmt: skip
        attr.methods.update(second.methods)
    maps = {}
    for name, scores in attr.methods.items():
        label = method_label(name, cfg.method_options.get(name))
        maps[label] = np.asarray(scores.raw, dtype=np.float64)  # (K, N)
        out["methods"][label] = {"seconds": scores.seconds}
    score_maps(out, layout, {**maps, **blind_maps(layout.n, layout.question)})
    if not out["found"]:  # the later methods did not run: unscored, as every map of such a row
        for name in later:
            out["methods"][method_label(name, cfg.method_options.get(name))] = {"mass": None, "ap": None}
    out["seconds"], out["command"] = time.perf_counter() - t0, cfg.command
    return out


def summarise(samples: list[dict[str, Any]], compare: Sequence[tuple[str, str]] = ()) -> dict[str, Any]:
    """Per (prompt length, variant): N, the found rate, the chance levels, and per method its mass share and AP (mean,
    95% t half-width, n) over the rows whose answer holds a password; the paired differences of `compare`'s (a, b)
    methods (a - b over the rows where both are scored); the command lines that measured them. Rows of the former
    format (no "variant": the question and instruction counted as hits) are left out."""
    ok = [s for s in samples if "methods" in s and "variant" in s]
    commands = list(dict.fromkeys(c for s in ok for c in s.get("commands") or [s.get("command")] if c))  # joined files'
    out: dict[str, Any] = {"groups": {}, "commands": commands}
    for key in sorted({(s["length"], s["variant"]) for s in ok}, key=lambda k: (k[0], list(VARIANTS).index(k[1]))):
        rows = [s for s in ok if (s["length"], s["variant"]) == key]
        found = [s for s in rows if s["found"]]
        names = list(dict.fromkeys(m for s in rows for m in s["methods"]))
        methods = {n: {m: mean_t([s["methods"][n].get(m) for s in found if n in s["methods"]]) for m in ("mass", "ap")}
                   for n in names}  # fmt: skip
        paired = {}
        for a, b in compare:
            both = [s for s in found if a in s["methods"] and b in s["methods"]]
            paired[f"{a} - {b}"] = {m: paired_t([s["methods"][a][m] for s in both], [s["methods"][b][m] for s in both])
                                    for m in ("mass", "ap")}  # fmt: skip
        out["groups"][key] = {
            "n": len(rows), "found": len(found), "depths": sorted({s["depth"] for s in rows}),
            "chance": mean_t([s["chance"] for s in found]), "chance_ap": mean_t([s["chance_ap"] for s in found]),
            "methods": methods, "paired": paired,
        }  # fmt: skip
    return out


def _cell(entry: tuple[float, float, int]) -> str:
    mean, half, n = entry
    return "-" if n == 0 else interval_text(mean, half)


def format_table(summary: dict[str, Any]) -> str:
    """Per (length, variant): each method's mass share and AP, mean ± 95% t half-width, the chance levels, N, the found
    rate and the paired differences asked for."""
    lines = ["Needle test: mass share and average precision of the needle's tokens over the needle and haystack tokens",
             "(steps writing the password, rows whose answer holds it; mean ± 95% t half-width)"]  # fmt: skip
    for (length, variant), g in summary["groups"].items():
        w = max([18, *(len(n) + 2 for n in g["methods"])])
        lines += ["", f"~{length} tokens, {variant}: N = {g['n']}, answer holds the password in {g['found']} "
                  f"({100 * g['found'] / max(g['n'], 1):.0f}%), depths {g['depths']}",
                  f"{'method':<{w}}{'mass share':>20}{'AP':>20}{'n':>5}"]  # fmt: skip
        for name, e in g["methods"].items():
            lines.append(f"{name:<{w}}{_cell(e['mass']):>20}{_cell(e['ap']):>20}{e['mass'][2]:>5}")
        lines.append(f"{'chance':<{w}}{_cell(g['chance']):>20}{_cell(g['chance_ap']):>20}")
        for pair, e in g["paired"].items():
            lines.append(f"{'paired ' + pair:<{w}}{_cell(e['mass']):>20}{_cell(e['ap']):>20}{e['mass'][2]:>5}")
    lines += ["", *(f"command: {c}" for c in summary.get("commands", []))]
    return "\n".join(lines)


def run_hitratio(
    bundle,
    rows: list[dict[str, Any]],
    cfg: HitRatioConfig,
    results_path: str | Path | None = None,
    log: Callable[[str], None] | None = None,
    compare: Sequence[tuple[str, str]] = (),
) -> dict[str, Any]:
    """Evaluate every row not yet in `results_path` (appending each), and summarise all of them (with the paired
    differences of `compare`)."""
    measure = lambda row: evaluate_needle(bundle, row, cfg)  # noqa: E731
    return measure_and_summarise(rows, measure, lambda s: summarise(s, compare), results_path, bundle.model, log)
