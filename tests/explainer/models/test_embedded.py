"""The embedded SmolLM2-135M-Instruct loads offline, its MACS matches the eager reference, and the gradient methods
explain it (AttnLRP's relevance a stable fraction of the explained logit)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from explainer import EMBEDDED_MODEL, explain, load_model
from explainer.methods.attnlrp import attnlrp_relevance
from explainer.methods.base import GenerationRun

from ...conftest import eager_attentions
from ...reference import reference_macs

QA = (
    "Answer the question based on the following text. Keep your response short and simple.\n"
    "Question: What colour is the sky on a clear day?\n"
    "Context: On a clear day the sky is blue because air scatters blue light more than red light."
)


@pytest.fixture(scope="module")
def embedded():
    return load_model(None)


def test_embedded_model_loads_and_answers(embedded):
    assert embedded.name == EMBEDDED_MODEL
    cfg = embedded.model.config
    assert (cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads) == (30, 9, 3)
    attr = explain(embedded, "What is the capital of France?", max_new_tokens=12)
    assert "Paris" in attr.generated_text


def test_embedded_macs_matches_eager_reference(embedded):
    attr = explain(embedded, QA, methods=["macs"], max_new_tokens=5)
    ids = torch.tensor([attr.prompt_token_ids + attr.generated_token_ids], device=embedded.device)
    attentions, _ = eager_attentions(embedded.model, ids)
    attentions = tuple(a.float().cpu() for a in attentions)  # the reference runs on the host
    _, ref_z = reference_macs(attentions, attr.num_prompt_tokens, attr.num_steps)
    np.testing.assert_allclose(attr.methods["macs"].z, np.array(ref_z), atol=1e-4)
    assert embedded.model.config._attn_implementation == "sdpa"


def test_embedded_gradient_methods_and_attnlrp_conservation(embedded):
    """`explain --methods attnlrp,grad_ellm,input_x_gradient` on the real 30-layer model: finite, non-zero (K, N)
    maps; AttnLRP's relevance over all input positions sums to a fraction of the explained logit in the range the
    docs state (docs/results.md: 0.27-0.51 on SQuAD prompts), and the JSON's raw rows are its prompt columns."""
    methods = ["attnlrp", "grad_ellm", "input_x_gradient"]
    attr = explain(embedded, QA, methods=methods, max_new_tokens=3)
    n, k = attr.num_prompt_tokens, attr.num_steps
    for m in methods:
        raw = attr.methods[m].raw
        assert raw.shape == (k, n) and np.isfinite(raw).all() and (np.abs(raw).sum(axis=1) > 0).all(), m
    ids = torch.tensor([attr.prompt_token_ids + attr.generated_token_ids], device=embedded.device)
    relevance, logits = attnlrp_relevance(GenerationRun(embedded.model, ids, n))
    relevance, logits = relevance.cpu(), logits.cpu()
    ratio = (relevance.sum(1) / logits).numpy()
    assert np.all((ratio > 0.15) & (ratio < 0.8)), ratio
    np.testing.assert_allclose(attr.methods["attnlrp"].raw, relevance[:, :n].numpy(), rtol=1e-4, atol=1e-5)
    assert all(p.requires_grad for p in embedded.model.parameters())
