"""The embedded SmolLM2-135M-Instruct loads offline and its MACS matches the eager reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from explainer import EMBEDDED_MODEL, explain, load_model

from .conftest import eager_attentions
from .reference import reference_macs

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
    ids = torch.tensor([attr.prompt_token_ids + attr.generated_token_ids])
    attentions, _ = eager_attentions(embedded.model, ids)
    _, ref_z = reference_macs(attentions, attr.num_prompt_tokens, attr.num_steps)
    np.testing.assert_allclose(attr.methods["macs"].z, np.array(ref_z), atol=1e-4)
    assert embedded.model.config._attn_implementation == "sdpa"
