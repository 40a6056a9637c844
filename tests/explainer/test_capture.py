"""Captured attention rows equal eager attention; the model is unchanged afterwards."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache, Gemma2Config, Gemma2ForCausalLM

from explainer.capture import capture_attention, registered_names
from explainer.errors import UnsupportedModelError

from ..conftest import DEVICES, eager_attentions

TOL = 1e-5


def _ids(seed: int, length: int, batch: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 300, (batch, length), generator=g)  # (B, T)


def _hooks(model) -> dict:
    """Every forward (pre-)hook on the model; transformers installs some of its own, so tests compare snapshots."""
    return {
        name: (tuple(m._forward_hooks), tuple(m._forward_pre_hooks), tuple(m._backward_hooks))
        for name, m in model.named_modules()
    }


def _assert_clean(model, hooks_before: dict, implementation: str = "sdpa") -> None:
    assert registered_names() == []
    assert model.config._attn_implementation == implementation
    assert _hooks(model) == hooks_before


def test_prefill_rows_and_logits_match_eager(tiny_model):
    ids = _ids(1, 14)
    attentions, _ = eager_attentions(tiny_model, ids)
    hooks = _hooks(tiny_model)
    with torch.no_grad():
        plain = tiny_model(input_ids=ids).logits
        with capture_attention(tiny_model) as rec:
            captured = tiny_model(input_ids=ids).logits
            rows = rec.stacked()  # (L, 1, H, T)
    assert rows.shape[0] == len(attentions)
    for layer, att in enumerate(attentions):
        torch.testing.assert_close(rows[layer], att[:, :, -1, :], atol=TOL, rtol=0)
    torch.testing.assert_close(captured, plain, atol=TOL, rtol=0)
    _assert_clean(tiny_model, hooks)


def test_decode_rows_and_outputs_match_eager(tiny_model):
    """Single-token steps compute the output from the captured row; both must equal eager attention."""
    ids = _ids(2, 16)
    prefix = 9  # longer than the sliding window of the sliding-window model after a few steps
    cache = DynamicCache(config=tiny_model.config)
    attentions, eager_logits = eager_attentions(tiny_model, ids)
    hooks = _hooks(tiny_model)
    with torch.no_grad():
        with capture_attention(tiny_model):
            tiny_model(input_ids=ids[:, :prefix], past_key_values=cache, use_cache=True)
        for pos in range(prefix, ids.shape[1]):
            with capture_attention(tiny_model) as rec:
                out = tiny_model(input_ids=ids[:, pos : pos + 1], past_key_values=cache, use_cache=True)
                rows = rec.stacked(pos + 1)  # (L, 1, H, pos + 1)
            for layer, att in enumerate(attentions):
                torch.testing.assert_close(rows[layer], att[:, :, pos, : pos + 1], atol=TOL, rtol=0)
            torch.testing.assert_close(out.logits[:, -1], eager_logits[:, pos], atol=1e-4, rtol=0)
    _assert_clean(tiny_model, hooks)


def test_left_padding_batch_matches_eager(tiny_model):
    ids = _ids(3, 12, batch=2)
    mask = torch.ones_like(ids)
    mask[1, :4] = 0  # second row is left-padded by 4
    cache = DynamicCache(config=tiny_model.config)
    attentions, _ = eager_attentions(tiny_model, ids, attention_mask=mask)
    prefix_att, _ = eager_attentions(tiny_model, ids[:, :10], attention_mask=mask[:, :10])
    hooks = _hooks(tiny_model)
    with torch.no_grad():
        with capture_attention(tiny_model) as rec:
            tiny_model(input_ids=ids[:, :10], attention_mask=mask[:, :10], past_key_values=cache, use_cache=True)
            prefill_rows = rec.stacked()
        for pos in (10, 11):
            with capture_attention(tiny_model) as rec:
                tiny_model(
                    input_ids=ids[:, pos : pos + 1],
                    attention_mask=mask[:, : pos + 1],
                    past_key_values=cache,
                    use_cache=True,
                )
                rows = rec.stacked(pos + 1)
            for layer, att in enumerate(attentions):
                torch.testing.assert_close(rows[layer], att[:, :, pos, : pos + 1], atol=TOL, rtol=0)
    for layer, att in enumerate(prefix_att):
        torch.testing.assert_close(prefill_rows[layer], att[:, :, -1, :], atol=TOL, rtol=0)
    assert prefill_rows[:, 1, :, :4].abs().max() == 0  # padded keys get no attention
    _assert_clean(tiny_model, hooks)


def test_full_rows_consumer_sees_every_row_once(llama):
    ids = _ids(4, 11)
    attentions, _ = eager_attentions(llama, ids)
    hooks = _hooks(llama)
    seen = {}

    def consume(layer, q_start, probs):
        for j in range(probs.shape[2]):
            seen[(layer, q_start + j)] = probs[:, :, j, :].clone()

    with torch.no_grad(), capture_attention(llama, full_row_consumer=consume, full_row_chunk=4):
        llama(input_ids=ids)
    assert len(seen) == len(attentions) * ids.shape[1]
    for (layer, q), row in seen.items():
        width = row.shape[-1]  # keys past the chunk's visible ones are left out: they have probability 0
        torch.testing.assert_close(row, attentions[layer][:, :, q, :width], atol=TOL, rtol=0)
        assert attentions[layer][:, :, q, width:].abs().sum() == 0
    assert min(row.shape[-1] for row in seen.values()) < ids.shape[1]  # causal chunks do get cut
    _assert_clean(llama, hooks)


def test_restored_after_exception_in_block(llama):
    hooks = _hooks(llama)
    with pytest.raises(RuntimeError, match="boom"):
        with capture_attention(llama):
            assert registered_names("explainer_capture_")
            raise RuntimeError("boom")
    _assert_clean(llama, hooks)


def test_restored_after_exception_inside_attention(llama):
    def consume(layer, q_start, probs):
        raise RuntimeError("consumer failed")

    hooks = _hooks(llama)

    with pytest.raises(RuntimeError, match="consumer failed"), torch.no_grad():
        with capture_attention(llama, full_row_consumer=consume):
            llama(input_ids=_ids(5, 6))
    _assert_clean(llama, hooks)
    with torch.no_grad():  # still works normally afterwards
        llama(input_ids=_ids(5, 6))


def test_softcapping_model_is_refused_and_restored():
    torch.manual_seed(0)
    cfg = Gemma2Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        attn_logit_softcapping=50.0,
    )
    model = Gemma2ForCausalLM(cfg).eval()  # eager: Gemma2 has no SDPA support
    hooks = _hooks(model)
    with pytest.raises(UnsupportedModelError, match="soft-capping"), torch.no_grad():
        with capture_attention(model):
            model(input_ids=torch.tensor([[1, 2, 3]]))
    _assert_clean(model, hooks, "eager")


def test_no_attention_recorded_raises_clear_error(llama):
    hooks = _hooks(llama)
    with capture_attention(llama) as rec:
        with pytest.raises(UnsupportedModelError, match="no attention layers"):
            rec.stacked()
    _assert_clean(llama, hooks)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_stacked_last_rows_equal_each_layers_own_rows(device, dtype):
    """All layers' last-query rows from one product (`stacked_last_rows`, the decode paths' rows) equal each layer's
    rows computed on its own by `attention_probs` with an explicit additive mask; the keys a row does not see get
    exactly 0; the per-layer form of `QueryStash.write_rows` (keys not stacked, temperatures or head sizes that
    differ) too. On CUDA bfloat16 takes the products' float32 output where PyTorch has it (`float32_products`)."""
    from explainer.capture import QueryStash, additive_mask, attention_probs, stacked_last_rows
    from explainer.runtime.scores import float32_products

    layers, b, h, kvh, t, d = 3, 2, 6, 2, 11, 8
    g = torch.Generator().manual_seed(0)
    queries = (torch.randn(layers, b, h, d, generator=g) * 2).to(device, dtype)
    keys = (torch.randn(layers, b, kvh, t, d, generator=g) * 2).to(device, dtype)
    visible = torch.arange(t, device=device)[None, :] <= torch.tensor([[6], [10]], device=device)  # (B, T)
    out32 = device == "cuda" and float32_products(torch.device(device), dtype)
    assert not float32_products(torch.device("cpu"), dtype)  # not on a CPU: the per-layer upcast
    got = stacked_last_rows(queries, keys, visible, 0.3, out32)  # (L, B, H, T)
    mask = additive_mask(visible[:, None, None, :], torch.float32)

    def own(query, layer_keys, scale):  # (B, H, D), (B, KVH, T, D) -> (B, H, T)
        return attention_probs(query[:, :, None, :], layer_keys, mask, scale, None)[:, :, 0, :]

    for layer in range(layers):
        torch.testing.assert_close(got[layer], own(queries[layer], keys[layer], 0.3), rtol=1e-5, atol=1e-6)
    assert torch.all(got.masked_select(~visible[None, :, None, :].expand_as(got)) == 0)
    # The stash: one product when the layers share everything, one per layer otherwise; written into a (B, L, H, T)
    # buffer's view, as the batch's slots keep them.
    wide = (torch.randn(b, h, 2 * d, generator=g) * 2).to(device, dtype)  # a layer with larger heads
    wide_keys = (torch.randn(b, kvh, t, 2 * d, generator=g) * 2).to(device, dtype)
    cases = {
        "stacked": ([queries[i] for i in range(layers)], list(keys), keys, [0.3] * 3),
        "temperatures": ([queries[i] for i in range(layers)], list(keys), keys, [0.3, 0.5, 0.3]),
        "head sizes": ([queries[0], wide, queries[2]], [keys[0], wide_keys, keys[2]], None, [0.3] * 3),
    }
    for name, (qs, ks, stacked, scales) in cases.items():
        stash = QueryStash(layers)
        for i, (q, scale) in enumerate(zip(qs, scales)):
            stash.put(i, q, scale)
        assert (stash.buffer is not None) == (name != "head sizes")
        out = torch.zeros(b, layers, h, t, device=device)
        stash.write_rows(out.transpose(0, 1), ks, stacked, visible, out32)
        for i in range(layers):
            torch.testing.assert_close(out[:, i], own(qs[i], ks[i], scales[i]), rtol=1e-5, atol=1e-6, msg=name)
