"""AtMan equals a plain-loop reference on eager attention whose scores are edited explicitly; the fast path equals the
naive one; the model is left exactly as it was."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from transformers import Gemma2Config, Gemma2ForCausalLM, MambaConfig, MambaForCausalLM
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from explainer import METHODS, UnsupportedModelError, bundle_from_objects, explain, get_method
from explainer.capture import registered_names
from explainer.methods.atman import AtMan, AtManConfig, atman_scores
from explainer.methods.atman.factors import suppression_factors

from ...conftest import BUILDERS, build_model
from ...reference import reference_suppression_rows, suppressed_eager_attention

PROMPT = "Question: What is the capital of France? Context: Paris is the capital of France."
K = 5
# Default: only other occurrences of a token are correlated in these random embeddings (cosine 1); 0.15 also pulls in
# different tokens with partial factors.
OPTIONS = [{}, {"correlated": False}, {"cosine_threshold": 0.15}]


def _option_id(options: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in options.items()) or "default"


# --- the reference: eager attention with the suppressed columns edited in a plain loop -------------------------------


def _reference_atman(model, ids: torch.Tensor, n: int, correlated=True, cosine_threshold=0.6):
    """(K, N) map from one full forward per prompt token, no cache, no batching."""
    t = ids.shape[1]
    targets = ids[0, n:].tolist()

    def cross_entropy(suppressed: dict[int, float]) -> list[float]:
        factors.clear()
        factors.update(suppressed)
        logp = torch.log_softmax(model(input_ids=ids).logits[0].double(), dim=-1)  # (T, V)
        return [-float(logp[n - 1 + k, targets[k]]) for k in range(t - n)]

    weight = model.get_input_embeddings().weight.detach()
    rows = reference_suppression_rows([weight[t] for t in ids[0, :n].tolist()], correlated, cosine_threshold)
    out = np.zeros((t - n, n))
    with torch.no_grad(), suppressed_eager_attention(model.config) as factors:
        base = cross_entropy({})
        for i, row in enumerate(rows):
            out[:, i] = np.array(cross_entropy(row)) - np.array(base)
    return out, rows


def greedy_sequences(tokenizer, prompt: str, k: int) -> dict:
    """Per tiny model: the model and the prompt + k greedy tokens as one (1, N + k) sequence, and N."""
    out = {}
    ids = torch.tensor([tokenizer(prompt)["input_ids"]])
    for kind in BUILDERS:
        model = build_model(kind)
        with torch.no_grad():
            full = model.generate(ids, max_new_tokens=k, min_new_tokens=k, do_sample=False, eos_token_id=None)
        out[kind] = (model, full, ids.shape[1])
    return out


@pytest.fixture(scope="module")
def sequences(tokenizer):
    return greedy_sequences(tokenizer, PROMPT, K)


def _assert_untouched(model) -> None:
    assert registered_names() == []
    assert model.config._attn_implementation == "sdpa"


@pytest.mark.parametrize("options", OPTIONS, ids=_option_id)
@pytest.mark.parametrize("kind", list(BUILDERS))
def test_atman_matches_eager_reference(sequences, kind, options):
    model, ids, n = sequences[kind]
    got = atman_scores(model, ids, n, AtManConfig(**options))
    ref, rows = _reference_atman(model, ids, n, **options)
    assert got.shape == (K, n) and got.dtype == np.float32
    np.testing.assert_allclose(got, ref, atol=1e-4, rtol=0)
    assert np.abs(ref).max() > 1e-2  # suppression changes the loss, so the comparison means something
    partial = [f for row in rows for f in row.values() if 0.1 < f < 1]
    if options.get("cosine_threshold") == 0.15:  # guards that correlated factors other than 0.1 are exercised
        assert partial
    if options == {}:  # the prompt repeats tokens, so correlated suppression reaches other positions
        assert any(len(row) > 1 for row in rows)
    _assert_untouched(model)


@pytest.mark.parametrize("batch_size", [1, 3, 8])
@pytest.mark.parametrize("options", OPTIONS, ids=_option_id)
@pytest.mark.parametrize("kind", list(BUILDERS))
def test_fast_equals_naive(sequences, kind, options, batch_size):
    model, ids, n = sequences[kind]
    fast = atman_scores(model, ids, n, AtManConfig(batch_size=batch_size, **options))
    naive = atman_scores(model, ids, n, AtManConfig(fast=False, **options))
    np.testing.assert_allclose(fast, naive, atol=1e-4, rtol=0)


def test_fast_path_recomputes_fewer_positions(sequences):
    """Prefix reuse and de-duplication are real: the fast path feeds far fewer token positions through the model."""
    model, ids, n = sequences["llama"]
    fed = []  # positions reaching the final norm: every position of every pass (logits are sliced after it)
    handle = model.model.norm.register_forward_hook(lambda mod, args, out: fed.append(out.shape[0] * out.shape[1]))
    try:
        atman_scores(model, ids, n, AtManConfig(fast=False))
        naive, fed[:] = sum(fed), []
        atman_scores(model, ids, n, AtManConfig())
        fast = sum(fed)
    finally:
        handle.remove()
    assert naive == (n + 1) * ids.shape[1]  # the unperturbed pass and one per prompt token, all in full
    assert fast < 0.7 * naive


def test_correlated_suppression_set_on_handmade_embeddings():
    c12 = 0.8 * 0.5 + 0.6 * math.sqrt(0.75)  # cosine of ids 1 and 2
    weight = torch.tensor(
        [
            [1.0, 0.0, 0.0],  # id 0
            [0.8, 0.6, 0.0],  # id 1: cos(0, 1) = 0.8
            [0.5, math.sqrt(0.75), 0.0],  # id 2: cos(0, 2) = 0.5 < 0.6, cos(1, 2) = c12
            [-3.0, 0.0, 0.0],  # id 3: cos(0, 3) = -1, length does not matter
            [0.0, 0.0, 0.0],  # id 4: a zero embedding is similar to nothing
        ]
    )
    embedding = torch.nn.Embedding.from_pretrained(weight)
    ids = torch.tensor([0, 1, 2, 0, 3, 4])

    def g(cos: float, f: float = 0.1) -> float:
        return (1 - f) * (1 - cos) + f

    expected = [
        [0.1, g(0.8), 1, 0.1, 1, 1],  # the other occurrence of id 0 is suppressed like the token itself
        [g(0.8), 0.1, g(c12), g(0.8), 1, 1],
        [1, g(c12), 0.1, 1, 1, 1],
        [0.1, g(0.8), 1, 0.1, 1, 1],
        [1, 1, 1, 1, 0.1, 1],
        [1, 1, 1, 1, 1, 0.1],
    ]
    got = suppression_factors(embedding(ids), 0.1, True, 0.6)
    np.testing.assert_allclose(got.numpy(), np.array(expected), atol=1e-6)
    assert torch.equal(got[0], got[3])  # equal ids give bit-identical rows, which the fast path computes once

    higher = suppression_factors(embedding(ids), 0.1, True, 0.9)  # only ids 1 and 2 (cos 0.92) stay correlated
    assert higher[0, 1] == 1 and higher[1, 2] == pytest.approx(g(c12))

    single = suppression_factors(embedding(ids), 0.1, False, 0.6)
    np.testing.assert_array_equal(single.numpy(), np.where(np.eye(6, dtype=bool), 0.1, 1.0).astype(np.float32))

    half = suppression_factors(embedding(ids), 0.5, True, 0.6)
    assert half[0, 0] == 0.5 and half[0, 1] == pytest.approx(g(0.8, 0.5))


@pytest.mark.parametrize("fast", [True, False])
def test_model_restored_after_success_and_failure(sequences, fast):
    model, ids, n = sequences["qwen2"]
    before = (set(ALL_ATTENTION_FUNCTIONS._global_mapping), set(ALL_MASK_ATTENTION_FUNCTIONS._global_mapping))
    seen = []

    def watch(fraction, message):
        seen.append((registered_names("explainer_atman_"), model.config._attn_implementation))

    atman_scores(model, ids, n, AtManConfig(fast=fast), progress=watch)
    names, impl = seen[0]
    assert len(names) == 1 and impl == names[0]  # active while running, on the language model config
    _assert_untouched(model)

    def fail(fraction, message):
        if fraction > 0.3:
            raise RuntimeError("stop here")

    with pytest.raises(RuntimeError, match="stop here"):
        atman_scores(model, ids, n, AtManConfig(fast=fast, batch_size=2), progress=fail)
    _assert_untouched(model)
    after = (set(ALL_ATTENTION_FUNCTIONS._global_mapping), set(ALL_MASK_ATTENTION_FUNCTIONS._global_mapping))
    assert after == before
    reference = atman_scores(model, ids, n, AtManConfig(fast=fast))  # still usable, same result
    np.testing.assert_allclose(reference, atman_scores(model, ids, n, AtManConfig(fast=fast)), atol=0)


def test_unsupported_models_are_refused_and_restored():
    torch.manual_seed(0)
    ids = torch.randint(3, 300, (1, 10))
    gemma = Gemma2ForCausalLM(
        Gemma2Config(
            vocab_size=320,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=16,
            sliding_window=4,
        )
    ).eval()
    previous = gemma.config._attn_implementation
    with pytest.raises(UnsupportedModelError, match="soft-capping"):
        atman_scores(gemma, ids, 7)
    assert gemma.config._attn_implementation == previous and registered_names() == []

    cfg = MambaConfig(vocab_size=320, hidden_size=32, state_size=4, num_hidden_layers=2, expand=2, conv_kernel=2)
    with pytest.raises(UnsupportedModelError, match="no attention layers"):
        atman_scores(MambaForCausalLM(cfg).eval(), ids, 7)
    assert registered_names() == []


@pytest.mark.parametrize("fast", [True, False])
def test_progress_reaches_one(sequences, fast):
    model, ids, n = sequences["llama"]
    fractions = []
    atman_scores(model, ids, n, AtManConfig(fast=fast, batch_size=4), progress=lambda f, msg: fractions.append(f))
    assert len(fractions) >= 2
    assert all(0 < f <= 1 for f in fractions)
    assert fractions == sorted(fractions) and fractions[-1] == 1.0


def test_no_generated_tokens_gives_empty_map(sequences):
    model, ids, n = sequences["llama"]
    assert atman_scores(model, ids[:, :n], n).shape == (0, n)


def test_config_validation():
    with pytest.raises(ValueError, match="suppression_factor"):
        AtManConfig(suppression_factor=0.0)
    with pytest.raises(ValueError, match="cosine_threshold"):
        AtManConfig(cosine_threshold=1.5)
    with pytest.raises(ValueError, match="batch_size"):
        AtManConfig(batch_size=-1)


def test_public_api(tokenizer):
    assert METHODS["atman"] is AtMan and get_method("atman", batch_size=2).config.batch_size == 2
    bundle = bundle_from_objects(build_model("llama"), tokenizer, name="tiny-llama")
    attr = explain(bundle, PROMPT, methods=["atman"], max_new_tokens=4)
    scores = attr.methods["atman"]
    assert scores.raw.shape == (attr.num_steps, attr.num_prompt_tokens) == (4, attr.num_prompt_tokens)
    assert scores.raw.dtype == np.float32 and np.all(np.isfinite(scores.raw))
    ids = torch.tensor([attr.prompt_token_ids + attr.generated_token_ids])
    np.testing.assert_allclose(scores.raw, atman_scores(bundle.model, ids, attr.num_prompt_tokens), atol=1e-5)
    assert scores.meta["correlated"] is True
    _assert_untouched(bundle.model)
