"""bfloat16 as a first-class precision: capture never changes the generated tokens, and no-op perturbations give
exactly zero.

- With capture on (MACS and Rollout streaming), greedy generation gives exactly the tokens of the same model's
  `generate(do_sample=False)` in the same dtype, float32 and bfloat16, on the embedded model, and every registered
  method explains it in bfloat16 (the tiny models, text and image, in every precision and on every device:
  `test_on_device.py`).
- AtMan with `suppression_factor=1` and pi-Soft with a mask of ones perturb nothing: their baselines run in the same
  batched layout as the perturbed rows, so the scores and distances are exactly zero, in bfloat16 too.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch
from transformers import DynamicCache

from explainer import explain, load_model
from explainer.faithfulness.soft import (
    SoftConfig,
    _distances,
    _next_token_probs,
    _recording,
    fixed_routing,
    soft_curves,
)
from explainer.methods.atman import AtManConfig, atman_scores
from explainer.methods.atman.method import _fast_scores
from explainer.methods.inputs import SequenceInputs
from explainer.models.loading import bundle_from_objects
from explainer.result.attribution import MethodScores

from ..conftest import build_model

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


def test_capture_probabilities_are_computed_in_float32():
    """Scores of 20-40 from bfloat16 q and k: the captured probabilities equal a float64 softmax of the same q and k
    to float32 precision (scores rounded to bfloat16 would be off by percents)."""
    from explainer.capture import attention_probs

    g = torch.Generator().manual_seed(0)
    q = (torch.randn(1, 4, 3, 64, generator=g) * 3).to(torch.bfloat16)  # (B, H, Tq, D)
    k = (torch.randn(1, 2, 40, 64, generator=g) * 3).to(torch.bfloat16)  # (B, KVH, Tk, D)
    scale = 64**-0.5
    probs = attention_probs(q, k, None, scale, None)  # (B, H, Tq, Tk)
    keys = k.double().repeat_interleave(2, dim=1)  # (B, H, Tk, D)
    scores = q.double() @ keys.transpose(-1, -2) * scale
    assert scores.abs().max() > 20
    assert probs.dtype == torch.float32
    torch.testing.assert_close(probs.double(), torch.softmax(scores, dim=-1), rtol=1e-5, atol=1e-6)


# --- no-op perturbations ------------------------------------------------------------------------------------------


@contextlib.contextmanager
def layout_sensitive(model):
    """Make the model's rounding depend on the shape of each forward, as on a GPU, where kernels (and so the order
    of float sums) are chosen by batch size and length: the final norm's output (B, L, d) gets an offset that depends
    on (B, L). Rows of one forward are treated alike, as batched kernels treat them. On a CPU, passes of different
    shapes happen to round alike, so without this a baseline run in another layout would go unnoticed."""
    direction = torch.linspace(-1.0, 1.0, model.config.hidden_size)

    def hook(module, args, output):
        b, length = output.shape[0], output.shape[1]
        return output + (1e-2 * (b + 3 * length) * direction).to(output)

    handle = model.get_decoder().norm.register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "bfloat16"])
def test_layout_sensitive_model_tells_layouts_apart(tokenizer, dtype):
    """The simulated GPU rounding is large enough to be seen: a baseline computed in a pass of another shape (the
    full sequence at batch 1, as pi-Soft and AtMan once did) differs from the same input in a prefix-reusing batch."""
    model = build_model("qwen2").to(dtype)
    ids = torch.tensor([[5, 17, 40, 41, 42, 60, 61, 62, 63, 64]])
    with torch.inference_mode(), layout_sensitive(model):
        emb = model.get_input_embeddings()(ids)  # (1, T, d)
        prefix = DynamicCache()
        model(inputs_embeds=emb[:, :4], position_ids=torch.arange(4)[None], past_key_values=prefix, use_cache=True)
        full = _next_token_probs(model, emb)  # (1, V)
        batched = _next_token_probs(model, emb.expand(3, -1, -1), prefix)  # (3, V)
    assert torch.equal(batched[0], batched[2])  # rows of one pass are alike
    assert not torch.equal(full[0], batched[0])


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "naive"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "bfloat16"])
def test_atman_without_suppression_scores_exactly_zero(tokenizer, dtype, fast):
    model = build_model("qwen2_sliding").to(dtype)
    bundle = bundle_from_objects(model, tokenizer)
    attr = explain(bundle, "Paris is the capital of France. What is the capital?", methods=["macs"], max_new_tokens=5)
    ids = torch.tensor([attr.prompt_token_ids + attr.generated_token_ids])
    with layout_sensitive(model):
        for correlated in (True, False):
            cfg = AtManConfig(suppression_factor=1.0, correlated=correlated, fast=fast, batch_size=3)
            scores = atman_scores(model, ids, attr.num_prompt_tokens, cfg)
            assert scores.shape == (attr.num_steps, attr.num_prompt_tokens) and (scores == 0).all()
        real = atman_scores(model, ids, attr.num_prompt_tokens, AtManConfig(fast=fast, batch_size=3))
    assert np.abs(real).max() > 1e-3  # a real suppression still moves the cross-entropy


def test_atman_without_suppression_on_the_embedded_model(embedded):
    attr = explain(embedded, EMBEDDED_PROMPTS[0], methods=["macs"], max_new_tokens=4)
    ids = torch.tensor([attr.prompt_token_ids + attr.generated_token_ids], device=embedded.device)
    for fast in (True, False):
        cfg = AtManConfig(suppression_factor=1.0, fast=fast)
        assert (atman_scores(embedded.model, ids, attr.num_prompt_tokens, cfg) == 0).all()


def test_atman_baseline_shares_the_pass_of_its_rows(tokenizer):
    """Rows that count as suppressing (a non-zero bias) but change nothing in the model (a bias of float32's tiny,
    absorbed by every score) are run in batches; under shape-dependent rounding they score exactly 0 only because
    each pass holds its own unperturbed baseline row. (bfloat16: on a CPU, float32 matmuls round the rows at a
    batch's tail differently, by ~1e-7, so there a row equals its baseline only that closely.)"""
    model = build_model("qwen2_sliding").to(torch.bfloat16)
    bundle = bundle_from_objects(model, tokenizer)
    attr = explain(bundle, "Paris is the capital of France. What is the capital?", methods=["macs"], max_new_tokens=5)
    ids = torch.tensor([attr.prompt_token_ids + attr.generated_token_ids])
    n, t = attr.num_prompt_tokens, ids.shape[1]
    log_bias = torch.zeros(n, t)
    log_bias[:, :n].fill_diagonal_(torch.finfo(torch.float32).tiny)  # (N, T): each row "suppresses" its token
    with layout_sensitive(model), torch.inference_mode():
        scores = _fast_scores(model, SequenceInputs(ids), n, log_bias, 3, None, {})
        suppressed = atman_scores(model, ids, n, AtManConfig(correlated=False, batch_size=3))
    assert (scores == 0).all()
    assert (np.abs(suppressed) > 1e-4).mean() > 0.5  # the same passes with a real bias do move it


@pytest.mark.parametrize("routing", ["dynamic", "fixed"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "bfloat16"])
def test_soft_mask_of_ones_gives_distance_zero(tokenizer, dtype, routing):
    """A method with equal scores everywhere, calibrated to pi = 1, keeps every token (a mask of ones) for Soft-NS:
    the distance to the unperturbed distribution is exactly 0 in every sample, so Soft-NS is exactly 1."""
    model = build_model("qwen2_sliding").to(dtype)
    bundle = bundle_from_objects(model, tokenizer)
    attr = explain(bundle, "Paris is the capital of France. What is the capital?", methods=["random"], max_new_tokens=4)
    attr.methods["flat"] = MethodScores.from_raw(np.ones((attr.num_steps, attr.num_prompt_tokens), np.float32))
    positions = list(range(3, attr.num_prompt_tokens))  # a shared prefix before the first evaluated position
    cfg = SoftConfig(samples=3, pis=(1.0,), step_stride=1, routing=routing, batch_size=4)
    with layout_sensitive(model):
        report = soft_curves(bundle, attr, ["flat"], positions=positions, config=cfg)
    assert report.ns["flat"] == [1.0]


@pytest.mark.parametrize("routing", ["dynamic", "fixed"])
def test_soft_baseline_shares_the_pass_of_its_rows(tokenizer, routing):
    """Masks that drop only positions whose embedding is zero change nothing but are run; under shape-dependent
    rounding their distance is exactly 0 only because each pass holds its own unperturbed row (bfloat16, see the
    AtMan test above)."""
    model = build_model("qwen2_sliding").to(torch.bfloat16)
    ids = torch.tensor([[5, 17, 40, 41, 42, 60, 61, 62, 63, 64, 65, 66]])
    pos = torch.tensor([4, 6, 7, 9])
    with torch.inference_mode():
        emb = model.get_input_embeddings()(ids).clone()  # (1, T, D)
        emb[:, pos[:2]] = 0.0  # dropping these changes nothing
        probs: dict[int, torch.Tensor] = {}
        with _recording(model, probs):
            _next_token_probs(model, emb)
        routing_block = fixed_routing(model, probs) if routing == "fixed" else contextlib.nullcontext()
        prefix = DynamicCache()
        model(inputs_embeds=emb[:, :4], position_ids=torch.arange(4)[None], past_key_values=prefix, use_cache=True)
        keep = np.array([[0, 1, 1, 1], [1, 0, 1, 1], [0, 0, 1, 1], [1, 1, 0, 1], [0, 1, 1, 0]], dtype=bool)
        with layout_sensitive(model), routing_block:
            dist = _distances(model, emb, pos, keep, prefix, size=2)
    assert (dist[:3] == 0).all() and (dist[3:] > 0).all()


def test_every_registered_method_on_the_embedded_model_in_bfloat16():
    """`explain --dtype bfloat16` on the embedded model: the tokens of its own bf16 `generate`, and every registered
    method's map finite, float32, of shape (K, N) and not all zero (random aside, each depends on the model). On a GPU
    this once failed before running: Sources' memory statement refused the request (runtime/test_memory.py)."""
    from explainer.methods import available_methods

    bundle = load_model(None, dtype="bfloat16")
    prompt = "Paris is the capital of France. What is 12 times 7?"
    attr = explain(bundle, prompt, methods=available_methods(), max_new_tokens=4)
    ids = bundle.encode(prompt, max_new_tokens=4).input_ids
    _assert_same_tokens(attr, _plain_generate(bundle, ids, 4), bundle.eos_token_ids)
    assert attr.meta["dtype"] == "bfloat16" and set(attr.methods) == set(available_methods())
    for name, scores in attr.methods.items():
        raw = scores.raw
        assert raw.dtype == np.float32 and raw.shape == (attr.num_steps, attr.num_prompt_tokens), name
        assert np.isfinite(raw).all() and np.abs(raw).max() > 0, name
