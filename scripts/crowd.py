"""The crowd test of `load_test.py --crowd`: N visitors press Generate at once, each with its own gradio_client.

Each visitor calls the public /explain (MACS + Rollout, 32 new tokens) and watches its stream of growing results:
the time to the first token is when the first result with an answer token arrives, the time to the full answer when
the job ends. Before the crowds, each prompt runs once alone: the solo reference (its time is the "1 visitor alone"
figure); then one crowd of the largest size runs uncounted (a freshly started app's first crowds also grow its
memory, `explainer/runtime/malloc.py`). A mismatch is a visitor whose answer token ids, maps (every method's raw
scores and z-scores) or step probabilities and entropies differ from that solo run's in any digit of the saved result.
"""

from __future__ import annotations

import json
import re
import statistics
import time
from pathlib import Path

from crowd_rounds import at_once, summary
from gradio_client import Client

ROOT = Path(__file__).resolve().parents[1]
METHODS = ["macs", "rollout"]
NEW_TOKENS = 32


def views(saved: str) -> dict[str, str]:
    """What is compared with the solo run, from the result's JSON: the answer's token ids ("tokens"), each method's
    raw map and z-scores ("maps"), and the step probabilities and entropies ("steps"); timings are left out."""
    result = json.loads(saved)
    maps = {name: [m.get("raw"), m.get("z")] for name, m in sorted(result["methods"].items())}
    return {
        "tokens": json.dumps(result["generated_token_ids"]),
        "maps": json.dumps(maps),
        "steps": json.dumps(result.get("step_scores")),
    }


COMPARED = ("tokens", "maps", "steps")
FIRST_TOKEN = re.compile(r'"generated_token_ids":\s*\[\s*\d')  # a streamed result with an answer token


def prompts(kind: str, visitors: int = 1) -> list[str]:
    """What the visitors ask, in turn: "qa" the QA example (every visitor the same prompt: their rows share one
    prefill), "mixed" the examples, "distinct" the QA example with each visitor's own last line (no two alike)."""
    examples = [e["prompt"] for e in json.loads((ROOT / "assets" / "examples.json").read_text(encoding="utf-8"))]
    if kind == "distinct":
        return [f"{examples[0]}\n(Visitor {i + 1}.)" for i in range(visitors)]
    return examples if kind == "mixed" else examples[:1]


def visit(client: Client, prompt: str) -> dict:
    """One visitor's request through the public /explain: its times, its number of answer tokens, the views compared.
    The first token's time is when the first streamed result with an answer token arrives."""
    t0 = time.perf_counter()
    job = client.submit(prompt=prompt, methods=METHODS, max_new_tokens=NEW_TOKENS, api_name="/explain")
    first = None
    while first is None and not job.done():  # then it waits for the end without polling: the app's cores are shared
        if any(FIRST_TOKEN.search(str(o)) for o in job.outputs()):
            first = time.perf_counter() - t0
        time.sleep(0.01)
    saved = job.result()
    total = time.perf_counter() - t0
    return {
        "first_s": total if first is None else first,
        "total_s": total,
        "tokens": len(json.loads(saved)["generated_token_ids"]),
        "views": views(saved),
        "decode": json.loads(saved)["meta"]["decode"]["path"],  # `decoding.DecodeChoice.record`
        "batch_size": json.loads(saved)["meta"]["decode"]["batch_size"],
    }


def crowd_once(url: str, n: int, asked: list[str], solo: dict[str, dict]) -> dict:
    clients = [Client(url, verbose=False) for _ in range(n)]  # connected before the clock starts
    visits, wall = at_once(n, lambda i: visit(clients[i], asked[i % len(asked)]))
    for c in clients:
        c.close()  # its heartbeat stream would stay open on the app through the next rounds
    done = [v for v in visits if isinstance(v, dict)]
    mismatches = {
        name: sum(v["views"][name] != solo[asked[i % len(asked)]]["views"][name] for i, v in enumerate(visits)
                  if isinstance(v, dict))
        for name in COMPARED
    }  # fmt: skip
    alone = statistics.mean(solo[asked[i % len(asked)]]["total_s"] for i in range(n))
    return {
        "visitors": n,
        "errors": [f"{type(v).__name__}: {v}" for v in visits if not isinstance(v, dict)],
        "all_served_s": wall,
        "vs_one_alone": wall / alone,
        "first_token_p50_s": statistics.median(v["first_s"] for v in done),
        "first_token_p95_s": _p95([v["first_s"] for v in done]),
        "full_answer_p50_s": statistics.median(v["total_s"] for v in done),
        "full_answer_p95_s": _p95([v["total_s"] for v in done]),
        "tokens_per_s": sum(v["tokens"] for v in done) / wall,
        "mismatches": mismatches,
        "batched": sorted({str(v.get("decode")) for v in done}),
        "largest_batch": max((v.get("batch_size") or 1 for v in done), default=0),
        "mismatched_visitors": sum(
            any(v["views"][k] != solo[asked[i % len(asked)]]["views"][k] for k in COMPARED)
            for i, v in enumerate(visits)
            if isinstance(v, dict)
        ),
    }


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(0.95 * len(ordered) + 0.5) - 1))]


def crowd(url: str, counts: list[int], kind: str, json_path: str | None, rounds: int = 1) -> int:
    """Each crowd size of `counts` in turn, the whole list `rounds` times (1, 4, 1, 4, ...), then the medians."""
    asked = prompts(kind, max(counts))
    warm = Client(url, verbose=False)
    visit(warm, asked[0])  # loads the model: no crowd waits for the download or the load
    solo = {p: visit(warm, p) for p in asked}
    print(f"app at {url}; solo: " + ", ".join(f"{s['total_s']:.2f} s ({s['tokens']} tokens)" for s in solo.values()))
    warm_up = crowd_once(url, max(counts), asked, solo)  # not counted: the app's first crowd also grows its memory
    print(f"warm-up crowd of {warm_up['visitors']}: {warm_up['all_served_s']:.2f} s (not counted)")
    rows = [crowd_once(url, n, asked, solo) for _ in range(rounds) for n in counts]
    for row in rows:
        print(
            f"{row['visitors']:>3} visitors: all served in {row['all_served_s']:.2f} s ({row['vs_one_alone']:.2f}x one "
            f"alone); first token p50 {row['first_token_p50_s']:.2f} s p95 {row['first_token_p95_s']:.2f} s; full "
            f"answer p50 {row['full_answer_p50_s']:.2f} s p95 {row['full_answer_p95_s']:.2f} s; "
            f"{row['tokens_per_s']:.1f} tokens/s; mismatched visitors {row['mismatched_visitors']} "
            f"{row['mismatches']}; errors {len(row['errors'])}"
        )
        for e in row["errors"]:
            print("  error:", e)
    medians = summary(rows)
    for m in medians:
        ratio = "" if m["vs_one_alone_median"] is None else f" = {m['vs_one_alone_median']:.2f}x the 1-visitor rounds"
        print(f"{m['visitors']:>3} visitors, median of {m['rounds']} rounds: {m['all_served_median_s']:.2f} s{ratio}")
    if json_path:
        figures = {"solo": {p[:40]: {k: s[k] for k in ("first_s", "total_s", "tokens")} for p, s in solo.items()}}
        figures["medians"] = medians
        Path(json_path).write_text(json.dumps({**figures, "crowds": rows}, indent=2), encoding="utf-8")
    return 0 if all(not r["errors"] and not r["mismatched_visitors"] for r in rows) else 1
