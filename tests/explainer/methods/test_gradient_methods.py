"""Input x Gradient, Grad-ELLM and AttnLRP against independent references; AttnLRP's rules one by one against
hand-computed relevances, its conservation measured; the model is exactly as before after every call."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from transformers import Gemma2Config, Gemma2ForCausalLM
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from explainer.capture import registered_names
from explainer.errors import Cancelled, UnsupportedModelError
from explainer.methods import AttnLRP, GradELLM, InputXGradient
from explainer.methods import attnlrp as attnlrp_module
from explainer.methods.attnlrp import (
    attnlrp_relevance,
    identity_rule,
    lrp_attention,
    lrp_rules,
    rms_norm_identity,
    scale_gradient,
)
from explainer.methods.base import GenerationRun
from explainer.methods.grad_ellm import grad_ellm_scores
from explainer.runtime.session import CancelToken, hold

from ...conftest import BUILDERS, build_model
from ...reference_gradients import reference_attention_relevance, reference_grad_ellm, reference_input_x_gradient

N, K = 14, 4


@pytest.fixture(scope="module")
def runs():
    """Per tiny model: a finished generation of K greedy tokens after a random N-token prompt."""
    out = {}
    for kind in BUILDERS:
        model = build_model(kind)
        prompt = torch.randint(3, 300, (1, N), generator=torch.Generator().manual_seed(7))
        with torch.no_grad():
            ids = model.generate(prompt, max_new_tokens=K, min_new_tokens=K, do_sample=False, eos_token_id=None)
        out[kind] = GenerationRun(model, ids, N)
    return out


def _hooks(model) -> dict:
    return {
        name: (tuple(m._forward_hooks), tuple(m._forward_pre_hooks), tuple(m._backward_hooks))
        for name, m in model.named_modules()
    }


def _probe(model) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.arange(3, 15)[None]).logits


def _assert_untouched(model, hooks: dict, probe: torch.Tensor) -> None:
    assert registered_names() == []
    assert model.config._attn_implementation == "sdpa"
    assert _hooks(model) == hooks
    assert all(p.requires_grad for p in model.parameters())
    torch.testing.assert_close(_probe(model), probe, atol=0, rtol=0)


# --- Input x Gradient ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_input_x_gradient_equals_finite_differences(runs, kind):
    """On a float64 copy: e_i . dl_k/de_i equals the derivative of l_k when e_i alone is scaled by (1 + t)."""
    run = runs[kind]
    model = copy.deepcopy(run.model).double()
    scores = InputXGradient().explain(GenerationRun(model, run.input_ids, N))
    expected = np.array(reference_input_x_gradient(model, run.input_ids, N))
    assert scores.shape == (K, N) and scores.dtype == np.float32
    np.testing.assert_allclose(scores, expected, rtol=1e-3, atol=1e-4)
    assert all(p.requires_grad for p in model.parameters())


def test_input_x_gradient_l2_reduction(runs):
    run = runs["llama"]
    model = run.model
    rows = []
    for k in range(K):
        p = N - 1 + k
        embeds = model.get_input_embeddings()(run.input_ids[:, : p + 1]).detach().requires_grad_(True)
        logit = model(inputs_embeds=embeds).logits[0, -1, run.input_ids[0, p + 1]]
        (grad,) = torch.autograd.grad(logit, embeds)
        rows.append((embeds * grad)[0, :N].norm(dim=-1).detach())
    scores = InputXGradient(reduction="l2").explain(run)
    np.testing.assert_allclose(scores, torch.stack(rows).numpy(), rtol=1e-4, atol=1e-6)


# --- Grad-ELLM -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(BUILDERS))
@pytest.mark.parametrize("layers", [1, 2, 5])
def test_grad_ellm_equals_plain_loop(runs, kind, layers):
    run = runs[kind]
    hooks, probe = _hooks(run.model), _probe(run.model)
    scores, used = grad_ellm_scores(run, layers)
    assert used == min(layers, run.model.config.num_hidden_layers)
    expected = np.array(reference_grad_ellm(run.model, run.input_ids, N, layers))
    assert scores.shape == (K, N)
    assert (scores >= 0).all() and scores.max() > 0
    np.testing.assert_allclose(scores, expected, rtol=2e-4, atol=2e-5)
    _assert_untouched(run.model, hooks, probe)


def test_grad_ellm_layers_option_and_metadata():
    method = GradELLM(layers=4)
    assert method.config.layers == 4
    with pytest.raises(ValueError):
        GradELLM(layers=0)


# --- AttnLRP: each rule against a hand-computed relevance ----------------------------------------------------------


def _relevance_through(fn, inputs, relevance_out):
    """Relevances x * grad_x of `inputs` when y = fn(*inputs) carries relevance R_out (gradient R_out / y)."""
    inputs = [x.clone().requires_grad_(True) for x in inputs]
    y = fn(*inputs)
    grads = torch.autograd.grad(y, inputs, grad_outputs=torch.where(y == 0, 0.0, relevance_out / y))
    return y, [x.detach() * g for x, g in zip(inputs, grads)]


def test_uniform_rule_on_a_product():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(5, 7, generator=g, dtype=torch.float64), torch.randn(5, 7, generator=g, dtype=torch.float64)
    r_out = torch.randn(5, 7, generator=g, dtype=torch.float64)
    y, (r_a, r_b) = _relevance_through(lambda x, z: scale_gradient(x * z, 0.5), [a, b], r_out)
    torch.testing.assert_close(y, a * b, atol=0, rtol=0)
    torch.testing.assert_close(r_a, 0.5 * r_out)
    torch.testing.assert_close(r_b, 0.5 * r_out)


def test_identity_rule_on_silu():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(6, 9, generator=g, dtype=torch.float64)
    x[0, 0] = 0.0
    r_out = torch.randn(6, 9, generator=g, dtype=torch.float64)
    r_out[0, 0] = 0.0  # silu(0) = 0 carries no relevance
    y, (r_x,) = _relevance_through(lambda z: identity_rule(z, torch.nn.functional.silu(z)), [x], r_out)
    torch.testing.assert_close(y, torch.nn.functional.silu(x), atol=0, rtol=0)
    torch.testing.assert_close(r_x, r_out)  # R_in = R_out, element by element


def test_rms_norm_identity_rule():
    """Forward equals LlamaRMSNorm; the gradient is weight / rms(x) times the incoming one (1/rms constant), so every
    input element gets exactly the relevance of its output element."""
    g = torch.Generator().manual_seed(2)
    norm = LlamaRMSNorm(8, eps=1e-6).double()
    with torch.no_grad():
        norm.weight.copy_(torch.randn(8, generator=g, dtype=torch.float64))
    x = torch.randn(3, 5, 8, generator=g, dtype=torch.float64, requires_grad=True)
    grad_out = torch.randn(3, 5, 8, generator=g, dtype=torch.float64)
    y = rms_norm_identity(x, norm.weight, norm.variance_epsilon)
    torch.testing.assert_close(y, norm(x), atol=0, rtol=0)
    (grad,) = torch.autograd.grad(y, x, grad_outputs=grad_out)
    rms = torch.sqrt((x.detach() ** 2).mean(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(grad, norm.weight.detach() / rms * grad_out)
    torch.testing.assert_close(x.detach() * grad, y.detach() * grad_out)


class _AttentionStub(torch.nn.Module):
    def __init__(self, groups: int) -> None:
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = True
        self.layer_idx = 0


@pytest.mark.parametrize("sliding", [False, True])
def test_attention_rules_equal_hand_computed_relevance(sliding):
    """Uniform rule on both matmuls and the softmax rule, through SDPA with scaled input gradients, equal the rules
    written out per head (GQA: 4 query heads on 2 key-value heads; causal or a window of 3)."""
    g = torch.Generator().manual_seed(3)
    heads, kv_heads, t, d, scaling = 4, 2, 6, 5, 0.4
    q = torch.randn(1, heads, t, d, generator=g, dtype=torch.float64)
    k = torch.randn(1, kv_heads, t, d, generator=g, dtype=torch.float64)
    v = torch.randn(1, kv_heads, t, d, generator=g, dtype=torch.float64)
    i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
    visible = (j <= i) & ((i - j < 3) if sliding else True)  # (T, T)
    r_out = torch.randn(1, t, heads, d, generator=g, dtype=torch.float64)
    module = _AttentionStub(heads // kv_heads)

    def attend(q_, k_, v_):
        return lrp_attention(module, q_, k_, v_, visible[None, None], scaling=scaling)[0]  # (1, T, H, D)

    _, (r_q, r_k, r_v) = _relevance_through(attend, [q, k, v], r_out)
    ref_q, ref_k, ref_v = reference_attention_relevance(q[0], k[0], v[0], visible, scaling, r_out[0])
    torch.testing.assert_close(r_q[0], ref_q)
    torch.testing.assert_close(r_k[0], ref_k)
    torch.testing.assert_close(r_v[0], ref_v)


# --- AttnLRP on whole models -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_attnlrp_approximately_conserves_the_logit(runs, kind):
    """The relevance summed over all input positions, divided by the explained logit, is measured:

    - these seeded sequences (3 layers, peaked attention from initializer_range 0.2, N = 14, K = 4): Llama 0.66-0.79,
      Qwen2 0.63-0.74 per token; over 20 random prompts the mean is 0.66 (Llama) and 0.67 (Qwen2), range 0.38-1.06;
    - the embedded SmolLM2-135M (30 layers) on 8 SQuAD prompts of the evaluation template (194-362 tokens, 8 tokens
      each): mean 0.38, median 0.37, range 0.27-0.51.

    The rest is the softmax rule's bias term: with the attention weights held constant every other rule conserves
    exactly (next test).
    """
    run = runs[kind]
    relevance, logits = attnlrp_relevance(run)
    ratio = (relevance.sum(1) / logits).numpy()
    assert relevance.shape == (K, N + K - 1)
    assert np.all((ratio > 0.5) & (ratio < 0.95)), ratio
    # the logits are the model's own: the rules change the backward pass only
    with torch.no_grad():
        plain = run.model(run.input_ids).logits[0, N - 1 : N + K - 1].gather(-1, run.input_ids[0, N:, None])[:, 0]
    torch.testing.assert_close(logits, plain, atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_without_the_softmax_every_other_rule_conserves_exactly(runs, kind, monkeypatch):
    """Attention weights held constant (relevance reaches the inputs only through the values): RMSNorm, SiLU, the
    gated product, residuals and linear layers then conserve the logit to float precision."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    def constant_weights(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        return sdpa_attention_forward(module, query.detach(), key.detach(), value, attention_mask, scaling=scaling)

    monkeypatch.setattr(attnlrp_module, "lrp_attention", constant_weights)
    relevance, logits = attnlrp_relevance(runs[kind])
    np.testing.assert_allclose(relevance.sum(1).numpy(), logits.numpy(), rtol=1e-4)


def test_attnlrp_method_returns_prompt_columns(runs):
    run = runs["qwen2_sliding"]
    hooks, probe = _hooks(run.model), _probe(run.model)
    scores = AttnLRP().explain(run)
    relevance, _ = attnlrp_relevance(run)
    np.testing.assert_allclose(scores, relevance[:, :N].numpy())
    _assert_untouched(run.model, hooks, probe)


def test_rules_are_removed_after_a_failure(runs):
    model = runs["llama"].model
    hooks, probe = _hooks(model), _probe(model)
    with pytest.raises(RuntimeError, match="boom"), lrp_rules(model):
        assert registered_names() != [] and _hooks(model) != hooks
        raise RuntimeError("boom")
    _assert_untouched(model, hooks, probe)


def test_rules_only_act_in_their_own_context(runs):
    """A forward from another thread while the rules are in place gets the plain backward."""
    import threading

    model = runs["llama"].model
    ids = torch.arange(3, 12)[None]

    def plain_gradient():
        embeds = model.get_input_embeddings()(ids).detach().requires_grad_(True)
        return torch.autograd.grad(model(inputs_embeds=embeds).logits[0, -1, 5], embeds)[0]

    expected = plain_gradient()
    seen = {}
    with lrp_rules(model):
        thread = threading.Thread(target=lambda: seen.update(grad=plain_gradient()))
        thread.start()
        thread.join()
    torch.testing.assert_close(seen["grad"], expected, atol=0, rtol=0)


def test_unsupported_family_is_refused_clearly():
    cfg = Gemma2Config(
        vocab_size=320, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, max_position_embeddings=64,
    )  # fmt: skip
    model = Gemma2ForCausalLM(cfg).eval()
    run = GenerationRun(model, torch.arange(3, 12)[None], 6)
    with pytest.raises(UnsupportedModelError, match="llama, qwen2"):
        AttnLRP().explain(run)
    assert registered_names() == []


# --- all three: contract details ----------------------------------------------------------------------------------

METHODS = [InputXGradient, GradELLM, AttnLRP]


@pytest.mark.parametrize("cls", METHODS)
def test_progress_after_every_backward_pass(runs, cls):
    seen = []
    run = runs["llama"]
    cls().explain(GenerationRun(run.model, run.input_ids, N, progress=lambda f, m: seen.append((f, m))))
    assert [f for f, _ in seen] == [(k + 1) / K for k in range(K)]
    assert all("backward passes" in m for _, m in seen)


@pytest.mark.parametrize("cls", METHODS)
def test_cancel_stops_between_backward_passes_and_restores_the_model(runs, cls):
    run = runs["qwen2"]
    hooks, probe = _hooks(run.model), _probe(run.model)
    token = CancelToken()
    seen = []

    def progress(fraction, message):
        seen.append(fraction)
        token.cancel()

    with pytest.raises(Cancelled), hold(run.model, token):
        cls().explain(GenerationRun(run.model, run.input_ids, N, progress=progress))
    assert len(seen) == 1
    _assert_untouched(run.model, hooks, probe)


@pytest.mark.parametrize("cls", METHODS)
def test_inside_inference_mode(runs, cls):
    """The library calls methods from inference-mode code; gradients are switched back on inside."""
    run = runs["llama"]
    with torch.inference_mode():
        ids = run.input_ids.clone()
        scores = cls().explain(GenerationRun(run.model, ids, N))
    np.testing.assert_allclose(scores, cls().explain(run), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("cls", METHODS)
@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_a_steps_option_explains_those_steps_as_the_full_run_does_and_leaves_the_others_zero(runs, cls, kind):
    """`steps` (1-based, ranges): the chosen rows equal the same rows of the run over every step (one backward pass
    each, no other), every other row is 0, steps beyond the answer are left out, and progress counts the chosen."""
    run = runs[kind]
    full = cls().explain(run)  # (K, N)
    seen = []
    part = cls(cls.Config(steps="2-3 9")).explain(
        GenerationRun(run.model, run.input_ids, N, progress=lambda f, m: seen.append(m))
    )
    np.testing.assert_allclose(part[1:3], full[1:3], rtol=1e-5, atol=1e-6)
    assert not part[[0, 3]].any() and full[[0, 3]].any()
    assert seen[-1].endswith("2/2 backward passes") and len(seen) == 2


@pytest.mark.parametrize("bad", ["0", "5-", "3-2", "a", "1,2", "1-1025", "1-99999999999", "9" * 5000])
def test_a_malformed_steps_option_is_refused_with_its_form(bad):
    """Refused at once with the form, a visitor's text quoted short, never expanded (a huge range is no list)."""
    for cls in METHODS:
        with pytest.raises(ValueError, match="1-based steps and ranges separated by spaces") as refused:
            cls.Config(steps=bad)
        assert len(str(refused.value)) < 200
    assert AttnLRP.Config(steps="1-1024 3").steps == "1-1024 3"  # the longest answer's steps


def test_the_cost_of_a_steps_option_counts_its_backward_passes():
    from explainer.methods.cost import CostRequest

    request = CostRequest(prompt_ids=list(range(10)), num_new_tokens=6)
    assert AttnLRP.cost(request, AttnLRP.Config()).backward_passes == 6
    assert AttnLRP.cost(request, AttnLRP.Config(steps="2-3 9")).backward_passes == 2
    assert GradELLM.cost(request, GradELLM.Config(steps="6")).backward_passes == 1


def test_the_steps_bound_is_the_longest_answer():
    from explainer.methods.steps import MAX_STEP
    from explainer.models.answer import MAX_NEW_TOKENS_LIMIT

    assert MAX_STEP == MAX_NEW_TOKENS_LIMIT
