"""How Sources' surrogate should choose its masks and target: measured on development questions, never on the
evaluated ones (the LDS table's are the first 100 of the 350-question file; these are rows 200-299).

`collect`: per question with at most 6 context sentences, the answer's per-token log-probabilities under EVERY keep
mask of the context's sentences (2^S), which holds the `lds` command's 32 evaluation masks (same seeds), and under a
pairs design of 16 masks over every unit of the user's text (instruction and question too). `report`: any design of
k masks is then a choice of rows, so each design, k and target is fitted offline (`surrogate.fit`, as the method
fits) and scored by the LDS on the 32 evaluation masks, whole answer and per answer token, averaged over seeds.

Usage: python scripts/sources_design.py collect --data squad_v2-dev --ids docs/results/squad-dev-350.ids
           --offset 200 --limit 100 --results docs/results/sources-design-dev-f32-DATE.jsonl
       python scripts/sources_design.py report docs/results/sources-design-dev-f32-DATE.jsonl
"""

from __future__ import annotations

import argparse
import itertools
import json
import shlex
import sys
import time
import zlib
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's packages, wherever it runs from

from explainer.eval.metrics import spearman  # noqa: E402
from explainer.methods.surrogate import design, fit  # noqa: E402

MOST_SENTENCES = 6  # 2^6 = 64 masks a question
SEEDS = 5


def collect(args: argparse.Namespace) -> None:
    import torch

    from explainer.eval.ablate import response_logprobs
    from explainer.eval.datasets import resolve_data, select_rows
    from explainer.eval.evaluate import load_squad
    from explainer.eval.lds import ablation_masks
    from explainer.eval.lds_eval import answer_row
    from explainer.methods.sources import units
    from explainer.models.loading import load_model
    from explainer.runtime.precision import parse_dtype

    rows = load_squad(resolve_data(args.data))
    if args.ids:
        rows = select_rows(rows, args.ids)
    rows = rows[args.offset : args.offset + args.limit]
    done = {json.loads(line)["id"] for line in open(args.results)} if Path(args.results).exists() else set()
    bundle = load_model(None, dtype=parse_dtype(args.dtype))
    command = shlex.join(["python", "scripts/sources_design.py", *sys.argv[1:]])
    for row in (r for r in rows if r["id"] not in done):
        t0 = time.perf_counter()
        answered = answer_row(bundle, row, ["random"], 16)
        attr, n, ctx = answered.attr, answered.attr.num_prompt_tokens, answered.sentences
        if len(ctx) > MOST_SENTENCES:
            print(f"{row['id']}: {len(ctx)} sentences, left out", file=sys.stderr)
            continue
        every = [list(g.positions) for g in units(attr.prompt_tokens, attr.user_positions, "sentence")]
        pool = np.array(list(itertools.product([True, False], repeat=len(ctx))))  # (2^S, S) row 0 keeps all
        lds_masks = ablation_masks(len(ctx), 32, 0.5, [0, zlib.crc32(str(row["id"]).encode("utf-8"))])
        pairs = design(len(every), 16, "pairs", 0)  # over every unit of the user's text
        index, distinct = [], {}
        for mask, groups in [*((m, ctx) for m in pool), *((m, ctx) for m in lds_masks), *((m, every) for m in pairs)]:
            keep = np.ones(n, dtype=bool)
            for u, positions in enumerate(groups):
                keep[positions] = keep[positions] & bool(mask[u])
            keep[n - 1] = True
            index.append(distinct.setdefault(keep.tobytes(), len(distinct)))
        keep = torch.as_tensor(np.stack([np.frombuffer(b, dtype=bool) for b in distinct]), device=bundle.device)
        ids = torch.as_tensor(attr.prompt_token_ids + attr.generated_token_ids[: answered.k], device=bundle.device)
        logp = response_logprobs(bundle.model, ids[:n], ids[n:], keep)  # (distinct masks, K)
        record = {"id": row["id"], "k": answered.k, "ctx": ctx, "all": every, "pool": pool.tolist(),
                  "eval": lds_masks.tolist(), "pairs_all": pairs.tolist(), "index": index, "logp": logp.tolist(),
                  "dtype": attr.meta.get("dtype"), "seconds": time.perf_counter() - t0, "command": command}  # fmt: skip
        with open(args.results, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")


def _lds(weights: np.ndarray, masks: np.ndarray, logp: np.ndarray) -> tuple[float | None, float | None]:
    """Whole-answer and mean per-token LDS of (K, S) weights on masks (M, S) with measured logp (M, K)."""
    whole = spearman(logp.sum(axis=1), masks @ weights.sum(axis=0))
    tokens = [v for v in (spearman(logp[:, j], masks @ weights[j]) for j in range(len(weights))) if v is not None]
    return whole, (float(np.mean(tokens)) if tokens else None)


def report(path: str) -> None:
    rows = [json.loads(line) for line in open(path)]
    print(f"{len(rows)} questions; LDS whole answer / per token, mean over questions x {SEEDS} seeds")
    for k in (8, 16, 32):
        for kind in ("random", "pairs", "loo_pairs"):
            for target in ("log p", "logit"):
                scores = []
                for r, seed in itertools.product(rows, range(SEEDS)):
                    logp = np.asarray(r["logp"])[r["index"]]
                    s, big = len(r["ctx"]), 2 ** len(r["ctx"])
                    masks = np.concatenate([np.ones((1, s), bool), design(s, k, kind, seed)])
                    rows_of = [sum(int(not b) << (s - 1 - i) for i, b in enumerate(m)) for m in masks]
                    y = logp[rows_of]
                    if target == "logit":
                        y = y - np.log(-np.expm1(np.minimum(y, -1e-7)))
                    scores.append(_lds(fit(masks, y)[0], np.asarray(r["eval"], float), logp[big : big + 32]))
                whole = np.mean([w for w, _ in scores if w is not None])
                token = np.mean([t for _, t in scores if t is not None])
                print(f"k={k:2d} {kind:9s} {target:5s}: {whole:.3f} / {token:.3f}")
    every = []
    for r in rows:  # the pairs design over every unit (instruction and question too), read on the context
        logp = np.asarray(r["logp"])[r["index"]]
        big, units_all = 2 ** len(r["ctx"]), np.asarray(r["pairs_all"], bool)
        masks = np.concatenate([np.ones((1, units_all.shape[1]), bool), units_all])
        weights = fit(masks, np.concatenate([logp[:1], logp[big + 32 :]]))[0]  # (K, U)
        share = np.array([[len(set(c) & set(a)) / len(a) for a in r["all"]] for c in r["ctx"]])  # (S, U)
        every.append(_lds(weights @ share.T, np.asarray(r["eval"], float), logp[big : big + 32]))
    print(f"k=16 pairs over every unit of the user's text: {np.mean([w for w, _ in every if w is not None]):.3f} / "
          f"{np.mean([t for _, t in every if t is not None]):.3f}")  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("collect")
    c.add_argument("--data", required=True)
    c.add_argument("--ids")
    c.add_argument("--offset", type=int, default=200)
    c.add_argument("--limit", type=int, default=100)
    c.add_argument("--dtype", default="float32")
    c.add_argument("--results", required=True)
    r = sub.add_parser("report")
    r.add_argument("results")
    args = p.parse_args()
    if args.command == "collect":
        collect(args)
    else:
        report(args.results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
