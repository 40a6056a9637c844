"""Streaming generation: user positions, growing results, robustness to failures and odd models."""

from __future__ import annotations

import threading

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


def _forward_threads(model) -> tuple[set[int], object]:
    """The idents of the threads that run `model`'s forward passes, and the hook's handle."""
    seen: set[int] = set()
    handle = model.register_forward_pre_hook(lambda module, args: seen.add(threading.get_ident()))
    return seen, handle


def test_explain_runs_the_model_on_the_callers_thread(bundle):
    """One owner of torch's threads: `explain` (and `explain_request`) run every forward pass on the caller's own
    thread, so a process keeps one team of CPU threads (a worker's second team made every call after the caller's
    own torch work ~1.5x slower on a 2-core CPU); a stream, which the caller may drop, still runs in a worker."""
    seen, handle = _forward_threads(bundle.model)
    try:
        explain(bundle, "Where is Paris?", methods=["macs", "random"], max_new_tokens=3)
        assert seen == {threading.get_ident()}
        seen.clear()
        list(stream_explain(bundle, "Where is Paris?", methods=["macs"], max_new_tokens=3))
        assert seen and threading.get_ident() not in seen
    finally:
        handle.remove()
    assert not model_lock(bundle.model).locked()


def test_explain_on_the_callers_thread_keeps_a_workers_autograd_modes(bundle):
    """The caller's grad and inference modes do not reach the methods (a worker thread started without them): a
    gradient method called inside `torch.inference_mode()` gives what it gives outside, and the caller's mode is
    back after the call."""
    kwargs = dict(methods=["macs", "input_x_gradient"], max_new_tokens=3)
    plain = explain(bundle, "Where is Paris?", **kwargs)
    with torch.inference_mode():
        inside = explain(bundle, "Where is Paris?", **kwargs)
        assert torch.is_inference_mode_enabled()
    for name in ("macs", "input_x_gradient"):
        np.testing.assert_array_equal(inside.methods[name].raw, plain.methods[name].raw)
