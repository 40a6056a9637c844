"""Contrastive targets ("why A rather than B?"): the contrastive row of a linear-in-the-target method equals A's row
minus B's row, computed independently by putting B in A's place; the alternatives offered as foils are the step's
most probable tokens; bad foils and steps get clear messages."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from explainer import InputError, bundle_from_objects, explain
from explainer.contrast import contrasted_steps, foil_vector, is_blank
from explainer.methods import AtMan, AttnLRP, InputXGradient
from explainer.methods.atman import AtManConfig
from explainer.methods.base import GenerationRun

from ..conftest import build_model

N, K = 12, 4
STEP = 1  # the contrasted step (0-based); not the last, so B in A's place also changes later inputs


@pytest.fixture(scope="module")
def run():
    model = build_model("llama")
    prompt = torch.randint(3, 300, (1, N), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ids = model.generate(prompt, max_new_tokens=K, min_new_tokens=K, do_sample=False, eos_token_id=None)
    return GenerationRun(model, ids, N)


def _foil(run: GenerationRun) -> int:
    """The step's second most probable token (the first is A itself, by greedy decoding)."""
    with torch.no_grad():
        logits = run.model(run.input_ids).logits[0, N - 1 + STEP]  # (V,)
    top = logits.topk(2).indices.tolist()
    assert top[0] == int(run.input_ids[0, N + STEP])
    return top[1]


def _with_token(run: GenerationRun, token: int) -> GenerationRun:
    """The same generation with `token` in place of answer token STEP: B's row at STEP is then B's own map."""
    ids = run.input_ids.clone()
    ids[0, N + STEP] = token
    return GenerationRun(run.model, ids, N)


def _contrastive(run: GenerationRun, foil: int) -> GenerationRun:
    return GenerationRun(run.model, run.input_ids, N, foils=foil_vector({STEP: foil}, K, run.input_ids.device))


@pytest.mark.parametrize(
    "method",
    [InputXGradient(), AttnLRP(), AtMan(AtManConfig(fast=True)), AtMan(AtManConfig(fast=False))],
    ids=["input_x_gradient", "attnlrp", "atman-fast", "atman-naive"],
)
def test_contrastive_row_is_the_difference_of_the_two_targets_rows(run, method):
    foil = _foil(run)
    plain = method.explain(run)  # (K, N)
    of_b = method.explain(_with_token(run, foil))  # (K, N): row STEP explains B
    got = method.explain(_contrastive(run, foil))
    np.testing.assert_allclose(got[STEP], plain[STEP] - of_b[STEP], atol=2e-5, rtol=1e-4)
    others = [k for k in range(K) if k != STEP]
    np.testing.assert_allclose(got[others], plain[others], atol=1e-6)  # the other steps explain A as before
    assert not np.allclose(got[STEP], plain[STEP], atol=1e-4)  # the foil changed something


@pytest.fixture(scope="module")
def bundle(tokenizer):
    return bundle_from_objects(build_model("llama"), tokenizer, name="tiny-llama")


def test_alternatives_are_the_steps_most_probable_tokens(bundle):
    attr = explain(bundle, "What is the capital of France?", methods=["macs"], max_new_tokens=3)
    ids = torch.tensor([attr.prompt_token_ids + attr.generated_token_ids])
    with torch.no_grad():
        logits = bundle.model(ids).logits[0, attr.num_prompt_tokens - 1 : -1].float()  # (K, V)
    probs = torch.softmax(logits, -1)
    for k, alternatives in enumerate(attr.meta["alternatives"]):
        top = probs[k].topk(len(alternatives))
        assert [a["id"] for a in alternatives] == top.indices.tolist()
        np.testing.assert_allclose([a["p"] for a in alternatives], top.values.numpy(), atol=1e-5)
        assert alternatives[0]["id"] == attr.generated_token_ids[k]  # greedy
        assert [a["token"] for a in alternatives] == bundle.readable(top.indices.tolist())


def test_explain_with_contrast_records_it_and_names_the_methods_that_cannot(bundle):
    prompt = "What is the capital of France?"
    first = explain(bundle, prompt, methods=["input_x_gradient"], max_new_tokens=3)
    alternative = first.meta["alternatives"][1][1]
    methods = ["macs", "rollout", "random", "input_x_gradient"]
    attr = explain(
        bundle, prompt, methods=methods, answer=first.generated_token_ids, contrast={1: alternative["token"]}
    )
    contrast = attr.meta["contrast"]
    assert contrast["not_contrastive"] == ["macs", "rollout", "random"]
    assert contrast["steps"]["2"]["foil_id"] == alternative["id"]
    assert contrast["steps"]["2"]["target_id"] == first.generated_token_ids[1]
    assert contrasted_steps(attr) == {1: contrast["steps"]["2"]}
    assert is_blank(attr, "macs", 1) and not is_blank(attr, "macs", 0) and not is_blank(attr, "input_x_gradient", 1)
    by_id = explain(bundle, prompt, methods=methods, answer=first.generated_token_ids, contrast={1: alternative["id"]})
    np.testing.assert_array_equal(by_id.methods["input_x_gradient"].raw, attr.methods["input_x_gradient"].raw)
    assert not np.allclose(attr.methods["input_x_gradient"].raw[1], first.methods["input_x_gradient"].raw[1])
    np.testing.assert_allclose(attr.methods["input_x_gradient"].raw[0], first.methods["input_x_gradient"].raw[0])


@pytest.mark.parametrize(
    ("contrast", "message"),
    [
        ({7: 5}, "not a step of the answer"),
        ({-1: 5}, "not a step of the answer"),
        ({0: 10**9}, "outside the vocabulary"),
        ({0: ""}, "empty"),
        ({0: 3.5}, "token id or a token's text"),
        ([0, 5], "maps steps to foils"),
    ],
)
def test_bad_contrast_is_refused_with_a_message(bundle, contrast, message):
    with pytest.raises(InputError, match=message):
        explain(bundle, "Hello there", methods=["input_x_gradient"], max_new_tokens=2, contrast=contrast)


def test_a_foil_equal_to_the_answer_token_or_of_several_tokens_is_refused(bundle):
    first = explain(bundle, "Hello there", methods=["macs"], max_new_tokens=2)
    with pytest.raises(InputError, match="answer's own token"):
        explain(bundle, "Hello there", methods=["macs"], answer=first.generated_token_ids,
                contrast={0: first.generated_token_ids[0]})  # fmt: skip
    long_word = "internationalisation considerations"
    assert len(bundle.tokenizer.encode(long_word, add_special_tokens=False)) > 1
    with pytest.raises(InputError, match="must be one token"):
        explain(bundle, "Hello there", methods=["macs"], answer=first.generated_token_ids, contrast={0: long_word})
