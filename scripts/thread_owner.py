"""Whether `explain` after the caller's own torch work runs as fast as in a fresh process (issue #54, item 9).

Each measurement is a fresh process: it loads the embedded model, optionally runs one `model.generate` on its main
thread first ("after-generate"), warms `explain` up once, then times `--repeats` calls of `explain` with MACS
(`--prompt-tokens` of the bench's text, `--new-tokens` generated). The two kinds alternate `--rounds` times, so a
shared machine's load falls on both alike; the median of each kind and their ratio are printed (and written as JSON
with `--json`). Run it once per commit to compare (e.g. `PYTHONPATH=<checkout>`).

    python scripts/thread_owner.py --rounds 3 --json thread-owner.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time


def measure(kind: str, n: int, k: int, repeats: int, dtype: str) -> list[float]:
    """Seconds of `repeats` explain calls in this process, after a generate first when `kind` says so."""
    import torch

    from explainer import explain, load_model
    from explainer.bench.prompts import prompt_ids

    bundle = load_model(dtype=dtype, max_prompt_tokens=n)
    ids, _ = prompt_ids(bundle.tokenizer, n, None, None)
    prompt = bundle.tokenizer.decode(ids)
    if kind == "after-generate":
        with torch.inference_mode():
            bundle.model.generate(torch.tensor([ids[:64]]), max_new_tokens=4, do_sample=False)
    kwargs = dict(methods=["macs"], max_new_tokens=k, chat_template=False, answer=None)
    explain(bundle, prompt, **{**kwargs, "max_new_tokens": 2})  # warm-up
    seconds = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        explain(bundle, prompt, **kwargs)
        seconds.append(time.perf_counter() - t0)
    return seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--prompt-tokens", type=int, default=581)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=2, help="timed calls per process")
    p.add_argument("--rounds", type=int, default=3, help="processes of each kind, alternating")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--json", help="write the seconds and the ratio here")
    p.add_argument("--child", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        print(json.dumps(measure(a.child, a.prompt_tokens, a.new_tokens, a.repeats, a.dtype)))
        return
    runs: dict[str, list[float]] = {"fresh": [], "after-generate": []}
    for _ in range(a.rounds):
        for kind in runs:
            args = [sys.executable, __file__, "--child", kind, "--prompt-tokens", str(a.prompt_tokens),
                    "--new-tokens", str(a.new_tokens), "--repeats", str(a.repeats), "--dtype", a.dtype]  # fmt: skip
            out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
            runs[kind] += json.loads(out.strip().splitlines()[-1])
            print(kind, runs[kind][-a.repeats :], flush=True)
    fresh, after = statistics.median(runs["fresh"]), statistics.median(runs["after-generate"])
    summary = {"fresh_s": fresh, "after_generate_s": after, "ratio": after / fresh, "runs": runs, "args": vars(a)}
    print(f"median fresh {fresh:.2f} s, after a generate {after:.2f} s: ratio {after / fresh:.3f}")
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
