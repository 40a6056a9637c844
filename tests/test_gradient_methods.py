"""Gradient methods against independent references; the model is exactly as before after every call."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from explainer.capture import registered_names
from explainer.errors import Cancelled, InputError
from explainer.methods import GradELLM, InputXGradient
from explainer.methods.base import GenerationRun
from explainer.methods.grad_ellm import grad_ellm_scores
from explainer.session import CancelToken, hold

from .conftest import BUILDERS, build_model
from .reference_gradients import reference_grad_ellm, reference_input_x_gradient

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


# --- contract details ----------------------------------------------------------------------------------

METHODS = [InputXGradient, GradELLM]


@pytest.mark.parametrize("cls", METHODS)
def test_image_prompts_are_refused(runs, cls):
    run = runs["llama"]
    image_run = GenerationRun(run.model, run.input_ids, N, extra_inputs={"pixel_values": torch.zeros(1)})
    with pytest.raises(InputError, match="image prompts"):
        cls().explain(image_run)


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
