"""The unperturbed values from the generation (`GenerationRun.answer_logprobs`): removal passes given them compute
only the cache the perturbed rows reuse (`ablate.response_logprobs`), and Sources' surrogate fitted on them is the one
fitted on its own unperturbed pass. References: a plain forward of each shortened prompt, a hook counting what the
model computed, and the same Sources run without the values."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from explainer import bundle_from_objects, explain, get_method
from explainer.methods import GenerationRun, answer_logprobs
from explainer.methods.ablate import forward_positions, response_logprobs

from ...conftest import build_model
from .test_sources_surrogate import _solo_logprobs as _solo

PROMPT = (
    "Paris is the capital of France. The quick brown fox jumps. Berlin is the capital of Germany. "
    "Numbers 0123456789 follow. Rome is in Italy. Question: What is the capital of France?"
)
K = 4


def _counted(model, seen: list[int]):
    return model.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(kwargs["input_ids"].numel()), with_kwargs=True
    )


@pytest.mark.parametrize("kind", ["llama", "qwen2_sliding"])
def test_given_values_fill_the_rows_that_remove_nothing_and_the_others_equal_solo_forwards(kind):
    model = build_model(kind)
    g = torch.Generator().manual_seed(3)
    prompt, response = torch.randint(3, 300, (40,), generator=g), torch.randint(3, 300, (5,), generator=g)
    keep = torch.rand(9, 40, generator=g) > 0.4
    keep[:, :6], keep[:, -1] = True, True
    keep[0], keep[4] = True, True  # two rows remove nothing
    keep[2, 6:9] = False  # the earliest first removed token: 6
    keep[3, 6:21], keep[3, 21] = True, False  # the latest: 21, where the given values' pass stops
    given = np.array([-0.5, -1.25, -3.0, -0.125, -2.0])
    seen: list[int] = []
    handle = _counted(model, seen)
    try:
        got = response_logprobs(model, prompt, response, keep, batch_size=1, unperturbed=given)
    finally:
        handle.remove()
    np.testing.assert_array_equal(got[[0, 4]], np.tile(given.astype(np.float32), (2, 1)))
    for i in [1, 2, 3, 5, 6, 7, 8]:
        want = _solo(model, prompt[keep[i]].tolist(), response.tolist())
        np.testing.assert_allclose(got[i], want, atol=2e-4)
    if kind == "llama":  # one row per pass: the cache pass over positions 0..20, then each row's kept positions
        t = 40 + 5 - 1
        assert seen[0] == 21
        counted = forward_positions(keep.numpy(), t, known=True)
        assert sum(seen) == counted == forward_positions(keep.numpy(), t) - t + 21
    with pytest.raises(ValueError, match="unperturbed"):
        response_logprobs(model, prompt, response, keep, unperturbed=given[:4])


def test_the_generation_s_probabilities_become_log_probabilities_only_where_all_are_usable():
    np.testing.assert_allclose(answer_logprobs([0.5, 0.25, 1.0], 3), np.log([0.5, 0.25, 1.0]))
    assert answer_logprobs([0.5, 0.0, 1.0], 3) is None  # underflowed: the method computes them itself
    assert answer_logprobs([0.5, float("nan")], 2) is None
    assert answer_logprobs([0.5, 0.25], 3) is None  # not one per answer token


def test_sources_from_explain_takes_the_generation_s_values_and_fits_what_its_own_pass_fits(tokenizer):
    model = build_model("llama")
    bundle = bundle_from_objects(model, tokenizer, name="llama")
    options = {"sources": {"ablations": 8, "check": 2, "batch_size": 1}}
    attr = explain(bundle, PROMPT, methods=["sources"], max_new_tokens=K, method_options=options)
    meta = attr.methods["sources"].meta
    probability = attr.step_scores["probability"]
    assert meta["unperturbed"] == "generation"
    np.testing.assert_allclose(meta["masks"]["log_p"][0], np.log(probability), atol=1e-6)
    ids = torch.tensor([attr.prompt_token_ids + attr.generated_token_ids])
    n = len(attr.prompt_token_ids)
    np.testing.assert_allclose(meta["masks"]["log_p"][0], _solo(model, ids[0, :n].tolist(), ids[0, n:].tolist()),
                               atol=1e-4)  # fmt: skip  # the decode loop's values are the teacher-forced ones
    own = get_method("sources", **options["sources"])
    raw = own.explain(GenerationRun(model, ids, n, prompt_tokens=list(attr.prompt_tokens)))
    assert own.meta()["unperturbed"] == "pass"
    np.testing.assert_allclose(attr.methods["sources"].raw, raw, atol=1e-4)
    np.testing.assert_allclose(meta["masks"]["log_p"], own.meta()["masks"]["log_p"], atol=1e-4)
    assert meta["forward_positions"] < own.meta()["forward_positions"]
