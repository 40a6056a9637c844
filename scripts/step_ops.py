"""Tensor operations a decode step runs, counted on any machine: what a launch-bound GPU pays per token.

    python scripts/step_ops.py --prompt-tokens 64,4096 --methods plain,macs,macs+rollout
    python scripts/step_ops.py --prompt-tokens 1000 --methods macs+rollout --crowd 1,8

On a GPU a small model's decode step is bound by its kernel launches (docs/gpu.md): a CUDA graph replays them
without the host's calls, but each kernel still costs the GPU a few microseconds. So the number of ATen operators
that launch work (views left out) in one decode step, counted here with a `TorchDispatchMode`, is a proxy for a
step's cost there, and it does not depend on the machine it is counted on: what MACS or Rollout add to plain
decoding can be seen on a CPU before a GPU is lent. Counted for the static decode path (the step a CUDA graph
records, run eagerly) on a model of `--model`'s shipped configuration with random float32 weights (bfloat16 on a
CPU takes a per-layer upcast of the keys that CUDA's float32-output products do without,
`runtime.scores.float32_products`),
with Rollout's prompt rows in an accelerator's layout (`rollout.prompt_blocks`; `--cpu-layout` for a CPU's). With
`--crowd`, one round of the batched decode in its fixed shape (what its CUDA graph records) for that many rows at
once, each with its own prompt of about that length. Times are never measured here.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

VIEWS = {
    "alias", "as_strided", "chunk", "detach", "expand", "lift_fresh", "mT", "narrow", "numpy_T", "permute", "reshape",
    "select", "slice", "split", "squeeze", "t", "transpose", "unbind", "unsqueeze", "view", "_reshape_alias",
    "_unsafe_view",
}  # fmt: skip


def count_step(model, n: int, methods: list[str], steps: int = 4) -> dict:
    """Operators of one decode step of the static path (after `steps` - 1 warm steps): all, and those that are not
    views, by name."""
    import torch

    from explainer.decoding import static
    from explainer.decoding.job import DecodeJob
    from explainer.methods import get_method

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
            with _Count() as count:
                decoder.step()
    return _kernels(count.ops)


class _Count(TorchDispatchMode):
    """Counts the operators run within it, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func)] += 1
        return func(*args, **(kwargs or {}))


def _kernels(ops: collections.Counter) -> dict:
    """All operators, those that are not views, by name."""
    kernels = {f: c for f, c in ops.items() if f.split(".")[1] not in VIEWS}
    return {"ops": sum(ops.values()), "non_view_ops": sum(kernels.values()), "by_name": kernels}


def count_round(model, n: int, methods: list[str], rows: int, steps: int = 6) -> dict:
    """Operators of one round of the batched decode, fixed shape, `rows` rows decoding at once (prompts of n + i
    tokens): the median round (the first rounds also admit rows, the last ends them)."""
    import threading

    import torch

    from explainer.decoding import FIXED_SHAPE
    from explainer.decoding.batched import batched_steps, engine
    from explainer.decoding.job import DecodeJob
    from explainer.methods import get_method
    from explainer.runtime.session import hold

    rounds: list[collections.Counter] = []
    decode = engine.Batcher._decode

    def counted(self) -> None:
        with _Count() as count:
            decode(self)
        rounds.append(count.ops)

    def visit(i: int) -> None:
        ids = torch.randint(3, 300, (1, n + i), generator=torch.Generator().manual_seed(i))
        list(batched_steps(model, DecodeJob(ids, [get_method(m) for m in methods], steps), form=FIXED_SHAPE))

    engine.Batcher._decode = counted
    engine._batchers.clear()
    try:
        visitors = [threading.Thread(target=visit, args=(i,)) for i in range(rows)]
        with hold(model):  # all queue before the first round
            for v in visitors:
                v.start()
            while engine.counts(model)[1] < rows:
                threading.Event().wait(0.01)
        for v in visitors:
            v.join()
        engine.finish(model)
    finally:
        engine.Batcher._decode = decode
        engine._batchers.clear()
    full = [r for r in rounds if sum(r.values()) > 100]  # a round that only drops finished rows runs nothing
    return _kernels(sorted(full, key=lambda r: sum(r.values()))[len(full) // 2])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct", help="a shipped configuration")
    p.add_argument("--prompt-tokens", default="64,4096")
    p.add_argument("--methods", default="plain,macs,macs+rollout", help="sets joined by '+', 'plain' for none")
    p.add_argument("--crowd", help="rows decoding at once, e.g. 1,8: one batch round each instead of a static step")
    p.add_argument("--cpu-layout", action="store_true", help="Rollout's prompt rows as a CPU keeps them")
    p.add_argument("--json", help="write the counts here")
    a = p.parse_args()
    import torch

    from explainer.bench.synthetic import random_model
    from explainer.methods import rollout

    if not a.cpu_layout and hasattr(rollout, "ACCELERATOR_PROMPT_BLOCKS"):
        rollout.CPU_PROMPT_BLOCKS = rollout.ACCELERATOR_PROMPT_BLOCKS
    model, _ = random_model(a.model, torch.float32, "cpu", positions=None)
    rows = []
    for n in (int(x) for x in a.prompt_tokens.split(",")):
        for spec in a.methods.split(","):
            methods = [] if spec == "plain" else spec.split("+")
            for crowd in [int(x) for x in a.crowd.split(",")] if a.crowd else [None]:
                counted = count_step(model, n, methods) if crowd is None else count_round(model, n, methods, crowd)
                rows.append({"prompt_tokens": n, "methods": spec, "rows": crowd, **counted})
                what = "a step" if crowd is None else f"a round of {crowd} rows"
                print(f"{n:>6} tokens  {spec:<14} {counted['non_view_ops']:>6} operators {what}", flush=True)
    if a.json:
        layout = "cpu" if a.cpu_layout else "accelerator"
        Path(a.json).write_text(json.dumps({"model": a.model, "rollout_layout": layout, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
