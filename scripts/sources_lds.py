"""Sources' surrogate at several ablation counts on the rows the `lds` command measures, as rows of its results file
so that `python -m explainer lds --report LDS.jsonl,SOURCES.jsonl` joins them by question id with the other methods
and the peers (ContextCite's rows: docs/results/lds-peers-cc-f32-2026-11-28.jsonl).

Per row: the answer is generated greedily; for every k in --counts Sources fits its surrogate on its own k ablations
(with --options, e.g. context=Context: the passages start at the context, as ContextCite is handed the context); the
context's sentences are ablated by the `lds` command's 32 random masks (the same seeds: [--seed, crc32(row id)]);
each k's whole-answer and per-token LDS are written as "sources:...:ablations=k", with the fit's held-out and
cross-validated Spearman under "fits".

--paragraphs P: long contexts instead (`datasets.haystack_rows`: the row's paragraph among P - 1 paragraphs of other
articles, as the haystack test builds them; P = 4 gives 20 or more sentences). --reference M adds ContextCite's
surrogate as its paper defines it, without its package: M random masks over the context's sentences (each kept with
probability 1/2), least squares on the logit of the whole answer's probability, as "least-squares:masks=M".

Usage: python scripts/sources_lds.py --data squad_v2-dev --ids docs/results/squad-dev-350.ids --limit 100
       --dtype float32 --options context=Context --results docs/results/lds-sources-f32-DATE.jsonl
       [--counts 8,16,32] [--paragraphs 4 --reference 64]
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
import zlib
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's packages, wherever it runs from

from explainer.eval.ablate import response_logprobs  # noqa: E402
from explainer.eval.datasets import haystack_rows, resolve_data, select_rows  # noqa: E402
from explainer.eval.evaluate import load_squad  # noqa: E402
from explainer.eval.haystack import method_label  # noqa: E402
from explainer.eval.lds import MASKS, ablation_masks, lds, lds_per_token, predictions, source_scores  # noqa: E402
from explainer.eval.lds_eval import answer_row, format_table, summarise  # noqa: E402
from explainer.eval.resumable import measure_and_summarise  # noqa: E402
from explainer.methods import GenerationRun, get_method, parse_methods  # noqa: E402
from explainer.models.loading import load_model  # noqa: E402
from explainer.runtime.precision import parse_dtype  # noqa: E402


def _mean(values) -> float | None:
    known = [v for v in values if v is not None]
    return float(np.mean(known)) if known else None


def measure(bundle, row: dict, args: argparse.Namespace) -> dict:
    t0 = time.perf_counter()
    answered = answer_row(bundle, row, ["random"], args.max_new_tokens)  # the answer (Random costs nothing)
    attr, sentences, k = answered.attr, answered.sentences, answered.k
    device = bundle.device
    ids = torch.as_tensor([attr.prompt_token_ids + attr.generated_token_ids], device=device)  # (1, N + K)
    crc = zlib.crc32(str(row["id"]).encode("utf-8"))
    masks = ablation_masks(len(sentences), MASKS, 0.5, [args.seed, crc])  # (M, S) the `lds` command's
    reference = ablation_masks(len(sentences), args.reference, 0.5, [args.seed, crc, 1])  # (M', S)
    every = np.concatenate([masks, reference])
    keep = np.ones((len(every), attr.num_prompt_tokens), dtype=bool)  # (M + M', N)
    for m, mask in enumerate(every):
        for s, positions in enumerate(sentences):
            if not mask[s]:
                keep[m, positions] = False
    logp = response_logprobs(bundle.model, ids[0, : attr.num_prompt_tokens], ids[0, attr.num_prompt_tokens :][:k],
                             torch.as_tensor(keep, device=device))  # fmt: skip  (M + M', K)
    logp, measured = logp[: len(masks)], logp[len(masks) :]
    methods, fits = {}, {}
    for count in args.counts:  # each k's own design, fitted on its own passes, as the app runs it
        method = get_method("sources", **{**args.options, "ablations": count})
        run = GenerationRun(bundle.model, ids, attr.num_prompt_tokens, prompt_tokens=attr.prompt_tokens,
                            user_positions=attr.user_positions)  # fmt: skip
        raw = method.explain(run)[:k]  # (K, N)
        scores = source_scores(raw, sentences)  # (K, S)
        label = method_label("sources", {**args.options, "ablations": count})
        methods[label] = {
            "lds": lds(logp.sum(axis=1), predictions(masks, scores.sum(axis=0))),
            "lds_token": _mean(lds_per_token(logp, predictions(masks, scores))),
        }
        meta = method.meta()
        fits[label] = {key: meta[key] for key in ("held_out_spearman", "cross_validated_spearman", "ridge")}
        fits[label]["units"] = len(meta["masks"]["units"])
    if args.reference:
        whole = measured.sum(axis=1)
        target = whole - np.log(-np.expm1(np.minimum(whole, -1e-6)))  # logit p = log p - log(1 - p)
        design = np.concatenate([np.ones((len(reference), 1)), reference.astype(float)], axis=1)
        coef = np.linalg.lstsq(design, target, rcond=None)[0]
        methods[f"least-squares:masks={args.reference}"] = {"lds": lds(logp.sum(axis=1), masks @ coef[1:])}
    return {
        "id": row["id"], "answer": attr.generated_text, "dtype": attr.meta.get("dtype"),
        "n_prompt_tokens": attr.num_prompt_tokens, "n_sentences": len(sentences), "n_response_tokens": k,
        "fits": fits, "methods": methods, "seconds": time.perf_counter() - t0, "command": args.command_line,
    }  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="SQuAD JSON file or squad_v2-dev")
    p.add_argument("--ids", help="ids file (`explainer lds --ids`): only these rows, in its order")
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--counts", default="8,16,32", help="ablation counts, each run and fitted on its own")
    p.add_argument("--options", default="", help="Sources' options as on the command line, e.g. context=Context")
    p.add_argument("--paragraphs", type=int, default=0, help="long contexts: this many paragraphs joined (0: none)")
    p.add_argument("--reference", type=int, default=0, help="masks of a least-squares ContextCite fit (0: none)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--model", default=None)
    p.add_argument("--results", help="JSON-lines file; a rerun skips the rows already in it")
    args = p.parse_args()
    args.counts = sorted({int(c) for c in args.counts.split(",")})
    args.options = parse_methods("sources" + (":" + args.options if args.options else ""))[1].get("sources", {})
    args.command_line = shlex.join(["python", "scripts/sources_lds.py", *sys.argv[1:]])
    rows = load_squad(resolve_data(args.data))
    if args.ids:
        rows = select_rows(rows, args.ids)
    rows = rows[: args.limit]
    if args.paragraphs:
        rows = haystack_rows(rows, args.paragraphs)
    bundle = load_model(args.model, dtype=parse_dtype(args.dtype))
    summary = measure_and_summarise(rows, lambda row: measure(bundle, row, args), summarise, args.results,
                                    bundle.model, lambda m: print(m, file=sys.stderr))  # fmt: skip
    print(format_table(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
