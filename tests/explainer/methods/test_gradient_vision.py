"""Input x Gradient, Grad-ELLM and AttnLRP on an image prompt of a tiny random Qwen2.5-VL. The input layer is what
the language model receives: token embeddings with the vision tower's merged patch features at the image positions,
built here independently (`get_image_features`). References: finite differences along each merged feature, a
plain per-token loop with eager attention for Grad-ELLM, and AttnLRP's exact conservation with the attention weights
held constant; the model is as before afterwards."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers.models.qwen2_5_vl.modeling_qwen2_5_vl as qwen2_5_vl
from PIL import Image

from explainer import explain
from explainer.capture import registered_names
from explainer.methods import AttnLRP, GradELLM, InputXGradient
from explainer.methods import attnlrp as attnlrp_module
from explainer.methods.attnlrp import attnlrp_relevance
from explainer.methods.base import GenerationRun
from explainer.models.vision import encode_image_prompt, full_sequence_inputs

from ...conftest import eager
from ...vl_tiny import build_vl_model, make_vl_tokenizer, vl_bundle

QUESTION = "What is in the image?"
K = 2


@pytest.fixture(scope="module")
def setup():
    tokenizer = make_vl_tokenizer()
    model = build_vl_model(tokenizer)
    bundle = vl_bundle(model, tokenizer)
    pixels = (np.random.default_rng(1).random((56, 84, 3)) * 255).astype(np.uint8)
    image = Image.fromarray(pixels)
    attr = explain(bundle, QUESTION, image=image, methods=["macs"], max_new_tokens=K)
    enc = encode_image_prompt(bundle, image, QUESTION)
    ids = torch.tensor([attr.prompt_token_ids + attr.generated_token_ids])  # (1, N + K)
    extra = full_sequence_inputs(enc.prefill_inputs, attr.num_steps)
    return model, bundle, image, enc, ids, extra


def _merged_embeddings(model, enc, ids) -> torch.Tensor:
    """(1, N + K, d) token embeddings with the merged patch features at the image positions, built by hand."""
    pv = enc.prefill_inputs
    with torch.no_grad():
        features = model.model.get_image_features(pv["pixel_values"], pv["image_grid_thw"], return_dict=True)
        embeds = model.get_input_embeddings()(ids).clone()  # (1, T, d)
    embeds[0, enc.image_positions] = torch.cat(features.pooler_output)  # (h * w, d), row-major grid order
    return embeds


def _run(setup) -> GenerationRun:
    model, _, _, enc, ids, extra = setup
    return GenerationRun(model, ids, enc.input_ids.shape[1], extra_inputs=extra)


def _logit(model, embeds, positions, p: int, target: int) -> float:
    return float(model(inputs_embeds=embeds[:, : p + 1], position_ids=positions[..., : p + 1]).logits[0, -1, target])


def test_input_x_gradient_on_image_tokens_matches_a_plain_loop_and_finite_differences(setup):
    """Per answer token one forward over the hand-merged embeddings up to its predicting position and one autograd
    call; a few entries also by finite differences along the feature (float32 limits those to about 1e-4)."""
    model, _, _, enc, ids, extra = setup
    n = enc.input_ids.shape[1]
    embeds, positions = _merged_embeddings(model, enc, ids), extra["position_ids"]
    expected = np.zeros((K, n))
    for k in range(K):
        p, target = n - 1 + k, int(ids[0, n + k])
        leaf = embeds[:, : p + 1].clone().requires_grad_(True)
        with torch.enable_grad():
            logit = model(inputs_embeds=leaf, position_ids=positions[..., : p + 1]).logits[0, -1, target]
            (grad,) = torch.autograd.grad(logit, [leaf])
        expected[k] = (leaf * grad).sum(-1)[0, :n].detach().numpy()
    got = InputXGradient().explain(_run(setup))
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-6)
    h, p, target = 1e-2, n - 1, int(ids[0, n])
    with torch.no_grad():
        for i in enc.image_positions[:4]:
            f = {}
            for s in (-2, -1, 1, 2):
                scaled = embeds.clone()
                scaled[0, i] *= 1.0 + s * h
                f[s] = _logit(model, scaled, positions, p, target)
            assert got[0, i] == pytest.approx((8 * (f[1] - f[-1]) - (f[2] - f[-2])) / (12 * h), abs=3e-4)
    assert np.abs(got[:, enc.image_positions]).sum() > 0  # the image tokens are explained, not left at zero
    assert registered_names() == [] and model.model.rope_deltas is None


def _grad_ellm_reference(model, embeds, positions, n: int, targets: list[int], layers: int) -> np.ndarray:
    """Grad-ELLM in loops: per answer token one eager forward up to its predicting position; q, k, v as the eager
    attention receives them (mRoPE applied); w = dl/d(attention output) at that position from a tap on o_proj."""
    text = model.config.text_config
    heads, kv_heads, num_layers = text.num_attention_heads, text.num_key_value_heads, text.num_hidden_layers
    group, first = heads // kv_heads, num_layers - layers
    blocks = model.model.language_model.layers
    rows = np.zeros((len(targets), n))
    for k, target in enumerate(targets):
        p = n - 1 + k
        seen, deltas = {}, {}
        original = qwen2_5_vl.eager_attention_forward

        def tap(module, query, key, value, *args, seen=seen, original=original, **kwargs):
            seen[module.layer_idx] = tuple(x.detach()[0].double() for x in (query, key, value))
            return original(module, query, key, value, *args, **kwargs)

        def delta(module, args, index, deltas=deltas):
            deltas[index] = torch.zeros_like(args[0], requires_grad=True)
            return (args[0] + deltas[index],)

        handles = [blocks[i].self_attn.o_proj.register_forward_pre_hook(lambda m, a, i=i: delta(m, a, i))
                   for i in range(first, num_layers)]  # fmt: skip
        qwen2_5_vl.eager_attention_forward = tap
        try:
            with eager(model), torch.enable_grad():
                logit = model(inputs_embeds=embeds[:, : p + 1], position_ids=positions[..., : p + 1]).logits[0, -1]
                grads = torch.autograd.grad(logit[target], [deltas[i] for i in range(first, num_layers)])
        finally:
            qwen2_5_vl.eager_attention_forward = original
            for handle in handles:
                handle.remove()
        for li, grad in zip(range(first, num_layers), grads):
            q, key, value = seen[li]  # (H, T, D), (KVH, T, D), (KVH, T, D)
            w = grad[0, p].view(heads, -1).double()  # (H, D)
            for i in range(n):
                total = 0.0
                for hh in range(heads):
                    sims = [float(q[hh, p] @ key[hh // group, j]) for j in range(p + 1)]
                    low, high = min(sims), max(sims)
                    lam = (sims[i] - low) / (high - low) if high > low else 1.0
                    total += lam * float(w[hh] @ value[hh // group, i])
                rows[k, i] += max(total, 0.0)
    return rows


def test_grad_ellm_on_image_tokens_matches_a_plain_loop(setup):
    model, _, _, enc, ids, extra = setup
    n = enc.input_ids.shape[1]
    embeds = _merged_embeddings(model, enc, ids)
    targets = ids[0, n:].tolist()
    for layers in (1, 3):
        got = GradELLM(layers=layers).explain(_run(setup))
        expected = _grad_ellm_reference(model, embeds, extra["position_ids"], n, targets, layers)
        np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-5)
    assert registered_names() == [] and model.config.text_config._attn_implementation == "sdpa"


def test_attnlrp_on_an_image_prompt_conserves_exactly_without_the_softmax(setup, monkeypatch):
    """With the attention weights held constant every other rule conserves: the relevance of all inputs, image
    features included, sums to the logit, which is the model's own (the rules change the backward pass only)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    model, _, _, enc, ids, extra = setup
    n = enc.input_ids.shape[1]
    with torch.no_grad():
        plain = model(input_ids=ids, **extra).logits[0, n - 1 : -1].gather(-1, ids[0, n:, None])[:, 0]
    relevance, logits = attnlrp_relevance(_run(setup))
    torch.testing.assert_close(logits, plain, atol=1e-5, rtol=0)
    ratio = (relevance.sum(1) / logits).numpy()
    assert np.all((ratio > 0.2) & (ratio < 1.2)), ratio  # the softmax rule's bias term takes a share, as for text

    def constant_weights(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        return sdpa_attention_forward(module, query.detach(), key.detach(), value, attention_mask, scaling=scaling)

    monkeypatch.setattr(attnlrp_module, "lrp_attention", constant_weights)
    relevance, logits = attnlrp_relevance(_run(setup))
    np.testing.assert_allclose(relevance.sum(1).numpy(), logits.numpy(), rtol=1e-4)
    assert relevance[:, enc.image_positions].abs().sum() > 0


def test_every_method_explains_an_image_prompt_through_explain(setup):
    _, bundle, image, enc, _, _ = setup
    methods = ["macs", "rollout", "atman", "random", "attnlrp", "grad_ellm", "input_x_gradient"]
    attr = explain(bundle, QUESTION, image=image, methods=methods, max_new_tokens=K)
    assert list(attr.methods) == methods
    for name in methods:
        assert attr.methods[name].raw.shape == (attr.num_steps, attr.num_prompt_tokens)
        assert np.isfinite(attr.methods[name].z[:, enc.image_positions]).all(), name
    scores = AttnLRP().explain(_run(setup))
    np.testing.assert_allclose(attr.methods["attnlrp"].raw, scores, rtol=1e-5, atol=1e-6)
