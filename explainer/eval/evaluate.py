"""Dataset evaluation of the MACS paper's QA protocol (section 4.1, Appendix A; Tables 2, 4 and 5).

For every SQuAD row the model answers the paper's prompt (section 4.1.1) under the chat template, greedily, while
the chosen methods explain it. Per sample and method:

- AUC-PR (Appendix A.1): per step, the average precision of the scores of the *context* tokens against each gold
  answer span (tokens whose character offsets overlap it), averaged over spans; the sample's value is the best step.
- "best step before the answer" (section 4.1.3): whether that best step comes before the step at which the model
  starts writing a gold answer (the first generated token overlapping the first case-insensitive occurrence of any
  gold answer text in the generated text); undefined (None) when no gold answer appears in the generation.
- MIF / LIF / SRG (Appendix A.2) for logit, perplexity, ROUGE-L and BLEU, removing context tokens only.

Results are appended per sample as JSON lines to a results file, so an interrupted run resumes where it stopped.
The command-line front end, `python -m explainer eval`, is `explainer/cli/eval.py`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError
from ..explain import explain
from ..faithfulness import RemovalConfig, removal_curves
from ..faithfulness.metrics import REMOVAL_METRIC_KEYS, REMOVAL_METRICS
from ..methods import MACS, MACSConfig, get_method
from ..runtime.precision import precision_meta
from ..runtime.session import CancelToken
from .datasets import is_official_layout, rows_from_official
from .metrics import mean_ci, span_labels, step_auc_pr
from .parallel import results_files
from .resumable import check_joinable, measure_rows, read_results

QA_PROMPT = (
    "Answer the question based on the following text. Keep your response short and simple. "
    "Do not quote the original text.\nQuestion: {question}\nContext: {context}"
)  # MACS paper, section 4.1.1
SQUAD_KEYS = ("id", "question", "context", "answers")  # what evaluation reads from every row
ABLATIONS: dict[str, dict[str, Any]] = {  # MACS paper, Table 4
    "macs": {},
    "macs_no_redistribution": {"redistribute": False},
    "macs_mean_pooling": {"pooling": "mean"},
    "macs_min_pooling": {"pooling": "min"},
    "macs_alpha_1.0": {"alpha": 1.0},
    "macs_alpha_0.5": {"alpha": 0.5},
    "macs_alpha_0.2": {"alpha": 0.2},
}


@dataclass
class EvalConfig:
    methods: tuple[str, ...] = ("macs", "rollout", "atman", "random")
    max_new_tokens: int = 64  # the paper uses 256; shorter answers keep CPU runs affordable
    faithfulness: bool = True  # False: AUC-PR only
    ablation: bool = False  # run the MACS variants of Table 4 instead of `methods`
    removal_batch_size: int = 0  # 0: from the device
    seed: int = 0
    method_options: dict[str, dict[str, Any]] = field(default_factory=dict)


def load_squad(
    path: str | Path, limit: int | None = None, required: tuple[str, ...] = SQUAD_KEYS, offset: int = 0
) -> list[dict[str, Any]]:
    """Rows {id, title, question, context, answers: [{text, answer_start}]} of a SQuAD file.

    The file is a list of rows, `{"rows": [...]}`, or the official SQuAD 2.0 layout (`{"data": [{"paragraphs":
    ...}]}`), of which answerable questions are kept (see `datasets.rows_from_official`).

    Args:
        path: the JSON file (`datasets.resolve_data` turns `squad_v2-dev` into one).
        limit: keep only the first `limit` rows (None: all), counted from `offset`.
        required: keys every row must have; the benchmark, which only reads contexts, requires none.
        offset: skip the file's first `offset` rows (one part of a run split into parts, joined with `--report`).

    Raises:
        InputError: unreadable file or rows without the needed keys.
    """
    if offset < 0 or (limit is not None and limit < 0):
        raise InputError(f"--offset and --limit must be 0 or more, got {offset} and {limit}.")
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(f"Cannot read data file {str(path)!r}: {e.__class__.__name__}: {e}") from e
    if is_official_layout(data):
        rows = rows_from_official(data)
    else:
        rows = data["rows"] if isinstance(data, dict) and "rows" in data else data
    if not isinstance(rows, list):
        raise InputError(
            f"{str(path)!r} holds neither a list of rows, {{'rows': [...]}}, nor the SQuAD 2.0 layout "
            "{'data': [...]}."
        )
    for r in rows:
        if not isinstance(r, dict):
            raise InputError(f"{str(path)!r} has a row that is not an object: {str(r)[:40]!r}.")
        if not all(k in r for k in required):
            raise InputError(f"Row {r.get('id', '?')!r} lacks one of {', '.join(required)}.")
    return rows[offset : offset + limit] if limit is not None else rows[offset:]


def make_methods(cfg: EvalConfig) -> list:
    """Method instances, with distinct names for the MACS ablation variants."""
    if not cfg.ablation:
        return [get_method(m, **cfg.method_options.get(m, {})) for m in cfg.methods]
    out = []
    for name, options in ABLATIONS.items():
        inst = MACS(MACSConfig(**options))
        inst.name = name  # the instance name shadows the class's registry name
        out.append(inst)
    return out


def context_positions(
    bundle, encoded, prompt: str, context_start: int, context_end: int | None = None
) -> tuple[list[int], list[tuple[int, int]]]:
    """Prompt positions of the context tokens (the prompt's characters `context_start:context_end`, default to its
    end) and their character spans relative to the context."""
    tok = bundle.tokenizer
    text = encoded.text
    add_special = text == prompt
    enc = tok(text, add_special_tokens=add_special, return_offsets_mapping=True)
    if list(enc["input_ids"]) != encoded.input_ids[0].tolist():
        raise InputError("Tokenisation with offsets differs from the model input; cannot locate the context.")
    base = text.rfind(prompt)
    shift = base + context_start
    end = base + (len(prompt) if context_end is None else context_end)
    positions, spans = [], []
    for i, (s, e) in enumerate(enc["offset_mapping"]):
        if e > s and e > shift and s >= shift - 1 and s < end:  # a leading-space token may start one character early
            positions.append(i)
            spans.append((s - shift, e - shift))
    return positions, spans


def answer_step(generated_tokens: list[str], answers: Iterable[str]) -> int | None:
    """The first step whose token overlaps the earliest case-insensitive occurrence of a gold answer, or None."""
    text = "".join(generated_tokens).lower()
    starts = [text.find(a.strip().lower()) for a in answers if a.strip()]
    starts = [s for s in starts if s >= 0]
    if not starts:
        return None
    first, end = min(starts), 0
    for k, t in enumerate(generated_tokens):
        end += len(t)
        if end > first:
            return k
    return None


def qa_prompt(row: dict[str, Any]) -> tuple[str, int]:
    """The paper's QA prompt (`QA_PROMPT`) for a SQuAD row, and the character where its context starts."""
    head, _, _ = QA_PROMPT.partition("{context}")
    prefix = head.format(question=row["question"])
    return prefix + row["context"], len(prefix)


def evaluate_sample(bundle, row: dict[str, Any], cfg: EvalConfig) -> dict[str, Any]:
    """Everything the tables need for one SQuAD row (one JSON-able dict)."""
    t0 = time.perf_counter()
    prompt, context_start = qa_prompt(row)
    instances = make_methods(cfg)
    attr = explain(bundle, prompt, methods=instances, max_new_tokens=cfg.max_new_tokens)
    encoded = bundle.encode(prompt, max_new_tokens=cfg.max_new_tokens)
    positions, spans = context_positions(bundle, encoded, prompt, context_start)
    if not positions:
        raise InputError(f"Row {row['id']!r}: no context tokens found.")
    labels = [span_labels(spans, a["answer_start"], a["answer_start"] + len(a["text"])) for a in row["answers"]]
    ans_step = answer_step(attr.generated_tokens, [a["text"] for a in row["answers"]])
    out: dict[str, Any] = {
        "id": row["id"],
        "n_context_tokens": len(positions),
        "n_prompt_tokens": attr.num_prompt_tokens,
        "n_generated": attr.num_steps,
        "answer": attr.generated_text,
        "answer_step": ans_step,
        "dtype": attr.meta.get("dtype"),
        "methods": {},
    }
    for m in attr.methods:
        per_step = step_auc_pr(attr.methods[m].raw[:, positions], labels)  # (K,)
        best = int(np.argmax(per_step)) if per_step.size else 0
        out["methods"][m] = {
            "auc_pr": float(per_step.max()) if per_step.size else 0.0,
            "best_step": best,
            "best_before_answer": None if ans_step is None else bool(best < ans_step),
            "seconds": attr.methods[m].seconds,
        }
    if cfg.faithfulness:
        removal = removal_curves(
            bundle, attr, list(attr.methods), positions,
            RemovalConfig(max_new_tokens=cfg.max_new_tokens, batch_size=cfg.removal_batch_size, seed=cfg.seed),
            include_random=False,
        )  # fmt: skip
        for m, per_metric in removal.auc.items():
            for metric, auc in per_metric.items():
                out["methods"][m].update({f"mif_{metric}": auc["mif"], f"lif_{metric}": auc["lif"],
                                          f"srg_{metric}": auc["srg"]})  # fmt: skip
    out["seconds"] = time.perf_counter() - t0
    return out


def merge_results(paths: list[str | Path]) -> list[dict[str, Any]]:
    """Per-sample rows of several results files joined by id: methods evaluated in separate runs on the same samples
    (e.g. AtMan run later) become one row per sample. Samples missing from some files keep the methods they have.
    A method found in several files keeps the fields of all of them (an AUC-PR-only run and a run with removal curves
    on the same sample add up to both; a field in both is taken from the later file). A joined row keeps the first
    file's "command" and lists every file's in "commands". A path also stands for the rank files of a data-parallel
    run that wrote to it (`parallel.results_files`).

    Raises:
        InputError: a file is missing (or a rank file of a run), or two files disagree on a sample's precision,
            generated answer or prompt (`resumable.check_joinable`).
    """
    merged: dict[str, dict[str, Any]] = {}
    for path in (file for p in paths for file in results_files(p)):
        for row in read_results(path):
            if "methods" not in row:
                continue
            seen = merged.get(row["id"])
            if seen is None:
                merged[row["id"]] = {**row, "methods": {name: dict(f) for name, f in row["methods"].items()}}
                continue
            check_joinable(seen, row)
            for name, fields in row["methods"].items():
                seen["methods"][name] = {**seen["methods"].get(name, {}), **fields}
            commands = [*seen.get("commands", [seen.get("command")]), row.get("command")]
            seen["commands"] = [c for c in dict.fromkeys(commands) if c]
            seen["seconds"] = seen.get("seconds", 0.0) + row.get("seconds", 0.0)
    return list(merged.values())


def summarise(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """`{"n", "methods": {name: {"mAUC_PR", "mSRG_logit", ..., "<key>_ci": half-width}}}` over finished samples."""
    ok = [s for s in samples if "methods" in s]
    names = list(dict.fromkeys(m for s in ok for m in s["methods"]))
    methods: dict[str, dict[str, Any]] = {}
    for name in names:
        rows = [s["methods"][name] for s in ok if name in s["methods"]]
        entry: dict[str, Any] = {}
        keys = {"mAUC_PR": "auc_pr"}
        for metric in REMOVAL_METRIC_KEYS:
            keys.update({f"mSRG_{metric}": f"srg_{metric}", f"mMIF_{metric}": f"mif_{metric}",
                         f"mLIF_{metric}": f"lif_{metric}"})  # fmt: skip
        for out_key, key in keys.items():
            values = [r[key] for r in rows if r.get(key) is not None]
            if values:
                entry[out_key], entry[f"{out_key}_ci"] = mean_ci(values)
        before = [r["best_before_answer"] for r in rows if r.get("best_before_answer") is not None]
        entry["best_before_answer_rate"] = float(np.mean(before)) if before else None
        entry["best_before_answer_n"] = len(before)
        methods[name] = entry
    return {"n": len(ok), "methods": methods}


def _cell(entry: dict[str, Any], key: str) -> str:
    if key not in entry or entry[key] != entry[key]:
        return "-"
    return f"{entry[key]:.3f} ± {entry.get(key + '_ci', 0.0):.3f}"


def format_tables(summary: dict[str, Any]) -> str:
    """Tables 2 and 5 of the MACS paper (methods as columns in Table 5), plus the best-step statistic."""
    methods = summary["methods"]
    names = list(methods)
    lines = [f"N = {summary['n']} samples", "", "Table 2 layout"]
    header = f"{'Method':<24}{'mAUC-PR ↑':>18}{'mSRG-PP ↓':>18}{'mSRG-RL ↑':>18}"
    lines += [header, "-" * len(header)]
    for n in names:
        e = methods[n]
        lines.append(f"{n:<24}{_cell(e, 'mAUC_PR'):>18}{_cell(e, 'mSRG_ppl'):>18}{_cell(e, 'mSRG_rougeL'):>18}")
    lines += ["", "Table 5 layout"]
    width = 18
    header = f"{'Output Type':<14}{'Metric':<14}" + "".join(f"{n[: width - 1]:>{width}}" for n in names)
    lines += [header, "-" * len(header)]
    lines.append(
        f"{'Main Task':<14}{'AUC-PR':<14}" + "".join(f"{_cell(methods[n], 'mAUC_PR'):>{width}}" for n in names)
    )
    for metric, title in ((m.key, m.title) for m in REMOVAL_METRICS):
        for i, (label, key) in enumerate(
            (("mMIF (AUC)", f"mMIF_{metric}"), ("mLIF (AUC)", f"mLIF_{metric}"), ("mSRG", f"mSRG_{metric}"))
        ):
            cells = "".join(f"{_cell(methods[n], key):>{width}}" for n in names)
            lines.append(f"{title if i == 0 else '':<14}{label:<14}{cells}")
    lines += ["", "Best AUC-PR step before the answer appears (section 4.1.3)"]
    for n in names:
        rate, count = methods[n].get("best_before_answer_rate"), methods[n].get("best_before_answer_n", 0)
        lines.append(f"  {n:<24} " + (f"{100 * rate:6.2f}% of {count} samples" if rate is not None else "n/a"))
    return "\n".join(lines)


def check_precision(rows: Iterable[dict[str, Any]], dtype: str | None, path: str | Path | None) -> None:
    """Refuse to resume a results file whose rows were computed in another precision than `dtype`.

    Raises:
        InputError: names both precisions and the way out.
    """
    other = {r["dtype"] for r in rows if r.get("dtype") is not None} - {dtype}
    if dtype is not None and other:
        raise InputError(
            f"{str(path)!r} holds results computed in {', '.join(sorted(other))}, but the model is loaded in "
            f"{dtype}: pass --dtype {sorted(other)[0]}, or write to another --results file."
        )


def run_evaluation(
    bundle,
    rows: list[dict[str, Any]],
    cfg: EvalConfig,
    results_path: str | Path | None = None,
    log: Callable[[str], None] | None = None,
    cancel: CancelToken | None = None,
) -> dict[str, Any]:
    """Evaluate every row not yet in `results_path`, appending each finished sample, and summarise all of them.

    Each sample holds the model for its whole duration; `cancel` stops the run between forward passes (`Cancelled`
    is raised; finished samples are already in `results_path`, so a rerun resumes).

    Returns:
        `{"n", "methods": {...}, "samples": [...], "skipped": [ids of rows that failed, with reasons]}`.
    """
    done = {r["id"]: r for r in read_results(results_path)}
    check_precision(done.values(), precision_meta(bundle.model).get("dtype"), results_path)
    if log and done:
        log(f"resuming: {sum(r['id'] in done for r in rows)} of {len(rows)} samples already in {results_path}")
    measure = lambda row: evaluate_sample(bundle, row, cfg)  # noqa: E731
    samples = measure_rows(rows, measure, done, results_path, bundle.model, log, cancel)
    summary = summarise(samples)
    summary["samples"] = samples
    summary["skipped"] = [{"id": s["id"], "error": s["error"]} for s in samples if "error" in s]
    return summary
