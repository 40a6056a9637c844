"""The batch's slots and its step (`decoding/batched/slots.py`, `fixed.py`), below the batcher: slots keep a row's cache
where its solo cache holds it; the fixed-shape step (what a CUDA graph records) equals the row-by-row step to float32
rounding; on CUDA the graph's replay equals the same step run eagerly bit for bit, a row among 8 equals its lone run
bit for bit, and both equal the solo loop's tokens; a row's bits do not depend on what the free slots or its own
unused positions hold (on a CPU and on CUDA). The batcher's own behaviour in both forms (rows joining and
leaving, given answers, end-of-sequence tokens, cancels, sinks, MACS and Rollout against the solo loop) is
test_batched.py's, which runs every test in both forms."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import DynamicCache

from explainer.decoding import DECODE_ENV, DYNAMIC, FIXED_SHAPE, GRAPH, DecodeJob, generate_steps
from explainer.decoding.batched import attention, batched_steps, engine, fixed
from explainer.decoding.batched.fixed import BatchStep
from explainer.decoding.batched.slots import Layout, Slots, slot_count
from explainer.explain import decode_choice
from explainer.methods import get_method
from explainer.runtime.host import to_numpy

from ...conftest import ACCELERATORS, DEVICES, build_model

LENGTHS = (5, 11, 8, 3, 17, 9, 6, 13)  # prompt lengths of up to 8 rows


def _ids(n: int, seed: int, device="cpu") -> torch.Tensor:
    return torch.randint(3, 300, (1, n), generator=torch.Generator().manual_seed(seed)).to(device)  # (1, n)


@torch.inference_mode()
def _prefill(model, ids: torch.Tensor) -> tuple[DynamicCache, int]:
    """A row's prefill as the batcher runs it: its cache and its first token."""
    cache = DynamicCache(config=model.config)
    logits = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1).logits[0, -1]
    return cache, int(logits.float().argmax())


def _state(model, prompts: list[torch.Tensor], slots: int, rows: bool, capacity: int = 256) -> tuple[Slots, list]:
    """Slots holding the prompts' rows (slot i: prompt i), and each row's [slot, length, tokens so far]."""
    text = model.config
    made = [_prefill(model, ids) for ids in prompts]
    shape = (text.num_hidden_layers, text.num_attention_heads) if rows else None
    state = Slots(Layout.of(made[0][0]), slots, capacity, shape)
    rows_of = []
    for ids, (cache, token) in zip(prompts, made):
        rows_of.append([state.join(cache, ids.shape[1], token), ids.shape[1], [token]])
    return state, rows_of


@torch.inference_mode()
def _decode(model, state: Slots, rows_of: list, step: BatchStep, count: int) -> list[dict]:
    """`count` steps: per step, each row's stats and attention rows (host copies)."""
    out = []
    for _ in range(count):
        lengths = [None] * state.size
        for slot, length, _ in rows_of:
            lengths[slot] = length + 1
        got = step.run(state, lengths, True)
        stats = to_numpy(state.stats)
        out.append({slot: (stats[slot].copy(), to_numpy(got[slot]).copy()) for slot, _, _ in rows_of})
        for row in rows_of:
            row[1] += 1
            row[2].append(int(stats[row[0]][0]))
    return out


def test_slot_count_is_the_next_power_of_two():
    assert [slot_count(n) for n in (1, 2, 3, 4, 5, 8, 9, 64)] == [1, 2, 4, 4, 8, 8, 16, 64]


def test_a_slot_holds_a_rows_cache_where_its_solo_cache_holds_it_and_growing_keeps_every_slot():
    model = build_model("llama")
    prompts = [_ids(n, i) for i, n in enumerate(LENGTHS[:3])]
    state, rows_of = _state(model, prompts, 4, rows=False, capacity=64)
    caches = [_prefill(model, ids)[0] for ids in prompts]
    state.leave(rows_of[1][0])  # the middle row leaves: the others stay where they are
    assert state.free == [1, 3] and state.active.tolist() == [True, False, True, False]
    grown = state.grown(8, 128, None)
    assert grown.free == [1, 3, 4, 5, 6, 7] and grown.positions[:3].tolist() == [5, 0, 8]
    for slot in (0, 2):
        n = prompts[slot].shape[1]
        for layer, solo in zip(grown.cache.layers, caches[slot].layers):
            assert torch.equal(layer.keys[slot, :, :n], solo.keys[0])
            assert torch.equal(layer.values[slot, :, :n], solo.values[0])
            assert not layer.keys[slot, :, n:].any()  # the slot's unused positions
    mask = grown.mask()[:, 0, 0]  # (S, C): each slot's own positions and its new one
    assert mask.shape == (8, 128) and mask[0].sum() == 6 and mask[2].sum() == 9 and mask[1].sum() == 1


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
@pytest.mark.parametrize("rows", [1, 5])
def test_the_fixed_shape_step_equals_the_row_by_row_step_and_the_solo_loop(kind, rows):
    """Tokens identical; statistics and attention rows to float32 rounding, over 6 steps of 1 and 5 rows."""
    model = build_model(kind)
    prompts = [_ids(n, i) for i, n in enumerate(LENGTHS[:rows])]
    apart = _decode(model, *_state(model, prompts, slot_count(rows), rows=False), BatchStep(model, DYNAMIC), 6)
    state, rows_of = _state(model, prompts, slot_count(rows), rows=True)
    shaped = _decode(model, state, rows_of, BatchStep(model, FIXED_SHAPE), 6)
    for a, b in zip(apart, shaped):
        for slot in a:
            assert a[slot][0][0] == b[slot][0][0]  # the token
            np.testing.assert_allclose(a[slot][0], b[slot][0], rtol=2e-5, atol=1e-7)
            np.testing.assert_allclose(a[slot][1], b[slot][1], rtol=2e-5, atol=1e-7)
    for slot, _, tokens in rows_of:  # the solo loop's greedy tokens
        job = DecodeJob(prompts[slot], [], 7)
        solo = [s.token_id for s in generate_steps(model, job, decode_choice(model, job))]
        assert tokens == solo


def test_each_form_of_the_step_is_the_one_that_runs(monkeypatch):
    """The batcher's form follows the request's (`choice.batch_step_form`): row by row on a CPU, the fixed shape when
    `EXPLAINER_DECODE` asks."""
    model = build_model("llama")
    seen = []
    for name in ("rows_apart", "fixed_shape"):
        real = getattr(attention, name)
        monkeypatch.setattr(fixed, name, lambda *a, _real=real, _name=name, **k: seen.append(_name) or _real(*a, **k))
    for on_cpu in (False, True):
        monkeypatch.setenv(DECODE_ENV, "auto:fixed-shape" if on_cpu else "auto")
        engine._batchers.clear()
        seen.clear()
        steps = list(batched_steps(model, DecodeJob(_ids(6, 0), [get_method("macs")], 4)))
        assert len(steps) == 4 and set(seen) == {"fixed_shape" if on_cpu else "rows_apart"}
    engine._batchers.clear()


@pytest.mark.parametrize("device", ACCELERATORS)
@pytest.mark.parametrize("rows", [1, 8])
def test_cuda_graph_replays_equal_the_eager_fixed_step_bit_for_bit(device, rows):
    model = build_model("llama").to(device)
    prompts = [_ids(n, i, device) for i, n in enumerate(LENGTHS[:rows])]
    eager = _decode(model, *_state(model, prompts, slot_count(rows), rows=True), BatchStep(model, FIXED_SHAPE), 6)
    graphed = BatchStep(model, GRAPH)
    state, rows_of = _state(model, prompts, slot_count(rows), rows=True)
    replayed = _decode(model, state, rows_of, graphed, 6)
    assert graphed._graph.enabled and graphed._graph.graph is not None  # recorded (a failed capture would have said so)
    for a, b in zip(eager, replayed):
        for slot in a:
            np.testing.assert_array_equal(a[slot][0], b[slot][0])
            np.testing.assert_array_equal(a[slot][1], b[slot][1])


@pytest.mark.parametrize("device", ACCELERATORS)
def test_cuda_a_row_among_eight_equals_its_lone_run_bit_for_bit_and_the_solo_tokens(device):
    model = build_model("llama").to(device)
    prompts = [_ids(n, i, device) for i, n in enumerate(LENGTHS)]
    state, rows_of = _state(model, prompts, 8, rows=True)
    crowd = _decode(model, state, rows_of, BatchStep(model, GRAPH), 6)
    for i, ids in enumerate(prompts):
        lone_state, lone_rows = _state(model, [ids], 1, rows=True)
        lone = _decode(model, lone_state, lone_rows, BatchStep(model, GRAPH), 6)
        for a, b in zip(crowd, lone):
            np.testing.assert_array_equal(a[i][0], b[0][0])
            np.testing.assert_array_equal(a[i][1], b[0][1])
        job = DecodeJob(ids, [], 7)
        solo = [s.token_id for s in generate_steps(model, job, decode_choice(model, job))]
        assert rows_of[i][2] == solo


@pytest.mark.parametrize("device", DEVICES)
def test_a_rows_bits_do_not_depend_on_what_free_slots_or_its_unused_positions_hold(device):
    """A crowd leaves keys and values behind in the slots it used (`Slots.leave` clears nothing). On the H200 a lone
    Qwen2.5-1.5B row differed from its own earlier run after a crowd had filled the slots (docs/gpu.md), so: a row in
    slot 0 of 4 gives the same bits with zeros elsewhere as with large random leftovers in the free slots and in its
    own positions after its length (the fixed shape on a CPU, the graph on CUDA)."""
    model = build_model("qwen2").to(device)
    form = FIXED_SHAPE if device == "cpu" else GRAPH
    ids = _ids(9, 0, device)
    clean = _decode(model, *_state(model, [ids], 4, rows=True), BatchStep(model, form), 6)
    state, rows_of = _state(model, [ids], 4, rows=True)
    noise = torch.Generator().manual_seed(1)
    for layer in state.cache.layers:
        for buffer in (layer.keys, layer.values):
            own = buffer[0, :, : ids.shape[1]].clone()
            buffer.copy_((torch.randn(buffer.shape, generator=noise) * 30).to(buffer.dtype))
            buffer[0, :, : ids.shape[1]] = own
    dirty = _decode(model, state, rows_of, BatchStep(model, form), 6)
    for a, b in zip(clean, dirty):
        np.testing.assert_array_equal(a[0][0], b[0][0])  # the token statistics
        np.testing.assert_array_equal(a[0][1], b[0][1])  # the attention rows
