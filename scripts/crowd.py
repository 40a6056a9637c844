"""The crowd test of `load_test.py --crowd`: N visitors press Generate at once, each with its own gradio_client.

Each visitor submits /explain (MACS + Rollout, 32 new tokens) and watches its stream: the time to the first token
is when the first update with an answer token arrives, the time to the full answer when the job ends. Before the
crowds, each prompt runs once alone: the solo reference (its time is the "1 visitor alone" figure). A mismatch is a
visitor whose answer strip, heatmap or top-token table differs from that solo run's in any character.
"""

from __future__ import annotations

import json
import re
import statistics
import threading
import time
from pathlib import Path

from gradio_client import Client

ROOT = Path(__file__).resolve().parents[1]
METHODS = ["macs", "rollout"]
NEW_TOKENS = 32
COMPARED = {"answer": 0, "heatmap": 1, "table": 2}  # outputs of /explain that show the answer and the maps
SECONDS = re.compile(r"\\u00b7 \d+\.\d+ s<")  # a method's run time in the heatmap's headings: not part of the maps
TITLES = re.compile(r'title=\\"[^"\\]*\\"')  # the answer strip's per-token tooltips (probability, entropy)


def views(out: tuple) -> dict[str, str]:
    """The compared outputs as text; "tokens" is the answer strip without its tooltips (the answer tokens alone)."""
    shown = {name: SECONDS.sub("<", json.dumps(out[i], sort_keys=True)) for name, i in COMPARED.items()}
    return {**shown, "tokens": TITLES.sub("", shown["answer"])}


def prompts(kind: str) -> list[str]:
    examples = [e["prompt"] for e in json.loads((ROOT / "assets" / "examples.json").read_text(encoding="utf-8"))]
    return examples if kind == "mixed" else examples[:1]


def visit(client: Client, prompt: str) -> dict:
    """One visitor's request: its times, its number of answer tokens and the views compared."""
    args = (prompt, METHODS, NEW_TOKENS, True, False, "", False, "token")
    t0 = time.perf_counter()
    job = client.submit(*args, api_name="/explain")
    first = None
    while not job.done():
        if first is None and any("xai-step" in str(o[0]) for o in job.outputs()):
            first = time.perf_counter() - t0
        time.sleep(0.01)
    out = job.result()
    total = time.perf_counter() - t0
    return {
        "first_s": total if first is None else first,
        "total_s": total,
        "tokens": int(out[3].get("maximum", 0)) if isinstance(out[3], dict) else 0,
        "views": views(out),
        "status": out[5],
    }


def crowd_once(url: str, n: int, asked: list[str], solo: dict[str, dict]) -> dict:
    clients = [Client(url, verbose=False) for _ in range(n)]  # connected before the clock starts
    visits: list[dict | BaseException] = [RuntimeError("no result")] * n
    start = threading.Barrier(n + 1)

    def run(i: int) -> None:
        start.wait()
        try:
            visits[i] = visit(clients[i], asked[i % len(asked)])
        except BaseException as e:  # counted as an error
            visits[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    done = [v for v in visits if isinstance(v, dict)]
    mismatches = {
        name: sum(v["views"][name] != solo[asked[i % len(asked)]]["views"][name] for i, v in enumerate(visits)
                  if isinstance(v, dict))
        for name in (*COMPARED, "tokens")
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
        "mismatched_visitors": sum(
            any(v["views"][k] != solo[asked[i % len(asked)]]["views"][k] for k in COMPARED)
            for i, v in enumerate(visits)
            if isinstance(v, dict)
        ),
    }


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(0.95 * len(ordered) + 0.5) - 1))]


def crowd(url: str, counts: list[int], kind: str, json_path: str | None) -> int:
    asked = prompts(kind)
    warm = Client(url, verbose=False)
    visit(warm, asked[0])  # loads the model: no crowd waits for the download or the load
    solo = {p: visit(warm, p) for p in asked}
    print(f"app at {url}; solo: " + ", ".join(f"{s['total_s']:.2f} s ({s['tokens']} tokens)" for s in solo.values()))
    rows = [crowd_once(url, n, asked, solo) for n in counts]
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
    if json_path:
        figures = {"solo": {p[:40]: {k: s[k] for k in ("first_s", "total_s", "tokens")} for p, s in solo.items()}}
        Path(json_path).write_text(json.dumps({**figures, "crowds": rows}, indent=2), encoding="utf-8")
    return 0 if all(not r["errors"] and not r["mismatched_visitors"] for r in rows) else 1
