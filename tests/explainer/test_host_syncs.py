"""The generation loop reads from the device a fixed, small number of times per token.

On a GPU every read of a device value on the host (`.item()`, `.tolist()`, `int(t)`, `bool(t)`, a conversion to
numpy, a `nonzero`) waits for all queued work: a loop that syncs per layer or per row runs at the speed of its
launches. A torch function mode sees every such call on a CPU as well, so the count is checked here: per decode step
it is one read for the token, its probability and entropy, plus one per streaming method, whatever the prompt length
and the step. The guard is shown to catch a planted per-layer sync.
"""

from __future__ import annotations

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from explainer.decoding import DecodeJob, generate_steps
from explainer.explain import decode_choice
from explainer.methods import get_method
from explainer.methods.macs import MACS

from ..conftest import build_model

HOST_READS = frozenset(
    {"item", "tolist", "__int__", "__float__", "__bool__", "__index__", "numpy", "nonzero", "__array__"}
)


class CountHostReads(TorchFunctionMode):
    """Counts the torch calls that make the host wait for the device."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in HOST_READS:
            self.count += 1
        return func(*args, **(kwargs or {}))


def reads_per_step(model, n: int, methods: list, steps: int = 6, sinks=None) -> list[int]:
    """Host reads counted in each step of greedy generation from an n-token prompt; `methods` are names or method
    instances, `sinks` a `SinkTracker` for `generate_steps`."""
    ids = torch.arange(3, 3 + n)[None] % model.config.vocab_size  # (1, n)
    instances = [get_method(m) if isinstance(m, str) else m for m in methods]
    job = DecodeJob(ids, instances, steps)
    return reads_of_each_step(generate_steps(model, job, decode_choice(model, job), sinks=sinks))


def reads_of_each_step(gen) -> list[int]:
    """Host reads counted while each step of the stream `gen` is computed."""
    counts = []
    while True:
        with CountHostReads() as mode:
            try:
                next(gen)
            except StopIteration:
                break
        counts.append(mode.count)
    return counts


@pytest.mark.parametrize("kind", ["llama", "qwen2_sliding"])
def test_decode_steps_read_the_device_once_per_method_plus_one(kind):
    model = build_model(kind)
    for n in (5, 23):
        for methods in ([], ["macs"], ["macs", "rollout"]):
            counts = reads_per_step(model, n, methods)
            assert counts[1:] == [1 + len(methods)] * (len(counts) - 1), (n, methods, counts)


def test_the_count_catches_a_sync_per_layer(monkeypatch):
    model = build_model("llama")
    step = MACS.step

    def syncing_step(self, rows):
        for layer in rows:  # a planted per-layer check
            bool(layer.sum() > 0)
        return step(self, rows)

    monkeypatch.setattr(MACS, "step", syncing_step)
    counts = reads_per_step(model, 7, ["macs"])
    assert counts[1] == 2 + model.config.num_hidden_layers


# --- device work per token: kernels the capture adds per layer ----------------------------------------------------

VIEW_OPS = frozenset(
    {"view", "_unsafe_view", "reshape", "transpose", "t", "permute", "slice", "select", "unsqueeze", "squeeze",
     "expand", "as_strided", "alias", "detach", "split", "unbind", "lift_fresh", "resolve_conj", "resolve_neg"}
)  # fmt: skip


class CountKernels(TorchDispatchMode):
    """Counts the ATen ops that compute (a kernel launch each on a GPU); views and no-op conversions are free."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if name not in VIEW_OPS and not (name == "to" and out is args[0]):
            self.count += 1
        return out


def _decode_kernels(layers: int, methods: list, dtype: torch.dtype) -> int:
    model = build_model("llama", num_hidden_layers=layers).to(dtype)
    job = DecodeJob(torch.arange(3, 30)[None], [get_method(m) for m in methods], 4)
    gen = generate_steps(model, job, decode_choice(model, job))
    for _ in range(3):  # the prefill and two decode steps
        next(gen)
    with CountKernels() as mode:
        next(gen)
    return mode.count


@pytest.mark.parametrize("dtype, per_layer", [(torch.float32, 3), (torch.bfloat16, 5)], ids=["float32", "bfloat16"])
def test_macs_adds_few_kernels_per_layer_and_token(dtype, per_layer):
    """On a GPU a small model's decode step is bound by kernel launches (~55 tokens/s for SmolLM2-135M on an H200,
    docs/gpu.md), so what MACS costs there is the kernels its capture adds per layer: the last query's scores against
    the keys and their softmax (and, for a half-precision model, the float32 copies of q and k); plus a few per token
    for MACS's own reduction. Counted on the CPU as the ATen ops that compute, per decode step, from a 2- and a
    4-layer model."""
    plain = {layers: _decode_kernels(layers, [], dtype) for layers in (2, 4)}
    macs = {layers: _decode_kernels(layers, ["macs"], dtype) for layers in (2, 4)}
    extra_per_layer = ((macs[4] - macs[2]) - (plain[4] - plain[2])) / 2
    extra_per_token = (macs[2] - plain[2]) - 2 * extra_per_layer
    assert extra_per_layer <= per_layer, (plain, macs)
    assert extra_per_token <= 12, (plain, macs)
