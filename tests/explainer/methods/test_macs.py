"""MACS equals an independent plain-loop implementation on eager attention, for every ablation option."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from explainer import bundle_from_objects, explain
from explainer.methods import MACS, MACSConfig

from ...conftest import eager_attentions
from ...reference import log_zscore, reference_macs

PROMPT = "Question: What is the capital of France? Context: Paris is the capital of France."

OPTIONS = [
    {},
    {"pooling": "mean"},
    {"pooling": "min"},
    {"redistribute": False},
    {"alpha": 1.0},
    {"alpha": 0.5},
    {"alpha": 0.2},
]


@pytest.fixture(scope="module")
def generations(tokenizer):
    """One generation per tiny model (8 tokens, EOS never produced by these weights is fine either way)."""
    from ...conftest import BUILDERS, build_model

    out = {}
    for kind in BUILDERS:
        bundle = bundle_from_objects(build_model(kind), tokenizer, name=kind)
        attr = explain(bundle, PROMPT, methods=["macs"], max_new_tokens=8)
        ids = torch.tensor([attr.prompt_token_ids + attr.generated_token_ids])
        attentions, _ = eager_attentions(bundle.model, ids)
        out[kind] = (bundle, attr, attentions)
    return out


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "default")
@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen2_sliding"])
def test_macs_matches_reference(generations, kind, options):
    bundle, base, attentions = generations[kind]
    attr = explain(bundle, PROMPT, methods=["macs"], max_new_tokens=8, method_options={"macs": options})
    assert attr.generated_token_ids == base.generated_token_ids
    n, k = attr.num_prompt_tokens, attr.num_steps
    ref_raw, ref_z = reference_macs(attentions, n, k, **options)
    got = attr.methods["macs"]
    assert got.z.shape == got.raw.shape == (k, n)
    np.testing.assert_allclose(got.z, np.array(ref_z), atol=1e-4)
    np.testing.assert_allclose(got.raw, np.array(ref_raw), rtol=1e-4, atol=0)
    assert got.meta["rescaled_steps"] == []


def test_generation_matches_plain_greedy_generate(generations):
    bundle, attr, _ = generations["llama"]
    ids = torch.tensor([attr.prompt_token_ids])
    with torch.no_grad():
        plain = bundle.model.generate(ids, max_new_tokens=attr.num_steps, do_sample=False, eos_token_id=None)
    assert plain[0, ids.shape[1] :].tolist() == attr.generated_token_ids


def test_options_change_the_result(generations):
    """Guards against options being ignored: each ablation gives a different map on the same generation."""
    bundle, _, _ = generations["llama"]
    maps = [
        explain(bundle, PROMPT, methods=["macs"], max_new_tokens=4, method_options={"macs": o}).methods["macs"].z
        for o in OPTIONS
    ]
    for i in range(len(maps)):
        for j in range(i + 1, len(maps)):
            assert not np.allclose(maps[i], maps[j]), (OPTIONS[i], OPTIONS[j])


def test_deep_model_product_is_rescaled_not_underflowed():
    """120 layers of near-uniform attention: c_L ~ 0.2**120 underflows float32; z-scores must still be exact."""
    g = torch.Generator().manual_seed(0)
    layers, heads, n, k = 120, 3, 7, 2
    logits = torch.randn(layers, heads, n + k, generator=g)
    rows = torch.softmax(logits, dim=-1)  # (L, H, T)
    macs = MACS(MACSConfig())
    macs.begin(n)
    macs.step(rows[..., : n + 0])  # step 0
    raw = macs.step(rows)  # step 1 sees k generated keys... here T = n + k
    assert macs.rescaled_steps == [0, 1]
    assert np.all(np.isfinite(raw)) and raw.max() > 0
    a = rows.double()
    a_in = a[..., :n] + a[..., n:].sum(-1, keepdim=True) / n
    logc = torch.log(0.8 * a_in.amax(dim=1) + 0.2).sum(0).tolist()
    z_ref = log_zscore(logc)
    z = (raw.astype(np.float64) - raw.mean()) / raw.std()
    np.testing.assert_allclose(z, z_ref, atol=1e-4)


def test_invalid_options_are_rejected():
    with pytest.raises(ValueError, match="pooling"):
        MACSConfig(pooling="median")
    with pytest.raises(ValueError, match="alpha"):
        MACSConfig(alpha=1.5)
