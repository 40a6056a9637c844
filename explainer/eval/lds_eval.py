"""LDS and top-k log-probability drop of every method on SQuAD rows, with the context's sentences as sources.

For every row the model answers the MACS paper's QA prompt (`evaluate.QA_PROMPT`) greedily while the methods explain
it. The response is the answer's content tokens (a trailing end-of-sequence token left out, as AT2 leaves it out);
the sources are the context's sentences (`segments.sentence_groups`, as in the app's sentence view and the haystack
test). Then, per row (`lds.py` has the definitions and the choice of sentence scores):

- 32 random ablation masks over the sentences (each kept with probability 1/2, seeded by `seed` and the row's id);
  the removed sentences' tokens are taken out of the prompt and the response's token log-probabilities measured
  (`ablate.response_logprobs`);
- `lds`: Spearman over the masks of the response's log-probability against the method's prediction (the sum of the
  kept sentences' scores, summed over the answer's steps); `lds_token`: the same per answer token, its own
  log-probability against the method's scores at its step, averaged over the row's tokens;
- `drop@k` (k = 1, 3, 5): log p(response) with every sentence minus with the method's k best sentences removed;
  `drop_token@k`: per answer token, ranked by its step's scores, averaged over the row's tokens. A row with fewer
  than k sentences removes all of them.

Every method is scored twice, on the same masks and measurements: `lds` / `lds_token` with its raw scores, and
`lds_centred` / `lds_token_centred` with each step's scores centred over the context tokens first (`lds.centred`), which
takes out the length prior that a positive map gets for free (`lds.py` says why, and which scale enters). The top-k
drops rank the raw scores. Rows of earlier runs carry a pseudo-method `random (zero-mean)` instead. Intervals use the t
quantile (`intervals.mean_t`). Rows are appended to a JSON-lines file as they finish (`resumable`), one results file per
rank under `torchrun` (`parallel`). Front end: `python -m explainer lds`.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import InputError
from ..explain import explain
from ..result.segments import sentence_groups
from ..result.steps import last_content_step
from .ablate import response_logprobs
from .evaluate import context_positions, qa_prompt
from .haystack import method_label
from .intervals import interval_text, mean_t, paired_t
from .lds import (
    KEEP_PROBABILITY,
    MASKS,
    TOP_K,
    ablation_masks,
    centred,
    centred_predictions,
    lds,
    lds_per_token,
    predictions,
    source_scores,
    top_sources,
    without,
)
from .resumable import measure_and_summarise


@dataclass
class LdsConfig:
    methods: tuple[str, ...] = ("macs", "rollout", "random")
    max_new_tokens: int = 16  # SQuAD answers are short; the reference protocol uses answers of up to 16 tokens
    masks: int = MASKS  # ablation masks per row (ContextCite, AT2)
    keep: float = KEEP_PROBABILITY  # each sentence kept with this probability
    top_k: tuple[int, ...] = TOP_K
    seed: int = 0  # with the row's id, seeds its masks
    batch_size: int = 0  # most removal runs per forward; 0: from the device
    method_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    command: str | None = None  # the command line that runs it, kept in every row for the report


class _Runs:
    """The distinct keep masks a row needs (over the N prompt tokens), each measured once."""

    def __init__(self, sentences: list[list[int]], n: int) -> None:
        self.sentences, self.n = sentences, n
        self.index: dict[bytes, int] = {}
        self.rows: list[np.ndarray] = []

    def add(self, kept_sources: np.ndarray) -> int:
        """The run keeping these sentences (S,) bool; every token outside the sentences stays."""
        tokens = np.ones(self.n, dtype=bool)
        for s, positions in enumerate(self.sentences):
            if not kept_sources[s]:
                tokens[positions] = False
        key = tokens.tobytes()
        if key not in self.index:
            self.index[key] = len(self.rows)
            self.rows.append(tokens)
        return self.index[key]


def _mean(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return float(np.mean(known)) if known else None


def method_plan(scores: np.ndarray, masks: np.ndarray, mask_runs: list[int], runs: _Runs, cfg: LdsConfig,
                centred_scores: np.ndarray | None = None) -> dict:  # fmt: skip
    """What one method's entries of a row need: its scores, the masks' runs and the removal runs of its top-k drops
    (added to `runs`); `method_entries` turns it into the entries once the runs are measured.

    Args:
        scores: (K, S) the method's sentence scores at each response step.
        masks: (M, S) the row's ablation masks; mask_runs: their run indices.
        centred_scores: (K, S) its sentence scores from centred token scores, for the centred LDS (None: none).

    Returns:
        {"whole": (S,) scores summed over steps, "scores", "centred", "masks", "mask_runs", "top": {k: (whole-answer
        run, [run per step])}}.
    """
    whole = scores.sum(axis=0)  # (S,)
    s = scores.shape[1]
    top = {
        k: (runs.add(without(s, top_sources(whole, k))), [runs.add(without(s, top_sources(row, k))) for row in scores])
        for k in cfg.top_k
    }
    return {"whole": whole, "scores": scores, "centred": centred_scores, "masks": masks, "mask_runs": mask_runs,
            "top": top}  # fmt: skip


def method_entries(plan: dict, logp: np.ndarray) -> dict[str, Any]:
    """A method's LDS and top-k drops from the measured log-probabilities `logp` (runs, K); run 0 keeps everything."""
    actual = logp[plan["mask_runs"]]  # (M, K)
    out: dict[str, Any] = {
        "lds": lds(actual.sum(axis=1), predictions(plan["masks"], plan["whole"])),
        "lds_token": _mean(lds_per_token(actual, predictions(plan["masks"], plan["scores"]))),
    }
    if plan.get("centred") is not None:
        c = plan["centred"]  # (K, S)
        out["lds_centred"] = lds(actual.sum(axis=1), centred_predictions(plan["masks"], c.sum(axis=0)))
        out["lds_token_centred"] = _mean(lds_per_token(actual, centred_predictions(plan["masks"], c)))
    full = logp[0]  # (K,)
    for k, (whole_run, step_runs) in plan["top"].items():
        out[f"drop@{k}"] = float(full.sum() - logp[whole_run].sum())
        out[f"drop_token@{k}"] = float(np.mean([full[i] - logp[run, i] for i, run in enumerate(step_runs)]))
    return out


def _row_seed(seed: int, row_id: str) -> list[int]:
    return [seed, zlib.crc32(str(row_id).encode("utf-8"))]


@dataclass
class LdsRow:
    """A SQuAD row answered and cut into sources, as every LDS measurement sees it (the methods' and the peers')."""

    prompt: str  # the user's text (the QA prompt); `encoded.text` is it inside the chat template
    attr: Any  # the Attribution of the greedy answer
    encoded: Any  # the EncodedPrompt of `prompt`
    positions: list[int]  # prompt positions of the context tokens
    sentences: list[list[int]]  # S sources: the context's sentences, each a contiguous run of prompt positions
    k: int  # response length: the answer's content tokens, no trailing end-of-sequence token


def answer_row(bundle, row: dict[str, Any], methods, max_new_tokens: int, method_options=None) -> LdsRow:
    """Answer a SQuAD row greedily while `methods` explain it, and cut its context into sentences.

    Raises:
        InputError: no answer, or fewer than 2 context sentences to ablate.
    """
    prompt, context_start = qa_prompt(row)
    return answer_prompt(bundle, row["id"], prompt, context_start, methods, max_new_tokens, method_options)


def answer_prompt(bundle, row_id: str, prompt: str, context_start: int, methods, max_new_tokens: int,
                  method_options=None) -> LdsRow:  # fmt: skip
    """Answer the user's `prompt` greedily while `methods` explain it, and cut its text from `context_start` on into
    sentences (0: the whole prompt, as for a needle prompt).

    Raises:
        InputError: no answer, or fewer than 2 sentences to ablate.
    """
    attr = explain(bundle, prompt, methods=list(methods), max_new_tokens=max_new_tokens,
                   method_options=method_options or {})  # fmt: skip
    encoded = bundle.encode(prompt, max_new_tokens=max_new_tokens)
    positions, _ = context_positions(bundle, encoded, prompt, context_start)
    sentences = [list(g.positions) for g in sentence_groups(attr.prompt_tokens, positions) if g.kind == "sentence"]
    if attr.num_steps == 0 or len(sentences) < 2:
        raise InputError(f"Row {row_id!r}: no answer, or fewer than 2 context sentences to ablate.")
    k = last_content_step(attr) + 1
    return LdsRow(prompt, attr, encoded, positions, sentences, k)


def evaluate_lds_sample(bundle, row: dict[str, Any], cfg: LdsConfig) -> dict[str, Any]:
    """One SQuAD row: the answer, the measured log-probabilities' summary and every method's LDS and drops."""
    t0 = time.perf_counter()
    answered = answer_row(bundle, row, cfg.methods, cfg.max_new_tokens, cfg.method_options)
    attr, positions, sentences, k = answered.attr, answered.positions, answered.sentences, answered.k
    runs = _Runs(sentences, attr.num_prompt_tokens)
    runs.add(np.ones(len(sentences), dtype=bool))  # run 0: the whole prompt
    masks = ablation_masks(len(sentences), cfg.masks, cfg.keep, _row_seed(cfg.seed, row["id"]))  # (M, S)
    mask_runs = [runs.add(m) for m in masks]
    plans = {}
    for name, method in attr.methods.items():
        raw = np.asarray(method.raw[:k], dtype=np.float32)  # (K, N)
        label = method_label(name, cfg.method_options.get(name))
        zero_mean = source_scores(centred(raw, positions), sentences)  # (K, S)
        plans[label] = method_plan(source_scores(raw, sentences), masks, mask_runs, runs, cfg, zero_mean)
    device = bundle.device
    prompt_ids = torch.as_tensor(attr.prompt_token_ids, dtype=torch.long, device=device)  # (N,)
    response = torch.as_tensor(attr.generated_token_ids[:k], dtype=torch.long, device=device)  # (K,)
    keep = torch.as_tensor(np.stack(runs.rows), device=device)  # (R, N)
    logp = response_logprobs(bundle.model, prompt_ids, response, keep, cfg.batch_size)  # (R, K)
    return {
        "id": row["id"], "answer": attr.generated_text, "n_prompt_tokens": attr.num_prompt_tokens,
        "n_sentences": len(sentences), "n_response_tokens": k, "n_runs": len(runs.rows),
        "log_p": float(logp[0].sum()), "dtype": attr.meta.get("dtype"),
        "methods": {label: method_entries(plan, logp) for label, plan in plans.items()},
        "seconds": time.perf_counter() - t0, "command": cfg.command,
    }  # fmt: skip


def metric_keys(top_k: tuple[int, ...] = TOP_K) -> list[str]:
    """The per-row entries of a method, in table order."""
    return ["lds", "lds_centred", "lds_token", "lds_token_centred", *(f"drop@{k}" for k in top_k),
            *(f"drop_token@{k}" for k in top_k)]  # fmt: skip


def summarise(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """`{"n", "commands", "methods": {name: {key: (mean, 95% t half-width, n)}}}` over finished rows (undefined values
    skipped); "commands" are the distinct command lines that measured them (of every file a joined row came from)."""
    ok = [s for s in samples if "methods" in s]
    names = list(dict.fromkeys(m for s in ok for m in s["methods"]))
    keys = list(dict.fromkeys(key for s in ok for e in s["methods"].values() for key in e))
    methods = {}
    for name in names:
        rows = [s["methods"][name] for s in ok if name in s["methods"]]
        methods[name] = {}
        for key in keys:
            values = [r[key] for r in rows if r.get(key) is not None]
            methods[name][key] = mean_t(values)
    commands = list(dict.fromkeys(c for s in ok for c in s.get("commands") or [s.get("command")] if c))
    return {"n": len(ok), "commands": commands, "methods": methods}


def format_table(summary: dict[str, Any]) -> str:
    """Two tables (whole answer, per answer token): LDS and the top-k drops, each mean ± 95% half-width, N, and the
    commands that measured the rows."""
    names = list(summary["methods"])
    w = max([22, *(len(n) + 2 for n in names)])
    keys = list(dict.fromkeys(k for e in summary["methods"].values() for k in e))
    lines = [f"N = {summary['n']} rows; mean ± 95% interval half-width (n where fewer rows define a value)"]
    for title, chosen in (("whole answer", [k for k in keys if "token" not in k]),
                          ("per answer token", [k for k in keys if "token" in k])):  # fmt: skip
        if not chosen:  # the references score the whole answer only
            continue
        lines += ["", title, f"{'method':<{w}}" + "".join(f"{k:>20}" for k in chosen)]
        for name in names:
            cells = ""
            for key in chosen:
                mean, half, n = summary["methods"][name].get(key, (float("nan"), float("nan"), 0))
                cell = "-" if n == 0 else interval_text(mean, half) + ("" if n == summary["n"] else f" ({n})")
                cells += f"{cell:>20}"
            lines.append(f"{name:<{w}}{cells}")
    lines += ["", *(f"command: {c}" for c in summary.get("commands", []))]
    return "\n".join(lines)


def _joined(methods: dict[str, Any], name: str, key: str) -> float | None:
    """A row's `key` of method `name`, or its mean over the methods "a+b+..." names (None unless all hold it)."""
    values = [methods.get(part, {}).get(key) for part in name.split("+")]
    return None if any(v is None for v in values) else float(np.mean(values))


def paired_lines(samples: list[dict[str, Any]], pairs: list[tuple[str, str]]) -> list[str]:
    """One line per (A, B): the mean of A - B over the rows holding both, for the whole-answer and the per-token LDS,
    with its 95% t half-width and N (`intervals.paired_t`). A side may be several methods joined by "+": each row's
    mean over them (e.g. one design at several seeds), where the row holds all of them."""
    ok = [s for s in samples if "methods" in s]
    lines = []
    for a, b in pairs:
        cells = []
        for key in ("lds", "lds_token", "lds_centred"):
            values = [(_joined(s["methods"], a, key), _joined(s["methods"], b, key)) for s in ok]
            mean, half, n = paired_t([x for x, _ in values], [y for _, y in values])
            if n:
                cells.append(f"{key} {interval_text(mean, half, signed=True)} (N = {n})")
        lines.append(f"paired {a} - {b}: " + ("; ".join(cells) if cells else "no row holds both"))
    return lines


def sentence_bins(samples: list[dict[str, Any]], edges: Sequence[int]) -> list[tuple[str, list[dict[str, Any]]]]:
    """The rows split by their context's sentence count (`n_sentences`) at ascending `edges`: 20,24,28 gives "up to
    19", "20-23", "24-27" and "28 or more" (rows without a count are left out), for `paired_lines` per bin."""
    bounds = [0, *edges, None]
    bins = []
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        label = f"up to {hi - 1}" if lo == 0 else f"{lo} or more" if hi is None else f"{lo}-{hi - 1}"
        kept = [s for s in samples if s.get("n_sentences") is not None and lo <= s["n_sentences"]
                and (hi is None or s["n_sentences"] < hi)]  # fmt: skip
        bins.append((f"{label} sentences", kept))
    return bins


def run_lds(
    bundle,
    rows: list[dict[str, Any]],
    cfg: LdsConfig,
    results_path: str | Path | None = None,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Evaluate every row not yet in `results_path` (appending each), and summarise all of them."""
    measure = lambda row: evaluate_lds_sample(bundle, row, cfg)  # noqa: E731
    return measure_and_summarise(rows, measure, summarise, results_path, bundle.model, log)
