"""Memory: free memory from the container, each method's need, and refusing a request before any work.

The need is checked against what the methods really keep (Rollout's stored rows, measured), a small budget
(`EXPLAINER_MEMORY_BUDGET`) refuses a long prompt with a message naming the limit and the alternative before any
forward pass, and the batched passes of the perturbation methods take their size from the device.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch

from explainer import explain
from explainer.faithfulness.soft import SoftConfig, soft_curves
from explainer.methods import get_method
from explainer.methods.atman import AtManConfig, atman_scores
from explainer.methods.rollout import Rollout
from explainer.models.loading import bundle_from_objects
from explainer.runtime import memory
from explainer.runtime.kv import MAX_TOKENS_PER_BATCH, TOKENS_PER_BATCH, batch_budget, packed_positions
from explainer.runtime.memory import MemoryLimitError, MemoryRequest, ModelShape, parse_bytes, request_bytes

from ...conftest import build_model

LONG_PROMPT = " ".join(f"w{i % 9}" for i in range(100))


@pytest.fixture(scope="module")
def bundle(tokenizer):
    return bundle_from_objects(build_model("qwen2"), tokenizer)


def test_parse_bytes():
    assert parse_bytes("6GB") == 6_000_000_000
    assert parse_bytes("512MiB") == 512 * 2**20
    assert parse_bytes(" 1.5e3 ") == 1500
    assert parse_bytes(77) == 77
    with pytest.raises(ValueError, match="not a memory size"):
        parse_bytes("lots")


def test_cgroup_v2_v1_and_no_limit(tmp_path):
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "memory.max").write_text("16000000000\n")
    (v2 / "memory.current").write_text("4000000000\n")
    assert memory.cgroup_memory_left(v2) == 12_000_000_000
    (v2 / "memory.max").write_text("max\n")
    assert memory.cgroup_memory_left(v2) is None
    v1 = tmp_path / "v1" / "memory"
    v1.mkdir(parents=True)
    (v1 / "memory.limit_in_bytes").write_text("8000000000")
    (v1 / "memory.usage_in_bytes").write_text("1000000000")
    assert memory.cgroup_memory_left(tmp_path / "v1") == 7_000_000_000
    (v1 / "memory.limit_in_bytes").write_text(str(2**63 - 4096))  # v1's "no limit"
    assert memory.cgroup_memory_left(tmp_path / "v1") is None
    assert memory.cgroup_memory_left(tmp_path / "absent") is None


def test_meminfo(tmp_path):
    f = tmp_path / "meminfo"
    f.write_text("MemTotal:       16000000 kB\nMemAvailable:    9000000 kB\n")
    assert memory.host_memory_available(f) == 9_000_000 * 1024
    assert memory.host_memory_available(tmp_path / "none") is None


def test_budget_caps_what_is_free(monkeypatch):
    monkeypatch.setenv(memory.BUDGET_ENV, "3MB")
    assert memory.available_bytes("cpu") == 3_000_000
    monkeypatch.setenv(memory.BUDGET_ENV, "three")
    with pytest.raises(memory.InputError, match=memory.BUDGET_ENV):
        memory.available_bytes("cpu")


def test_rollout_need_matches_what_it_stores(bundle):
    """What Rollout states it keeps is within a factor of 2 of the bytes its prompt blocks and generated rows hold."""
    n_ids = bundle.encode(LONG_PROMPT, chat_template=False, max_new_tokens=8).input_ids
    n = n_ids.shape[1]
    stored = {}
    step = Rollout.step

    def spy(self, rows):
        out = step(self, rows)
        blocks = sum(b.numel() * b.element_size() for blocks in self.prompt_blocks.values() for _, b in blocks)
        gen = 0 if self.gen is None else self.gen.numel() * self.gen.element_size()
        stored["bytes"] = blocks + gen
        return out

    Rollout.step = spy
    try:
        explain(bundle, LONG_PROMPT, methods=["rollout"], max_new_tokens=8, chat_template=False)
    finally:
        Rollout.step = step
    request = MemoryRequest(ModelShape.of(bundle.model), n, 8)
    kept = Rollout.kept_bytes(request)
    assert stored["bytes"] / 2 <= kept <= stored["bytes"] * 2
    assert Rollout.memory(request, get_method("rollout").config) > kept  # and the prefill's chunk beside it


def test_a_small_budget_refuses_a_long_prompt_before_any_work(bundle, monkeypatch):
    n = bundle.encode(LONG_PROMPT, chat_template=False, max_new_tokens=4).input_ids.shape[1]
    request = MemoryRequest(ModelShape.of(bundle.model), n, 4)
    macs = sum(request_bytes(request, [get_method("macs")]).values())
    rollout = sum(request_bytes(request, [get_method("rollout")]).values())
    assert rollout > 1.3 * macs
    budget = int((macs + rollout) / 2 / memory.USABLE)  # room for MACS, not for Rollout
    monkeypatch.setenv(memory.BUDGET_ENV, str(budget))
    forwards = []
    handle = bundle.model.register_forward_hook(lambda *a: forwards.append(1))
    try:
        with pytest.raises(MemoryLimitError) as e:
            explain(bundle, LONG_PROMPT, methods=["macs", "rollout"], max_new_tokens=4, chat_template=False)
        assert forwards == []  # refused before the first forward pass
        msg = str(e.value)
        assert "rollout" in msg and memory.BUDGET_ENV in msg and "free on cpu" in msg
        assert "shorten the prompt" in msg and "MACS needs the least" in msg
        attr = explain(bundle, LONG_PROMPT, methods=["macs"], max_new_tokens=4, chat_template=False)
        assert attr.num_steps == 4
    finally:
        handle.remove()


def test_a_budget_too_small_for_generation_itself(bundle, monkeypatch):
    monkeypatch.setenv(memory.BUDGET_ENV, "1kB")
    with pytest.raises(MemoryLimitError, match="generation"):
        explain(bundle, "Hello there", methods=["macs"], max_new_tokens=2)


def test_gradient_methods_and_atman_state_a_need(bundle):
    request = MemoryRequest(ModelShape.of(bundle.model), 100, 10)
    for name in ("attnlrp", "grad_ellm", "input_x_gradient", "atman", "sources"):
        assert request_bytes(request, [get_method(name)])[name] > 0
    removal = request_bytes(request, [get_method("sources", fit="leave_one_out", scope="all")])["sources"]
    assert removal == request_bytes(request, [get_method("atman", batch_size=0)])["atman"]  # AtMan's passes
    surrogate = request_bytes(request, [get_method("sources")])["sources"]  # removal passes of 16 rows on a CPU
    assert surrogate == request_bytes(request, [get_method("atman", batch_size=16)])["atman"] > removal
    longer = MemoryRequest(ModelShape.of(bundle.model), 1000, 10)
    assert Rollout.kept_bytes(longer) > 20 * Rollout.kept_bytes(request)  # quadratic in N


def test_fixed_routing_soft_is_refused_up_front(bundle, monkeypatch):
    attr = explain(bundle, LONG_PROMPT, methods=["random"], max_new_tokens=3, chat_template=False)
    shape = ModelShape.of(bundle.model)
    t = attr.num_prompt_tokens + attr.num_steps
    weights = 4 * shape.layers * shape.heads * t * t
    monkeypatch.setenv(memory.BUDGET_ENV, str(int(weights / 2)))
    forwards = []
    handle = bundle.model.register_forward_hook(lambda *a: forwards.append(1))
    try:
        with pytest.raises(MemoryLimitError, match="dynamic routing"):
            soft_curves(bundle, attr, ["random"], config=SoftConfig(routing="fixed", samples=1, pis=(0.5,)))
        assert forwards == []
    finally:
        handle.remove()


def test_batch_budget_on_a_cpu_is_the_cpu_figure(bundle):
    assert batch_budget(bundle.model, 300, 20, 0, 8) == (TOKENS_PER_BATCH, 8)
    assert batch_budget(bundle.model, 300, 20, 3, 8) == (TOKENS_PER_BATCH, 3)


def test_batch_budget_on_an_accelerator_follows_its_free_memory(bundle, monkeypatch):
    """With the model on a (pretended) GPU, positions and rows per pass grow with the free memory, within bounds,
    and a row cap still applies."""
    import explainer.runtime.devices as devices

    monkeypatch.setattr(devices, "input_device", lambda model: torch.device("cuda", 0))
    shape = ModelShape.of(bundle.model)
    free = {"bytes": 0}
    monkeypatch.setattr(memory, "available_bytes", lambda device: free["bytes"])
    free["bytes"] = 10**6
    small = batch_budget(bundle.model, 300, 20, 0, 8)
    free["bytes"] = 10**9
    big = batch_budget(bundle.model, 300, 20, 0, 8)
    assert small[0] == TOKENS_PER_BATCH and big[0] > small[0] and big[0] <= MAX_TOKENS_PER_BATCH
    assert big[1] > small[1] >= 1
    per_row = shape.kv_bytes(300) + 8 * 20 * shape.vocab
    assert big[1] == min(1024, int(0.25 * 10**9 // per_row))
    assert batch_budget(bundle.model, 300, 20, 5, 8) == (big[0], 5)


def test_packed_passes_on_a_cpu_and_on_an_accelerator(bundle, monkeypatch):
    """Sources' packed passes take the CPU figure on a CPU; on a (pretended) GPU as many positions as a quarter of
    the free memory holds at a position's activations, cache, logits and mask and score rows, within bounds."""
    import explainer.runtime.devices as devices

    assert packed_positions(bundle.model, 300) == TOKENS_PER_BATCH
    monkeypatch.setattr(devices, "input_device", lambda model: torch.device("cuda", 0))
    monkeypatch.setattr(memory, "available_bytes", lambda device: 10**11)
    shape = ModelShape.of(bundle.model)
    per_position = shape.position_bytes() + 8 * shape.vocab + 4 * (3 + shape.heads) * (300 + MAX_TOKENS_PER_BATCH)
    assert packed_positions(bundle.model, 300) == min(MAX_TOKENS_PER_BATCH, int(0.25 * 10**11 // per_position))
    monkeypatch.setattr(memory, "available_bytes", lambda device: 10**6)
    assert packed_positions(bundle.model, 300) == TOKENS_PER_BATCH  # never below the CPU figure


def test_atman_from_the_device_equals_the_cpu_figure(bundle):
    attr = explain(bundle, "Paris is the capital of France. What is it?", methods=["macs"], max_new_tokens=4)
    ids = torch.tensor([attr.prompt_token_ids + attr.generated_token_ids])
    auto = atman_scores(bundle.model, ids, attr.num_prompt_tokens, AtManConfig())
    eight = atman_scores(bundle.model, ids, attr.num_prompt_tokens, AtManConfig(batch_size=8))
    np.testing.assert_array_equal(auto, eight)


def test_atman_counts_the_rows_its_passes_run_where_free_memory_sizes_them(bundle, monkeypatch):
    """Found on an H200 (2026-12-04): AtMan's measured peak was 580 MB against 11.7 MB stated, because on an
    accelerator its passes take as many rows as a share of the free memory holds, and its memory counted one. The
    rows of every forward it runs, recorded, against the rows its stated bytes hold (a CPU model told it is on a
    GPU with 1 GB free, so that passes of many rows are sized as there)."""
    from explainer.methods.atman import AtMan, prefix_pass_bytes
    from explainer.runtime import kv

    attr = explain(bundle, "Paris is the capital of France. " * 6 + "What is it?", methods=["macs"], max_new_tokens=4)
    ids = torch.tensor([attr.prompt_token_ids + attr.generated_token_ids])
    n, k = attr.num_prompt_tokens, attr.num_steps
    shape = ModelShape.of(bundle.model)
    monkeypatch.setattr(kv, "_accelerator_spend", lambda model: (shape, kv.BATCH_SHARE * 10**9))
    tokens, most = batch_budget(bundle.model, n + k, k, 0, 0)
    rows: list[int] = []
    hook = bundle.model.register_forward_pre_hook(lambda m, a, kw: rows.append(kw["input_ids"].shape[0]),
                                                  with_kwargs=True)  # fmt: skip
    try:
        atman_scores(bundle.model, ids, n, AtManConfig())
    finally:
        hook.remove()
    per_row = shape.kv_bytes(n + k) + 8 * k * shape.vocab
    request = MemoryRequest(shape, n, k, "cuda", tokens, batch_rows=most)
    stated = AtMan.memory(request, AtManConfig())
    assert max(rows) > 2  # more than the one perturbed row (and the unperturbed one) the estimate used to count
    assert stated >= prefix_pass_bytes(request, 0, 0, 0) + (max(rows) - 2) * per_row  # every row it ran is counted
    assert stated == prefix_pass_bytes(request, 0, 0, n)  # at most one row per prompt token
    few = MemoryRequest(shape, n, k, "cuda", tokens, batch_rows=3)  # a GPU with less free: 3 rows a pass
    assert AtMan.memory(few, AtManConfig()) == prefix_pass_bytes(request, 0, 0, 3)


def test_every_method_fits_a_short_prompt_on_a_large_gpu(bundle, monkeypatch):
    """Found on an H200: with the model on a GPU, `explain --methods` of every method (39 prompt tokens, 24 new,
    SmolLM2-135M's shape) was refused because Sources counted a packed pass of AtMan's accelerator batch (65,536
    positions, 234 GB). A packed pass is sized by `kv.packed_positions`, never below the CPU figure: that is its need,
    on any device."""
    import explainer.runtime.devices as devices
    from explainer.methods import available_methods
    from explainer.runtime.memory import check_request

    monkeypatch.setattr(devices, "input_device", lambda model: torch.device("cuda", 0))
    monkeypatch.setattr(memory, "available_bytes", lambda device: int(134.3e9))  # what the H200 had free
    smollm2 = ModelShape(layers=30, heads=9, kv_heads=3, head_dim=64, hidden=576, intermediate=1536, vocab=49152,
                         dtype_bytes=2)  # fmt: skip
    monkeypatch.setattr(ModelShape, "of", classmethod(lambda cls, model: smollm2))
    tokens, rows = batch_budget(bundle.model, 39 + 24, 24, 0, 0)
    assert tokens == MAX_TOKENS_PER_BATCH and rows > 39  # AtMan's passes on such a GPU
    instances = [get_method(m) for m in available_methods()]
    gpu = request_bytes(MemoryRequest(smollm2, 39, 24, "cuda", tokens, batch_rows=rows), instances)
    cpu = request_bytes(MemoryRequest(smollm2, 39, 24, "cpu", TOKENS_PER_BATCH), instances)
    assert gpu["sources"] == cpu["sources"] < 2e9  # the surrogate's 16 removals: one pass of 16 rows on either
    assert sum(gpu.values()) < 5e9
    check_request(bundle.model, instances, 39, 24, tokens, rows)  # no MemoryLimitError


class _Saved:
    """What a forward graph saved for its backward: each saved tensor's size, and the bytes of the new storage."""

    def __init__(self) -> None:
        self.numels: list[int] = []
        self.storage: dict[int, int] = {}  # data pointer -> bytes, each storage once

    @property
    def bytes(self) -> int:
        return sum(self.storage.values())


@contextlib.contextmanager
def _saved_by_the_graph(model):
    """Records, through saved-tensor hooks, what the forward passes in the block save; `model`'s parameters (which
    are no new memory) are left out of the bytes."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved = _Saved()

    def pack(x: torch.Tensor) -> torch.Tensor:
        saved.numels.append(x.numel())
        storage = x.untyped_storage()
        if storage.data_ptr() not in params:
            saved.storage[storage.data_ptr()] = storage.nbytes()
        return x

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        yield saved


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_a_gradient_graph_estimate_holds_what_the_graph_keeps(implementation):
    """Measured: the tensors a gradient method's forward graph saves (new storage only, parameters not counted) over
    T positions. Attention's H x T^2 weights are among them exactly when `attention_keeps_weights` says so (eager
    attention; not SDPA's fused CPU kernel), and `graph_bytes` (which also counts the cache and the logits) is at
    least what is saved and within a factor of four of it."""
    from explainer.runtime.memory import attention_keeps_weights, graph_bytes

    model = build_model("llama")
    model.set_attn_implementation(implementation)
    shape = ModelShape.of(model)
    t = 257  # the request's T; the graph covers T - 1 positions
    embeds = model.get_input_embeddings()(torch.randint(3, 60, (1, t - 1))).detach().requires_grad_(True)
    for p in model.parameters():
        p.requires_grad_(False)
    with _saved_by_the_graph(model) as saved:
        logits = model(inputs_embeds=embeds, use_cache=False).logits
    keeps = attention_keeps_weights(model)
    assert keeps == any(n >= shape.heads * (t - 1) ** 2 for n in saved.numels)
    assert keeps == (implementation == "eager")  # torch >= 2.4: SDPA's CPU kernel keeps a log-sum-exp per query
    kept = saved.bytes + logits.numel() * logits.element_size()
    request = MemoryRequest.of(model, t - 8, 8)
    assert request.attention_weights == keeps
    assert kept <= graph_bytes(request) <= 4 * kept


@pytest.mark.parametrize("name", ["attnlrp", "grad_ellm", "input_x_gradient"])
def test_each_gradient_methods_need_holds_what_its_graph_keeps(name):
    """Measured on each gradient method's own pass (its rules and hooks included): the new storage its forward graph
    saves is at most the need it states, and the need is within a factor of four of it."""
    from explainer.methods.base import GenerationRun

    model = build_model("llama")
    n, k = 300, 8
    method = get_method(name)
    with _saved_by_the_graph(model) as saved:
        method.explain(GenerationRun(model, torch.randint(3, 60, (1, n + k)), n))
    need = type(method).memory(MemoryRequest.of(model, n, k), method.config)
    assert saved.bytes <= need <= 4 * saved.bytes
