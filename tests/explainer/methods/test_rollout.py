"""Streaming Attention Rollout equals dense rollout from eager full attention matrices at every step."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from explainer import bundle_from_objects, explain
from explainer.methods import Rollout, RolloutConfig

from ...conftest import BUILDERS, build_model, eager_attentions
from ...reference import reference_rollout

PROMPT = "Question: What is the capital of France? Context: Paris is the capital of France."
OPTIONS = [{}, {"head_fusion": "max"}, {"residual": 0.2}, {"residual": 0.0}]


@pytest.fixture(scope="module")
def bundles(tokenizer):
    return {kind: bundle_from_objects(build_model(kind), tokenizer, name=kind) for kind in BUILDERS}


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "default")
@pytest.mark.parametrize("kind", list(BUILDERS))
def test_rollout_matches_dense_reference(bundles, kind, options):
    bundle = bundles[kind]
    attr = explain(bundle, PROMPT, methods=["rollout"], max_new_tokens=7, method_options={"rollout": options})
    ids = torch.tensor([attr.prompt_token_ids + attr.generated_token_ids])
    attentions, _ = eager_attentions(bundle.model, ids)
    ref = np.array(reference_rollout(attentions, attr.num_prompt_tokens, attr.num_steps, **options))
    got = attr.methods["rollout"].raw
    assert got.shape == ref.shape == (attr.num_steps, attr.num_prompt_tokens)
    np.testing.assert_allclose(got, ref, atol=1e-5, rtol=0)


def test_one_token_prompt(bundles):
    bundle = bundles["llama"]
    attr = explain(bundle, "a", methods=["rollout"], max_new_tokens=3, chat_template=False)
    ids = torch.tensor([attr.prompt_token_ids + attr.generated_token_ids])
    attentions, _ = eager_attentions(bundle.model, ids)
    ref = np.array(reference_rollout(attentions, attr.num_prompt_tokens, attr.num_steps))
    np.testing.assert_allclose(attr.methods["rollout"].raw, ref, atol=1e-5, rtol=0)


def test_stored_elements_are_what_the_definition_needs(bundles):
    """Only Â's rows are kept: for the prompt, each prefill chunk's rows only as wide as they can see (about half of
    L·N²), plus L·cap·(N + cap) for generated rows, cap < 2·K + 16; no per-step copies, no L·T² rollout matrices."""
    bundle = bundles["llama"]
    method = Rollout(RolloutConfig())
    steps = 20
    attr = explain(bundle, PROMPT, methods=[method], max_new_tokens=steps)
    n, k = attr.num_prompt_tokens, attr.num_steps
    layers = bundle.model.config.num_hidden_layers
    assert method.gen.shape[0] == layers  # one buffer of every layer's generated rows
    cap = method.gen.shape[1]
    assert k - 1 <= cap < 2 * k + 16
    chunk = 128  # capture's default rows per chunk
    prompt = sum(min(chunk, n - a) * min(n, a + chunk) for a in range(0, n, chunk))
    assert method.stored_elements() == layers * prompt + layers * cap * (n + cap)


def test_long_prompt_keeps_about_half_of_the_square(bundles):
    """Past one chunk the causal triangle shows: the prompt rows stored are well below L·N²."""
    bundle = bundles["llama"]
    method = Rollout(RolloutConfig())
    prompt = " ".join(["Paris is the capital of France."] * 38)
    attr = explain(bundle, prompt, methods=[method], max_new_tokens=2)
    n = attr.num_prompt_tokens
    assert 3 * 128 < n < 500
    layers = bundle.model.config.num_hidden_layers
    stored_prompt = sum(b.numel() for blocks in method.prompt_blocks.values() for _, b in blocks)
    assert stored_prompt < 0.8 * layers * n * n  # four chunks here; about half the square at 4k tokens
    ids = torch.tensor([attr.prompt_token_ids + attr.generated_token_ids])
    attentions, _ = eager_attentions(bundle.model, ids)
    ref = np.array(reference_rollout(attentions, n, attr.num_steps))
    np.testing.assert_allclose(attr.methods["rollout"].raw, ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("blocks", [1, 2])  # 1: an accelerator's layout
@pytest.mark.parametrize("decode", ["solo", "static"])
def test_merged_prompt_blocks_equal_the_dense_reference(bundles, monkeypatch, decode, blocks):
    """Past `prompt_blocks` chunks a layer's prompt rows are merged into fewer, wider blocks (fewer kernels a step):
    the maps stay the dense reference's on the solo loop and on the static step, and what is kept is the merged
    layout that `kept_bytes` counts."""
    from explainer.decoding import DECODE_ENV
    from explainer.methods import rollout
    from explainer.runtime.memory import MemoryRequest, ModelShape

    monkeypatch.setattr(rollout, "CPU_PROMPT_BLOCKS", blocks)
    monkeypatch.setenv(DECODE_ENV, decode)
    bundle = bundles["llama"]
    method = Rollout(RolloutConfig())
    prompt = " ".join(["Paris is the capital of France."] * 38)
    attr = explain(bundle, prompt, methods=[method], max_new_tokens=3)
    n = attr.num_prompt_tokens
    assert 3 * 128 < n < 500  # four chunks of 128 rows, merged into two blocks of 256 or one of all rows
    per = 512 // blocks
    assert all([f for f, _ in kept] == list(range(0, 512, per)) for kept in method.prompt_blocks.values())
    assert (method.square is not None) == (decode == "static" and blocks == 1)  # one product a layer a step
    ids = torch.tensor([attr.prompt_token_ids + attr.generated_token_ids])
    attentions, _ = eager_attentions(bundle.model, ids)
    ref = np.array(reference_rollout(attentions, n, attr.num_steps))
    np.testing.assert_allclose(attr.methods["rollout"].raw, ref, atol=1e-5, rtol=0)
    layers = bundle.model.config.num_hidden_layers
    stored = sum(b.numel() for blocks in method.prompt_blocks.values() for _, b in blocks)
    assert stored == layers * (256 * 256 + (n - 256) * n if blocks == 2 else n * n)
    request = MemoryRequest(ModelShape.of(bundle.model), n, attr.num_steps)
    assert Rollout.kept_bytes(request) == 4 * layers * (stored // layers + 2 * request.k * (n + 2 * request.k))


def test_invalid_options_are_rejected():
    with pytest.raises(ValueError, match="head_fusion"):
        RolloutConfig(head_fusion="median")
    with pytest.raises(ValueError, match="residual"):
        RolloutConfig(residual=2.0)
