"""A committed row of `lds --peers` measured again from the scores it stores: the centred LDS beside the raw one,
without running the references again (`lds --peers NAMES --rescore FILE`).

The references' LDS rows of 2026-11-28 hold their sentence scores but only the raw LDS. Running ContextCite again
costs its 64 ablations a question, AT2 its training, so a rescore reads the stored scores instead and measures only
what the centred LDS needs: the row is answered again (it must give the stored answer, else `PeerMismatch`), each
peer's own held-out masks are drawn again (`peers.held_out_masks`, the masks its row was scored on) and measured by the
project's removal, and both LDS are computed on them. The raw one comes back as the stored one (`lds_stored` keeps
it, and `rescore_lines` compares them), exactly on the machine and batch size that stored it, and within a few swaps
of near-tied masks on another (float32 log p moves by ~1e-5): a check that the row, its sentences and its masks are
the ones the scores were fitted for. Cost: one greedy answer and 32 removal passes a peer, a few seconds a question on
the embedded model.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .lds import raw_and_centred
from .peers import PeerConfig, PeerMismatch, centred_of, held_out_masks, our_logprobs, prepare
from .resumable import measure_rows, read_results


def rescored_row(bundle, row: dict[str, Any], stored: dict[str, Any], cfg: PeerConfig) -> dict[str, Any]:
    """`stored` (a row of `lds --peers`) measured again for the peers of `cfg.peers` it holds: each one's raw and
    centred LDS on its own held-out masks, its top-k drops as stored.

    Raises:
        PeerMismatch: the row's answer is not the stored one.
        InputError: no answer, or fewer than 2 context sentences.
    """
    t0 = time.perf_counter()
    p = prepare(bundle, row, cfg)
    if p.row.attr.generated_text != stored["answer"]:
        answer = p.row.attr.generated_text
        raise PeerMismatch(f"Row {row['id']!r}: the model answers {answer!r}, not the stored answer.")
    methods, entries = {}, {}
    for name in (n for n in cfg.peers if n in stored.get("peers", {})):
        scores = np.asarray(stored["peers"][name]["scores"], dtype=np.float64)  # (S,)
        if len(scores) != len(p.row.sentences):
            raise PeerMismatch(f"Row {row['id']!r}: {len(scores)} stored scores for {len(p.row.sentences)} sentences.")
        count = stored["peers"][name].get("n_masks", cfg.masks)  # as many as its row was scored on
        masks = held_out_masks(name, len(scores), dataclasses.replace(cfg, masks=count))  # (M, S)
        total = our_logprobs(bundle, p, masks).sum(axis=1)  # (M,)
        got = raw_and_centred(total, masks, scores, centred_of(p, scores))
        methods[name] = {**stored["methods"][name], **got}
        entries[name] = {**stored["peers"][name], **got, "lds_stored": stored["peers"][name]["lds"]}
    return {"id": row["id"], "answer": stored["answer"], "dtype": p.row.attr.meta.get("dtype"),
            "n_sentences": len(p.row.sentences), "n_response_tokens": p.row.k, "methods": methods, "peers": entries,
            "seconds": time.perf_counter() - t0, "command": cfg.command}  # fmt: skip


def rescore_peers(bundle, rows: list[dict[str, Any]], stored_path: str | Path, cfg: PeerConfig,
                  results_path: str | Path | None = None,
                  log: Callable[[str], None] | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """`rescored_row` on every row of `rows` that `stored_path` holds with peers' scores and `results_path` does not
    (each appended as it finishes, so a rerun resumes). Returns the results of those rows, in row order."""
    stored = {r["id"]: r for r in read_results(stored_path) if r.get("peers")}
    chosen = [r for r in rows if r["id"] in stored]
    done = {r["id"]: r for r in read_results(results_path)}
    measure_rows(chosen, lambda row: rescored_row(bundle, row, stored[row["id"]], cfg), done, results_path,
                 bundle.model, log)  # fmt: skip
    return [done[r["id"]] for r in chosen if r["id"] in done]


def rescore_lines(rows: list[dict[str, Any]]) -> list[str]:
    """One line per peer, over its rescored rows: the mean raw LDS now and as stored, on how many rows they agree to
    1e-6, and the largest gap (another CPU or batch size moves log p by ~1e-5, which can swap near-tied masks)."""
    lines = []
    for name in dict.fromkeys(n for r in rows for n in r.get("peers", {})):
        pairs = [(e["lds"], e["lds_stored"]) for r in rows if (e := r.get("peers", {}).get(name))]
        known = [(a, b) for a, b in pairs if a is not None and b is not None]
        if not known:
            continue
        now, stored = (float(np.mean(v)) for v in zip(*known))
        same = sum(abs(a - b) <= 1e-6 for a, b in known)
        gap = max(abs(a - b) for a, b in known)
        lines.append(f"{name}: raw LDS {now:.4f} now, {stored:.4f} stored, over {len(known)} rows; the same to 1e-6 "
                     f"on {same}, largest gap {gap:.2e}")  # fmt: skip
    return lines
