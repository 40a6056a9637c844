"""Where two runs of one request part, bit for bit: the GPU probe of issue #51's lone visitor whose numbers differ
from its own earlier run (the front end is `python -m explainer crowd --fingerprints`).

On an H200 (2026-12-04, docs/gpu.md) one visitor alone, run again in the same process, differed from its first run
from decode step 21 on, with torch's deterministic algorithms on and with addmm off cuBLASLt; the runs that differed
agreed with each other bit for bit. So some kernel is chosen differently from run to run. This names it: a forward
hook on every module keeps a bitwise fingerprint of each call's output tensors on the device (no host read inside the
run), and the first call whose fingerprint differs between two runs gives the module and the decode step (each call of
the model itself ends a step; the prefill's is step 0).

A fingerprint is the sum of the output's bits read as integers and the same sum weighted by position: any one element
that differs changes it. Calls made while a CUDA graph is being captured are not kept (a graph's replays would not
run the hook), so the probe runs the batch's step eagerly (`EXPLAINER_DECODE=batched:fixed-shape`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from ..runtime.host import to_numpy

_AS_INTEGERS = {2: torch.int16, 4: torch.int32, 8: torch.int64}  # a float's bits, by its size in bytes


def fingerprint(t: torch.Tensor) -> torch.Tensor:
    """(2,) int64 on `t`'s device: the sum of `t`'s elements' bits as integers, and that sum weighted by position."""
    flat = t.detach().contiguous().reshape(-1)
    if flat.is_floating_point() or flat.is_complex():
        flat = flat.view(_AS_INTEGERS[flat.element_size()])
    ints = flat.to(torch.int64)
    return torch.stack([ints.sum(), (ints * torch.arange(1, ints.numel() + 1, device=ints.device)).sum()])


def _tensors(output) -> list[torch.Tensor]:
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, (tuple, list)):
        return [t for t in output if isinstance(t, torch.Tensor)]
    return [v for v in getattr(output, "values", lambda: [])() if isinstance(v, torch.Tensor)]  # a ModelOutput


@contextlib.contextmanager
def fingerprints(model: torch.nn.Module) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Within the block, every module call of `model` appends (its name, its outputs' fingerprints stacked) to the
    yielded list, in call order; the model's own calls are named "" (one a step). The hooks go with the block."""
    calls: list[tuple[str, torch.Tensor]] = []

    def keep(name: str):
        def hook(module, args, output) -> None:
            if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
                return
            found = _tensors(output)
            if found:
                calls.append((name, torch.stack([fingerprint(t) for t in found])))

        return hook

    handles = [m.register_forward_hook(keep(name)) for name, m in model.named_modules()]
    try:
        yield calls
    finally:
        for h in handles:
            h.remove()


def parting(a: list[tuple[str, torch.Tensor]], b: list[tuple[str, torch.Tensor]]) -> dict | None:
    """The first call where two runs' fingerprints differ: its index, module, decode step (the calls of the model
    itself before it: a forward hook runs when its module's call ends) and how many calls each run made; None where
    they agree throughout. One host read a run."""
    n = min(len(a), len(b))
    same_shape = [x.shape == y.shape for (_, x), (_, y) in zip(a, b)]
    values = [to_numpy(torch.cat([x.reshape(-1) for _, x in run[:n]])) if n else None for run in (a, b)]
    offset, step = 0, 0
    for i in range(n):
        (name, x), (other, _) = a[i], b[i]
        width = x.numel()
        if (
            name != other
            or not same_shape[i]
            or (values[0][offset : offset + width] != values[1][offset : offset + width]).any()
        ):
            return {"call": i, "module": name if name == other else f"{name} / {other}", "step": step,
                    "calls": [len(a), len(b)]}  # fmt: skip
        offset += width
        step += name == ""  # the model's own hook runs after its modules': the end of a step
    if len(a) != len(b):
        return {"call": n, "module": None, "step": step, "calls": [len(a), len(b)]}
    return None


def lone_runs(bundle, request, runs: int) -> dict:
    """`request` alone `runs` times, each run's fingerprints against the first run's: where each later run parts
    from it (None: bit for bit the same)."""
    from ..decoding import enable_batching
    from ..decoding.batched.engine import finish
    from ..explain import explain_request

    enable_batching()
    try:
        explain_request(bundle, request)  # warm-up: a process's first run allocates and chooses for the first time
        recorded = []
        for _ in range(runs):
            with fingerprints(bundle.model) as calls:
                explain_request(bundle, request)
            recorded.append(calls)
    finally:
        finish(bundle.model, timeout=60)
    first = recorded[0]
    return {"runs": runs, "calls": len(first), "steps": sum(name == "" for name, _ in first),
            "partings": [parting(first, r) for r in recorded[1:]]}  # fmt: skip
