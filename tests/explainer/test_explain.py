"""Streaming generation: user positions, growing results, robustness to failures and odd models."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import MambaConfig, MambaForCausalLM

from explainer import InputError, UnsupportedModelError, bundle_from_objects, explain, stream_explain
from explainer.capture import registered_names
from explainer.runtime.session import model_lock

from ..conftest import FailingMACS, build_model

PROMPT = "What is the capital of France?"


@pytest.fixture(scope="module")
def bundle(tokenizer):
    return bundle_from_objects(build_model("llama"), tokenizer, name="tiny-llama")


def test_user_positions_cover_exactly_the_user_text(bundle):
    enc = bundle.encode(PROMPT, chat_template=True)
    toks = bundle.readable(enc.input_ids[0].tolist())
    assert "".join(toks[i] for i in enc.user_positions) == PROMPT
    assert "<|im_start|>" in toks and len(toks) > len(enc.user_positions)
    plain = bundle.encode(PROMPT, chat_template=False)
    assert "".join(bundle.readable(plain.input_ids[0].tolist())) == PROMPT
    assert plain.user_positions == list(range(plain.input_ids.shape[1]))


def test_stream_yields_one_update_per_token_then_post_hoc(bundle):
    seen = []
    for attr in stream_explain(bundle, PROMPT, methods=["macs", "random"], max_new_tokens=6):
        seen.append((attr.num_steps, sorted(attr.methods), attr.meta["status"]))
    steps = [s for s, _, status in seen if status.startswith("generating")]
    assert steps == list(range(1, len(steps) + 1))
    assert seen[0][1] == ["macs"]
    assert seen[-1][1] == ["macs", "random"] and seen[-1][2] == "done"


def test_random_baseline_is_seeded_and_shaped(bundle):
    a = explain(bundle, PROMPT, methods=["random"], max_new_tokens=4)
    b = explain(bundle, PROMPT, methods=["random"], max_new_tokens=4)
    c = explain(bundle, PROMPT, methods=["random"], max_new_tokens=4, method_options={"random": {"seed": 1}})
    shape = (a.num_steps, a.num_prompt_tokens)
    assert a.methods["random"].raw.shape == shape
    np.testing.assert_array_equal(a.methods["random"].raw, b.methods["random"].raw)
    assert not np.array_equal(a.methods["random"].raw, c.methods["random"].raw)


def test_closed_stream_leaves_model_unchanged_and_free(bundle):
    stream = stream_explain(bundle, PROMPT, methods=["macs"], max_new_tokens=8)
    next(stream)
    stream.close()
    assert not stream.running and not model_lock(bundle.model).locked()
    assert registered_names() == [] and bundle.model.config._attn_implementation == "sdpa"


def test_failure_mid_generation_leaves_model_unchanged(bundle):
    with pytest.raises(RuntimeError, match="method failed"):
        explain(bundle, PROMPT, methods=[FailingMACS()], max_new_tokens=8)
    assert registered_names() == [] and bundle.model.config._attn_implementation == "sdpa"
    assert explain(bundle, PROMPT, max_new_tokens=2).num_steps == 2  # still usable


@pytest.mark.parametrize("max_new", [0, -1, 5000])
def test_bad_max_new_tokens(bundle, max_new):
    with pytest.raises(InputError, match="max_new_tokens"):
        explain(bundle, PROMPT, max_new_tokens=max_new)


def test_model_without_attention_layers_is_refused(tokenizer):
    torch.manual_seed(0)
    cfg = MambaConfig(vocab_size=320, hidden_size=32, state_size=4, num_hidden_layers=2, expand=2, conv_kernel=2)
    bundle = bundle_from_objects(MambaForCausalLM(cfg), tokenizer, name="tiny-mamba")
    with pytest.raises(UnsupportedModelError, match="no attention layers"):
        explain(bundle, PROMPT, methods=["macs"], max_new_tokens=2)
    assert registered_names() == []
