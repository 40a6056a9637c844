"""The app's load tests, one script with four modes: concurrent API clients with cancels and disconnects mixed in
(the default), a cancel scenario, a crowd, and a flood.

    .venv/bin/python scripts/load_test.py [--clients 8] [--requests 3] [--url http://127.0.0.1:PORT] [--json out.json]
    .venv/bin/python scripts/load_test.py --scenario       # a long request cancelled, then short ones
    .venv/bin/python scripts/load_test.py --crowd 1,4 [--rounds 4]   # N visitors pressing Generate at once
    .venv/bin/python scripts/load_test.py --flood 30 [--rounds 3]    # one client's 30 requests, then a second visitor

Without --url it starts `app.py` on a free loopback port (with EXPLAINER_LOG=DEBUG, so the library logs when a
request takes and releases the model) and stops it at the end. It never talks to anything but the loopback address.

What it checks:
- every completed request returns the same top-token table as the same request run alone before the load
  (a mismatch means one visitor's result was computed from another's attention);
- cancels answer at once (the time of the cancel call itself is reported);
- requests that were cancelled or disconnected (a client that closes its event stream mid-request) stop: in the
  app's log, no two requests ever hold the model at once, and the gap from a cancel to the release of the model is
  reported;
- completed requests, errors, p50/p95 latency, and the app's peak memory (VmHWM, when this script started it).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import httpx
from gradio_client import Client

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the library, run from anywhere
from explainer.bench.crowd import at_once, summary  # noqa: E402
from explainer.bench.percentiles import percentile  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CROWD_METHODS = ["macs", "rollout"]
CROWD_NEW_TOKENS = 32
SHORT = [
    ("What is the capital of France?", ["macs", "rollout"]),
    ("Why does the sky look blue on a clear day? Answer in one sentence.", ["macs", "rollout"]),
    ("Name three primary colours.", ["macs", "random"]),
]
LONG_ATMAN = ["macs", "atman"]  # AtMan on ~1,000 prompt tokens takes minutes: it is cancelled long before it ends


def long_prompt() -> str:
    text = json.loads((ROOT / "assets" / "examples.json").read_text(encoding="utf-8"))[0]["prompt"]
    context = text.split("\n\nQuestion:")[0]
    return (context + "\n\n") * 8 + "Question: Who was the first keeper of the lighthouse?"  # ~1,000 tokens


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_app(port: int, log_path: Path) -> subprocess.Popen:
    env = {**os.environ, "GRADIO_SERVER_NAME": "127.0.0.1", "GRADIO_SERVER_PORT": str(port), "EXPLAINER_LOG": "DEBUG"}
    env.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    log = open(log_path, "w")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen([sys.executable, "app.py"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 180
    while time.time() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise SystemExit(f"the app exited early; see {log_path}")
        time.sleep(1)
    proc.kill()
    raise SystemExit("the app did not start within 180 s")


def table_of(saved: str) -> str:
    """What must not depend on other visitors in /explain's result (its saved-result JSON): the answer and every
    method's scores (not the timings), as text (NaN scores compare equal)."""
    data = json.loads(saved)
    return json.dumps({"answer": data["generated_token_ids"], **{m: d["z"] for m, d in data["methods"].items()}})


def explain_args(prompt: str, methods: list[str], max_new: int = 16) -> tuple:
    # the public /explain's prompt, methods, max_new_tokens, chat_template, answer (none), method_options (defaults)
    return (prompt, methods, max_new, True, "", None)


def peak_rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def disconnect(url: str, prompt: str, methods: list[str], after: float) -> float:
    """Join the queue over raw HTTP, read the event stream until the job starts, wait, then drop the connection."""
    session = uuid.uuid4().hex[:10]
    info = httpx.get(f"{url}/config", timeout=10).json()
    fn_index = next(i for i, d in enumerate(info["dependencies"]) if d.get("api_name") == "explain")
    body = {"data": list(explain_args(prompt, methods, 32)), "fn_index": fn_index, "session_hash": session,
            "event_data": None, "trigger_id": None}  # fmt: skip
    httpx.post(f"{url}/gradio_api/queue/join", json=body, timeout=10).raise_for_status()
    with httpx.stream("GET", f"{url}/gradio_api/queue/data", params={"session_hash": session}, timeout=None) as r:
        for line in r.iter_lines():
            if "process_starts" in line:
                break
        time.sleep(after)
    return time.time()  # the moment the connection was closed


def main() -> int:
    p = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--url", help="an app already running on loopback (default: start one)")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--requests", type=int, default=3, help="requests per client")
    p.add_argument("--cancel-after", type=float, default=4.0, help="seconds before a long request is cancelled")
    p.add_argument("--json", help="write the figures here")
    p.add_argument(
        "--scenario", action="store_true",
        help="instead of the load: one short request, a long AtMan request cancelled after 12 s, the short request "
        "three more times (tables must be equal, and none may start before the cancelled work released the model)",
    )  # fmt: skip
    p.add_argument(
        "--crowd", help="instead of the load: for each N in this list (e.g. 1,4,16), N visitors ask the QA example "
        "(MACS + Rollout, 32 new tokens) at once; reports p50/p95 time to the first token and to the full answer, "
        "tokens/s over all visitors, and mismatches of each visitor's answer, maps and table against a solo run",
    )  # fmt: skip
    p.add_argument("--crowd-prompts", choices=("qa", "mixed", "distinct"), default="qa",
                   help="qa: all the QA example; mixed: the examples in turn; distinct: no two visitors alike")
    p.add_argument("--rounds", type=int, default=1, help="with --crowd or --flood: this many rounds, alternating")
    p.add_argument(
        "--flood", type=int, help="instead of the load: one client sends this many requests at once and a second "
        "visitor then asks once; the second visitor's time against a quiet app (alternating rounds), and the flood's "
        "requests answered, refused with a message, and lost",
    )  # fmt: skip
    args = p.parse_args()

    proc = None
    log_path = Path("/tmp") / f"load-test-app-{os.getpid()}.log"
    if args.url:
        if not re.match(r"^https?://(127\.0\.0\.1|localhost)(:\d+)?/?$", args.url):
            raise SystemExit("--url must be a loopback address")
        url = args.url.rstrip("/")
    else:
        port = free_port()
        proc = start_app(port, log_path)
        url = f"http://127.0.0.1:{port}"
    try:
        if args.flood:
            return flood(url, args.flood, args.rounds, args.json)
        if args.crowd:
            return crowd(url, [int(n) for n in args.crowd.split(",")], args.crowd_prompts, args.json, args.rounds)
        return scenario(url, proc, log_path) if args.scenario else run(url, args, proc, log_path)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)


def run(url: str, args, proc, log_path: Path) -> int:
    print(f"app at {url}", flush=True)
    client = Client(url, verbose=False)
    reference = {}
    for prompt, methods in SHORT:  # each request alone, before the load
        reference[prompt] = table_of(client.predict(*explain_args(prompt, methods), api_name="/explain"))
    print(f"reference tables: {len(reference)}", flush=True)

    lock = threading.Lock()
    stats = {"completed": 0, "mismatches": 0, "errors": [], "cancelled": 0, "disconnected": 0}
    latencies: list[float] = []
    cancel_calls: list[float] = []
    stop_marks: list[float] = []  # when a cancel or disconnect happened
    big = long_prompt()

    def client_loop(c: int) -> None:
        own = Client(url, verbose=False)
        for r in range(args.requests):
            kind = "normal"
            if r == 1 and c % 4 == 0:
                kind = "cancel"
            elif r == 1 and c % 4 == 2:
                kind = "disconnect"
            try:
                if kind == "cancel":
                    job = own.submit(*explain_args(big, LONG_ATMAN, 32), api_name="/explain")
                    time.sleep(args.cancel_after)
                    t0 = time.perf_counter()
                    job.cancel()
                    with lock:
                        cancel_calls.append(time.perf_counter() - t0)
                        stop_marks.append(time.time())
                        stats["cancelled"] += 1
                    continue
                if kind == "disconnect":
                    closed = disconnect(url, big, LONG_ATMAN, args.cancel_after)
                    with lock:
                        stop_marks.append(closed)
                        stats["disconnected"] += 1
                    continue
                prompt, methods = SHORT[(c + r) % len(SHORT)]
                t0 = time.perf_counter()
                out = own.predict(*explain_args(prompt, methods), api_name="/explain")
                dt = time.perf_counter() - t0
                with lock:
                    latencies.append(dt)
                    stats["completed"] += 1
                    if table_of(out) != reference[prompt]:
                        stats["mismatches"] += 1
            except Exception as e:  # counted and reported, the load goes on
                with lock:
                    stats["errors"].append(f"client {c} request {r} ({kind}): {type(e).__name__}: {e}")

    start = time.time()
    threads = [threading.Thread(target=client_loop, args=(c,)) for c in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.time() - start
    time.sleep(2)

    holds = parse_holds(log_path) if proc is not None else []
    overlaps = sum(1 for a, b in zip(holds, holds[1:]) if b[0] < a[1])
    # for each cancel/disconnect: the first release of the model after it
    releases = [r for _, r in holds]
    stop_to_release = [min((r - s for r in releases if r >= s), default=float("nan")) for s in stop_marks]
    figures = {
        "clients": args.clients,
        "requests_per_client": args.requests,
        "completed": stats["completed"],
        "cancelled": stats["cancelled"],
        "disconnected": stats["disconnected"],
        "errors": len(stats["errors"]),
        "error_messages": stats["errors"],
        "mismatches": stats["mismatches"],
        "latency_p50_s": statistics.median(latencies) if latencies else None,
        "latency_p95_s": percentile(latencies, 95),
        "cancel_call_max_s": max(cancel_calls) if cancel_calls else None,
        "stop_to_model_release_max_s": max(stop_to_release) if stop_to_release else None,
        "model_holds": len(holds),
        "overlapping_holds": overlaps,
        "peak_rss_mib": peak_rss_mib(proc.pid) if proc is not None else None,
        "wall_s": wall,
    }
    for key, value in figures.items():
        if key != "error_messages":
            print(f"{key:>28}: {value:.2f}" if isinstance(value, float) else f"{key:>28}: {value}")
    for message in stats["errors"]:
        print("  error:", message)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2), encoding="utf-8")
    ok = not stats["errors"] and not stats["mismatches"] and not overlaps
    return 0 if ok else 1


def scenario(url: str, proc, log_path: Path) -> int:
    prompt, methods = SHORT[0]
    client = Client(url, verbose=False)
    first = table_of(client.predict(*explain_args(prompt, methods), api_name="/explain"))
    job = client.submit(*explain_args(long_prompt(), LONG_ATMAN, 32), api_name="/explain")
    time.sleep(12)
    t0 = time.perf_counter()
    job.cancel()
    cancel_call = time.perf_counter() - t0
    cancelled_at = time.time()
    follow = []
    for _ in range(3):
        t1 = time.time()
        table = table_of(client.predict(*explain_args(prompt, methods), api_name="/explain"))
        follow.append((t1, time.time() - t1, table == first))
    time.sleep(1)
    holds = parse_holds(log_path) if proc is not None else []
    # the cancelled request is the hold that was running when the cancel came
    cancelled = [h for h in holds if h[0] <= cancelled_at <= h[1]]
    released = cancelled[0][1] if cancelled else None
    later = [h for h in holds if h[0] > cancelled_at]
    print(f"cancel call: {cancel_call:.2f} s")
    if released is not None:
        print(f"cancelled work released the model {released - cancelled_at:.2f} s after the cancel")
    for i, (_, seconds, same) in enumerate(follow, 1):
        print(f"follow-up {i}: {seconds:.2f} s, table identical to the first: {same}")
    starts_after = released is None or all(h[0] >= released for h in later)
    print(f"no follow-up started before the cancelled work stopped: {starts_after}")
    return 0 if all(same for _, _, same in follow) and starts_after and cancelled else 1


def parse_holds(log_path: Path) -> list[tuple[float, float]]:
    """(acquired, released) times of every model hold in the app's debug log, in order."""
    holds, start = [], None
    for line in log_path.read_text(errors="replace").splitlines():
        if m := re.search(r"model \w+ acquired at ([\d.]+)", line):
            start = float(m.group(1))
        elif (m := re.search(r"model \w+ released at ([\d.]+)", line)) and start is not None:
            holds.append((start, float(m.group(1))))
            start = None
    return holds


# The crowd (--crowd): N visitors press Generate at once, each with its own gradio_client.



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
    job = client.submit(prompt=prompt, methods=CROWD_METHODS, max_new_tokens=CROWD_NEW_TOKENS, api_name="/explain")
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
        "first_token_p95_s": percentile([v["first_s"] for v in done], 95),
        "full_answer_p50_s": statistics.median(v["total_s"] for v in done),
        "full_answer_p95_s": percentile([v["total_s"] for v in done], 95),
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


# The flood (--flood F): one client sends F requests at once, a second visitor then asks once.

FLOOD_PROMPT, FLOOD_METHODS, FLOOD_NEW_TOKENS = SHORT[0][0], SHORT[0][1], 16


def ask_once(client: Client) -> float:
    """The second visitor's request (the flood's own prompt and methods): its seconds until the full answer."""
    t0 = time.perf_counter()
    client.predict(*explain_args(FLOOD_PROMPT, FLOOD_METHODS, FLOOD_NEW_TOKENS), api_name="/explain")
    return time.perf_counter() - t0


def flood_once(url: str, n: int) -> dict:
    """One round: one client submits `n` requests at once; once they are at the app, a second client asks once.
    Each flood request ends answered (a result), refused with a message (an error saying why and when to try again),
    or lost (anything else: an error without that message, or no end within the wait)."""
    flooder, second = Client(url, verbose=False), Client(url, verbose=False)
    jobs = [flooder.submit(*explain_args(FLOOD_PROMPT, FLOOD_METHODS, FLOOD_NEW_TOKENS), api_name="/explain")
            for _ in range(n)]  # fmt: skip
    time.sleep(1.0)  # the flood reaches the app first
    seconds = ask_once(second)
    counts = {"answered": 0, "refused": 0, "lost": 0}
    messages = set()
    for job in jobs:
        try:
            json.loads(job.result(timeout=600))
            counts["answered"] += 1
        except Exception as e:  # refused (with its message) or lost
            text = str(e)
            refused = "Try again" in text
            counts["refused" if refused else "lost"] += 1
            messages.add(re.sub(r"\d+(\.\d+)?", "N", text)[:200] if refused else f"{type(e).__name__}: {text}"[:200])
    for c in (flooder, second):
        c.close()
    return {"flood": n, "second_visitor_s": seconds, **counts, "messages": sorted(messages)}


def flood(url: str, n: int, rounds: int, json_path: str | None) -> int:
    """Rounds alternating quiet (the second visitor alone) and flood; the median of each, and their ratio."""
    warm = Client(url, verbose=False)
    ask_once(warm)  # loads the model
    quiet, rows = [], []
    for r in range(max(1, rounds)):
        quiet.append(ask_once(warm))
        rows.append(flood_once(url, n))
        row = rows[-1]
        print(f"round {r + 1}: quiet {quiet[-1]:.2f} s; behind a flood of {n}: {row['second_visitor_s']:.2f} s; "
              f"flood answered {row['answered']}, refused with a message {row['refused']}, lost {row['lost']}",
              flush=True)  # fmt: skip
    warm.close()
    behind = statistics.median(row["second_visitor_s"] for row in rows)
    figures = {
        "flood": n, "rounds": len(rows), "quiet_median_s": statistics.median(quiet), "behind_flood_median_s": behind,
        "ratio": behind / statistics.median(quiet), "answered": sum(r["answered"] for r in rows),
        "refused": sum(r["refused"] for r in rows), "lost": sum(r["lost"] for r in rows), "rounds_detail": rows,
        "quiet_s": quiet,
    }  # fmt: skip
    print(f"second visitor: {behind:.2f} s behind a flood of {n} vs {figures['quiet_median_s']:.2f} s quiet "
          f"(medians of {len(rows)} rounds) = {figures['ratio']:.2f}x; flood requests answered {figures['answered']}, "
          f"refused with a message {figures['refused']}, lost {figures['lost']}")  # fmt: skip
    for message in sorted({m for r in rows for m in r["messages"]}):
        print("  refusal:", message)
    if json_path:
        Path(json_path).write_text(json.dumps(figures, indent=2), encoding="utf-8")
    return 0 if figures["lost"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
