"""Tensor operations a decode step runs, counted on any machine: what a launch-bound GPU pays per token.

    python scripts/step_ops.py --prompt-tokens 64,4096 --methods plain,macs,macs+rollout

On a GPU a small model's decode step is bound by its kernel launches (docs/gpu.md): a CUDA graph replays them
without the host's calls, but each kernel still costs the GPU a few microseconds. So the number of ATen operators
that launch work (views left out) in one decode step, counted here with a `TorchDispatchMode`, is a proxy for a
step's cost there, and it does not depend on the machine it is counted on: what MACS or Rollout add to plain
decoding can be seen on a CPU before a GPU is lent. Counted for the static decode path (the step a CUDA graph
records, run eagerly) on a model of `--model`'s shipped configuration with random float32 weights (bfloat16 on a
CPU takes a per-layer upcast of the keys that CUDA's float32-output products do without, `capture.float32_products`).
Times are never measured here.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

VIEWS = {
    "alias", "as_strided", "chunk", "detach", "expand", "lift_fresh", "narrow", "permute", "reshape", "select",
    "slice", "split", "squeeze", "t", "transpose", "unbind", "unsqueeze", "view", "_reshape_alias", "_unsafe_view",
}  # fmt: skip


def count_step(model, n: int, methods: list[str], steps: int = 4) -> dict:
    """Operators of one decode step of the static path (after `steps` - 1 warm steps): all, and those that are not
    views, by name."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from explainer.decoding import static
    from explainer.decoding.job import DecodeJob
    from explainer.methods import get_method

    class Count(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: collections.Counter = collections.Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops[str(func)] += 1
            return func(*args, **(kwargs or {}))

    ids = torch.randint(3, 300, (1, n), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        made = [get_method(m) for m in methods]
        for m in made:
            m.begin(n)
        decoder = static.StaticDecoder(model, DecodeJob(ids, made, steps + 1), None)
        decoder.prefill(ids)
        with decoder.capturing():
            for _ in range(steps - 1):
                decoder.step()
            with Count() as count:
                decoder.step()
    kernels = {f: c for f, c in count.ops.items() if f.split(".")[1] not in VIEWS}
    return {"ops": sum(count.ops.values()), "non_view_ops": sum(kernels.values()), "by_name": dict(kernels)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct", help="a shipped configuration")
    p.add_argument("--prompt-tokens", default="64,4096")
    p.add_argument("--methods", default="plain,macs,macs+rollout", help="sets joined by '+', 'plain' for none")
    p.add_argument("--json", help="write the counts here")
    a = p.parse_args()
    import torch
    from gpu_bench import random_model

    model, _ = random_model(a.model, torch.float32, "cpu", positions=None)
    rows = []
    for n in (int(x) for x in a.prompt_tokens.split(",")):
        for spec in a.methods.split(","):
            methods = [] if spec == "plain" else spec.split("+")
            counted = count_step(model, n, methods)
            rows.append({"prompt_tokens": n, "methods": spec, **counted})
            plain = next((r for r in rows if r["prompt_tokens"] == n and r["methods"] == "plain"), None)
            ratio = f"  plain/this {plain['non_view_ops'] / counted['non_view_ops']:.3f}" if plain else ""
            print(f"{n:>6} tokens  {spec:<14} {counted['non_view_ops']:>6} operators a step{ratio}", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps({"model": a.model, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
