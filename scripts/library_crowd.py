"""A crowd through the library, without the app: N visitors' text requests at once on one model (issue #34's GPU rows).

    python scripts/library_crowd.py --folder embedded --visitors 1,8 --rounds 3 --json out.json
    python scripts/library_crowd.py --model Qwen/Qwen2.5-1.5B-Instruct --dtype bfloat16 --visitors 1,8 --json out.json

Each visitor is a thread calling `explain_request` with the batched decode on (`decoding.enable_batching()`, as the app
runs it): the same prompt (with `--distinct` each visitor's own, its number at the end, so no two rows share a prefill),
MACS + Rollout, a given answer of `--new-tokens` token ids (teacher-forced, so every request runs all its steps
whatever random weights would generate). Before the crowds a request runs once to warm up, one crowd of the largest
size runs uncounted (a process's first crowds also grow its memory, `explainer/runtime/malloc.py`), and each distinct
request runs alone: its reference. Each crowd size runs `--rounds` times, alternating (1, 8, 1, 8, ...); the
report gives each round's time until all were served, the medians, the median of each size over the median of the
1-visitor rounds, and the visitors whose token ids, raw maps or step scores differ from their reference in any bit,
with by how much (`difference`).

The model: `--folder` a saved model (a path, or `embedded`), or `--model` a shipped configuration built with random
weights on the device (`gpu_bench.random_model`; `--tiny` shrinks it, a CPU dry run). Where `scripts/load_test.py
--crowd` measures the app with real clients, this measures what the batched decode itself gives on a device, for the
GPU session (`scripts/gpu_check.sh crowd`), where the app and its clients cannot run beside the model.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

SENTENCE = "The harbour lighthouse was built from granite, and its keeper wrote a daily log of every ship. "


def _bundle(args):
    from types import SimpleNamespace

    from gpu_bench import _load

    from explainer import bundle_from_objects

    model, tok, name, device = _load(SimpleNamespace(**vars(args)))
    return bundle_from_objects(model, tok, name=name), device


def _request(bundle, prompt_tokens: int, new_tokens: int, visitor: int | None = None):
    """The request every visitor sends, or with `visitor` that visitor's own (its number ends the prompt)."""
    import torch

    from explainer.request import ExplainRequest

    words = (SENTENCE * (prompt_tokens // 16 + 1)).split()
    prompt = " ".join(words[: max(1, prompt_tokens * 3 // 4)]) + ("" if visitor is None else f" Visitor {visitor}.")
    vocab = bundle.model.config.get_text_config().vocab_size
    answer = torch.randint(10, min(vocab, 30_000), (new_tokens,), generator=torch.Generator().manual_seed(0))
    return ExplainRequest.build(prompt, ["macs", "rollout"], new_tokens, answer=tuple(answer.tolist()))


def _same(a, b) -> bool:
    """Bit for bit: token ids, every method's raw map, step probabilities and entropies."""
    import numpy as np

    return (
        a.generated_token_ids == b.generated_token_ids
        and a.methods.keys() == b.methods.keys()
        and all(np.array_equal(a.methods[m].raw, b.methods[m].raw, equal_nan=True) for m in a.methods)
        and json.dumps(a.step_scores) == json.dumps(b.step_scores)
    )


def difference(a, b) -> dict:
    """How a visitor's result `a` differs from its reference `b` (for a mismatch found by `_same`): whether the token
    ids are equal, and the largest absolute difference of each method's raw map and of each step score (relative to
    the reference's largest magnitude too), where their shapes agree."""
    import numpy as np

    def gap(x, y) -> dict | None:
        x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
        if x.shape != y.shape:
            return None
        both = np.isfinite(x) & np.isfinite(y)
        d = float(np.abs(x - y)[both].max(initial=0.0))
        scale = float(np.abs(y)[both].max(initial=0.0))
        return {"max_abs": d, "relative": d / scale if scale else None}

    return {
        "tokens_equal": a.generated_token_ids == b.generated_token_ids,
        "maps": {m: gap(a.methods[m].raw, b.methods[m].raw) for m in sorted(a.methods.keys() & b.methods.keys())},
        "step_scores": {
            k: gap(a.step_scores[k], b.step_scores[k]) for k in sorted(a.step_scores.keys() & b.step_scores.keys())
        },
    }


def _round(bundle, requests: list, n: int, references: list | None) -> dict:
    """Visitor i sends requests[i]; its result is compared with references[i] (None: not compared)."""
    from crowd_rounds import at_once

    from explainer.explain import explain_request

    out, wall = at_once(n, lambda i: explain_request(bundle, requests[i]))
    done = [(i, r) for i, r in enumerate(out) if not isinstance(r, BaseException)]
    differ = None if references is None else [(i, r) for i, r in done if not _same(r, references[i])]
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", help="a shipped configuration's Hub id, built with random weights")
    p.add_argument("--folder", help="a saved model's folder, or `embedded`")
    p.add_argument("--tiny", action="store_true", help="shrink the configuration's dimensions (CPU dry runs)")
    p.add_argument("--device", help="default: cuda when there is one")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--visitors", default="1,8", help="crowd sizes, comma-separated")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--prompt-tokens", type=int, default=150)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--distinct", action="store_true", help="each visitor its own prompt: no two share a prefill")
    p.add_argument("--json", required=True, help="write the report here")
    args = p.parse_args(argv)
    if not (args.model or args.folder):
        p.error("give --model or --folder")

    from crowd_rounds import summary
    from gpu_bench import _machine

    from explainer.decoding import enable_batching
    from explainer.decoding.batched.engine import finish
    from explainer.explain import explain_request
    from explainer.runtime.malloc import keep_freed_memory

    keep_freed_memory()  # as the app runs
    bundle, device = _bundle(args)
    sizes = [int(n) for n in args.visitors.split(",")]
    if args.distinct:
        requests = [_request(bundle, args.prompt_tokens, args.new_tokens, i) for i in range(1, max(sizes) + 1)]
    else:
        requests = [_request(bundle, args.prompt_tokens, args.new_tokens)] * max(sizes)
    enable_batching()
    explain_request(bundle, requests[0])  # warm-up
    _round(bundle, requests, max(sizes), None)  # a first crowd, uncounted
    alone = {id(r): explain_request(bundle, r) for r in requests}  # alone in the batcher: what each visitor must get
    references = [alone[id(r)] for r in requests]
    reference = references[0]
    rows = [_round(bundle, requests, n, references) for _ in range(args.rounds) for n in sizes]
    report = {
        "model": bundle.name, "dtype": args.dtype, "date": datetime.now().strftime("%Y-%m-%d"),
        "machine": _machine(device), "prompt_tokens": reference.num_prompt_tokens, "new_tokens": args.new_tokens,
        "decode": reference.meta["decode"]["path"], "decode_reason": reference.meta["decode"]["reason"],
        "distinct_prompts": args.distinct, "rounds": rows,
        "medians": summary(rows),
    }  # fmt: skip
    Path(args.json).write_text(json.dumps(report, indent=2), encoding="utf-8")
    finish(bundle.model, timeout=60)  # the batcher's thread ends before the interpreter does (no abort at exit)
    for m in report["medians"]:
        ratio = "" if m["vs_one_alone_median"] is None else f", {m['vs_one_alone_median']:.2f}x one"
        print(f"{m['visitors']:>3} visitors: {m['all_served_median_s']:.2f} s{ratio}")
    bad = sum(r["mismatched_visitors"] + len(r["errors"]) for r in rows)
    print(f"mismatched or failed visitors: {bad}")
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
