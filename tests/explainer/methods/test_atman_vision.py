"""AtMan over an image prompt on a tiny random Qwen2.5-VL: equal to a plain-loop reference with eager attention whose
scores are edited explicitly, with correlated suppression over the merged patch features computed independently."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from explainer import explain
from explainer.capture import registered_names
from explainer.methods.atman import AtManConfig, atman_scores
from explainer.models.vision import encode_image_prompt, full_sequence_inputs
from explainer.result.image_maps import image_map

from ...reference import reference_suppression_rows, suppressed_eager_attention
from ...vl_tiny import build_vl_model, make_vl_tokenizer, vl_bundle

QUESTION = "What is in the image?"
K = 3


@pytest.fixture(scope="module")
def setup():
    tokenizer = make_vl_tokenizer()
    model = build_vl_model(tokenizer)
    bundle = vl_bundle(model, tokenizer)
    rng = np.random.default_rng(0)
    pixels = np.zeros((84, 112, 3), np.uint8)  # two colour halves and a white block: redundant neighbouring patches
    pixels[:, :56], pixels[:, 56:], pixels[42:, 28:84] = (200, 30, 30), (20, 40, 220), (240, 240, 240)
    image = Image.fromarray(np.clip(pixels + rng.integers(0, 20, pixels.shape), 0, 255).astype(np.uint8))
    attr = explain(bundle, QUESTION, image=image, methods=["macs"], max_new_tokens=K)
    enc = encode_image_prompt(bundle, image, QUESTION)
    ids = torch.tensor([attr.prompt_token_ids + attr.generated_token_ids])  # (1, N + K)
    extra = full_sequence_inputs(enc.prefill_inputs, attr.num_steps)
    return model, bundle, image, enc, ids, extra


def _merged_prompt_embeddings(model, enc) -> torch.Tensor:
    """(N, d) token embeddings with the vision tower's merged patch features at the image positions."""
    pv = enc.prefill_inputs
    with torch.no_grad():
        features = model.model.get_image_features(pv["pixel_values"], pv["image_grid_thw"], return_dict=True)
        embeds = model.get_input_embeddings()(enc.input_ids[0]).clone()  # (N, d)
    embeds[enc.image_positions] = torch.cat(features.pooler_output)  # (h * w, d) in row-major grid order
    return embeds


def _reference(model, enc, ids, extra, threshold: float, f: float = 0.1):
    """(K, N) map and the factor rows, from one full forward (vision tower included) per prompt token."""
    n, t = enc.input_ids.shape[1], ids.shape[1]
    rows = reference_suppression_rows(_merged_prompt_embeddings(model, enc), threshold=threshold, f=f)
    targets = ids[0, n:].tolist()

    def cross_entropy(factors: dict[int, float]) -> np.ndarray:
        edits.clear()
        edits.update(factors)
        logp = torch.log_softmax(model(input_ids=ids, **extra).logits[0].double(), dim=-1)  # (T, V)
        return np.array([-float(logp[n - 1 + k, targets[k]]) for k in range(t - n)])

    with torch.no_grad(), suppressed_eager_attention(model.config.text_config) as edits:  # vision keeps SDPA
        base = cross_entropy({})
        out = np.stack([cross_entropy(row) - base for row in rows], axis=1)  # (K, N)
    return out, rows


def _assert_clean(model) -> None:
    assert registered_names() == []
    assert model.config.text_config._attn_implementation == "sdpa"
    assert model.config.vision_config._attn_implementation == "sdpa"
    assert model.model.rope_deltas is None  # positions are passed explicitly; no state is left in the model


@pytest.mark.parametrize("threshold", [0.6, 0.99])
@pytest.mark.parametrize("fast", [True, False])
def test_atman_on_image_tokens_matches_eager_reference(setup, threshold, fast):
    model, _, _, enc, ids, extra = setup
    config = AtManConfig(fast=fast, batch_size=3, cosine_threshold=threshold)
    got = atman_scores(model, ids, enc.input_ids.shape[1], config, extra_inputs=extra)
    ref, rows = _reference(model, enc, ids, extra, threshold)
    _assert_clean(model)
    assert got.shape == ref.shape == (K, enc.input_ids.shape[1])
    np.testing.assert_allclose(got, ref, atol=1e-4, rtol=0)
    image = set(enc.image_positions)
    assert np.abs(ref[:, enc.image_positions]).max() > 1e-3  # suppressing patches changes the loss
    # Neighbouring patches are correlated through their features (not their shared token id): some image rows
    # suppress other patches, but never every patch.
    spread = [len(set(row) & image) for i, row in enumerate(rows) if i in image]
    assert max(spread) > 1 and max(spread) < len(image)
    if threshold == 0.6:
        assert any(0.15 < v < 1 for i in image for v in rows[i].values())  # partial factors are exercised


def test_explain_shows_atman_next_to_macs_on_an_image(setup):
    model, bundle, image, enc, ids, extra = setup
    seen = []
    attr = explain(bundle, QUESTION, image=image, methods=["macs", "atman"], max_new_tokens=K,
                   progress=lambda frac, msg: seen.append(frac))  # fmt: skip
    _assert_clean(model)
    assert attr.generated_token_ids == ids[0, enc.input_ids.shape[1] :].tolist()
    got = attr.methods["atman"].raw
    np.testing.assert_allclose(got, atman_scores(model, ids, enc.input_ids.shape[1], extra_inputs=extra), atol=1e-5)
    assert image_map(attr, "atman", 0).shape == tuple(enc.grid)
    assert seen and seen[-1] == 1.0


def test_failure_during_atman_on_an_image_leaves_the_model_clean(setup):
    model, _, _, enc, ids, extra = setup

    def fail(fraction, message):
        if fraction > 0.2:
            raise RuntimeError("stop here")

    for fast in (True, False):
        with pytest.raises(RuntimeError, match="stop here"):
            atman_scores(model, ids, enc.input_ids.shape[1], AtManConfig(fast=fast), fail, extra_inputs=extra)
        _assert_clean(model)
