"""`ExplainRequest`: every field checked once, when the request is built, with a message a user can act on; the
checks that need the model made where the request meets it; `stream_explain` and `stream_request` give the same
results."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from explainer import ExplainRequest, InputError, UnknownMethodError, bundle_from_objects, explain, stream_explain
from explainer.explain import explain_request
from explainer.methods import get_method
from explainer.models.answer import MAX_NEW_TOKENS_LIMIT

from ..conftest import build_model

PROMPT = "Where is Paris?"


class NoModel:
    """A bundle whose every attribute access fails: a request refused when built never reaches it."""

    def __getattr__(self, name):
        raise AssertionError(f"the model was used ({name}) before the request was checked")


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"max_new_tokens": 0}, f"max_new_tokens must be between 1 and {MAX_NEW_TOKENS_LIMIT}, got 0"),
        ({"max_new_tokens": MAX_NEW_TOKENS_LIMIT + 1}, "max_new_tokens must be between"),
        ({"max_new_tokens": 2.0}, "max_new_tokens must be between"),
        ({"max_new_tokens": True}, "max_new_tokens must be between"),
        ({"prompt": "  \n"}, "The prompt is empty"),
        ({"prompt": None}, "The prompt is empty"),
        ({"prompt": 3}, "The prompt must be text, got int"),
        ({"prompt": "Paris\ud800"}, "The prompt contains U\\+D800"),
        ({"image": Image.new("RGB", (8, 8)), "prompt": " "}, "The question is empty: ask something about the image"),
        ({"image": []}, "No image given"),
        ({"image": Image.new("RGB", (8, 8)), "methods": ["atman", "sources"]}, "sources cannot explain image"),
        ({"methods": []}, "Choose at least one attribution method"),
        ({"methods": ["macs", "nope"]}, "Unknown method 'nope'"),
        ({"methods": [3]}, "A method is a registered name or an AttributionMethod, got int"),
        ({"method_options": {"macs": {"alpha": 7}}}, "alpha must lie in"),
        ({"method_options": {"macs": {"batch": 4}}}, "Unknown option 'batch' for macs"),
        ({"method_options": {"mcas": {"alpha": 0.5}}}, "Unknown method 'mcas'"),
        ({"method_options": {"macs": 0.5}}, "method_options must map method names to dicts"),
        ({"method_options": [("macs", {})]}, "method_options must map method names to dicts"),
        ({"max_image_tokens": 0}, "max_image_tokens must be a positive integer, got 0"),
        ({"answer": "Paris\ud800"}, "The answer contains U\\+D800"),
        ({"answer": []}, "The answer has no tokens"),
        ({"answer": [1, -1]}, "whole numbers of at least 0, found -1"),
        ({"answer": [1, True]}, "found True"),
        ({"answer": [[1, 2]]}, "found \\[1, 2\\]"),
        ({"answer": 3}, "must be a list of whole numbers, got int"),
        ({"answer": b"Paris"}, "must be a list of whole numbers, got bytes"),
        (  # within the limit `fit_answer` raises max_new_tokens to hold the ids: beyond it, the message says the limit
            {"answer": [1] * (MAX_NEW_TOKENS_LIMIT + 1), "max_new_tokens": 8},
            rf"The answer has {MAX_NEW_TOKENS_LIMIT + 1} tokens; at most {MAX_NEW_TOKENS_LIMIT} answer tokens can be "
            r"explained\. Shorten the answer\.$",
        ),
        ({"contrast": [0, 5]}, "contrast maps steps to foils"),
        ({"contrast": {8: 5}, "max_new_tokens": 8}, "Contrast step 8 is not a step of the answer \\(at most 8"),
        ({"contrast": {2: 5}, "answer": [4, 5]}, "Contrast step 2 is not a step of the answer \\(at most 2"),
        ({"contrast": {-1: 5}}, "Contrast step -1 is not a step"),
        ({"contrast": {"0": 5}}, "Contrast step '0' is not a step"),
        ({"contrast": {0: 3.5}}, "A foil is a token id or a token's text, got float"),
        ({"contrast": {0: -2}}, "Foil id -2 is outside the vocabulary"),
        ({"contrast": {0: ""}}, "The foil is empty"),
        ({"unit": "paragraph"}, "Prompt units must be one of token, word, sentence, got 'paragraph'"),
    ],
)
def test_each_bad_field_is_refused_when_built_before_any_model_work(fields, message):
    fields = {"prompt": PROMPT, **fields}
    error = UnknownMethodError if "Unknown method" in message else InputError
    with pytest.raises(error, match=message):
        ExplainRequest.build(**fields)
    if "unit" not in fields:  # the view's unit is not a keyword of the library's call
        with pytest.raises(error, match=message):  # the friendly call builds the request before it uses the bundle
            stream_explain(NoModel(), **fields)


def test_a_request_is_normalised_once():
    macs = get_method("macs")
    request = ExplainRequest.build(
        PROMPT, methods=["MACS", "rollout", "macs", " rollout "], max_new_tokens=8,
        method_options={"macs": {"alpha": "0.5"}, "atman": {"fast": "false"}}, answer=np.array([5, 6]),
        contrast={1: " That"},
    )  # fmt: skip
    assert request.methods == ("macs", "rollout") and request.method_names == ("macs", "rollout")
    assert request.method_options == {"macs": {"alpha": 0.5}}  # converted; a method not chosen is dropped
    assert request.answer == (5, 6) and request.num_steps == 2 and request.images == () and request.image is None
    for blank in ("", " \n", None):
        assert ExplainRequest(PROMPT, answer=blank).answer is None  # blank: generate
    assert ExplainRequest(PROMPT, answer=" Paris.").answer == " Paris."  # text as given, never stripped
    assert ExplainRequest(PROMPT, answer=" Paris.").num_steps == 64  # its tokens are known once it meets the model
    with_instance = ExplainRequest(PROMPT, methods=[macs, "macs", "random"])
    assert with_instance.methods == (macs, "random") and with_instance.method_names == ("macs", "random")
    assert with_instance.instances()[0] is macs and with_instance.instances()[1] is not with_instance.instances()[1]
    one, two = Image.new("RGB", (8, 8)), Image.new("RGB", (9, 9))
    assert ExplainRequest.build("What?", image=one).image is one
    assert ExplainRequest.build("What?", image=[one, two]).image == [one, two]
    assert request.replace(max_new_tokens=3).max_new_tokens == 3
    with pytest.raises(InputError, match="max_new_tokens must be between 1"):  # a changed copy is checked again
        request.replace(max_new_tokens=0)
    with pytest.raises(AttributeError):
        request.max_new_tokens = 3  # frozen


@pytest.fixture(scope="module")
def bundle(tokenizer):
    return bundle_from_objects(build_model("llama"), tokenizer, name="tiny-llama")


def test_checks_that_need_the_model_are_made_when_the_request_meets_it(bundle):
    vocab = bundle.model.get_input_embeddings().num_embeddings
    request = ExplainRequest(PROMPT, answer=(1, vocab), max_new_tokens=4)  # fine without the model
    with pytest.raises(InputError, match=f"from 0 to {vocab - 1}, found {vocab}"):
        explain_request(bundle, request)
    words = ExplainRequest(PROMPT, answer="word " * 20, max_new_tokens=4)  # its tokens are counted there
    assert explain_request(bundle, words).num_steps > 4  # all of them (`request.fit_answer`)
    with pytest.raises(InputError, match="context"):
        explain_request(bundle, ExplainRequest(" ".join(["word"] * 300), max_new_tokens=MAX_NEW_TOKENS_LIMIT))


def test_explain_and_a_built_request_give_the_same_result(bundle):
    kwargs = dict(methods=["macs", "random"], max_new_tokens=3, method_options={"macs": {"alpha": 0.5}})
    by_keywords = explain(bundle, PROMPT, **kwargs)
    request = ExplainRequest.build(PROMPT, **kwargs)
    by_request = explain_request(bundle, request)
    again = explain_request(bundle, request)  # a request runs again with fresh method instances
    assert by_keywords.generated_token_ids == by_request.generated_token_ids == again.generated_token_ids
    for m in ("macs", "random"):
        np.testing.assert_array_equal(by_keywords.methods[m].raw, by_request.methods[m].raw)
        np.testing.assert_array_equal(by_request.methods[m].raw, again.methods[m].raw)
    assert by_request.meta["max_new_tokens"] == 3 and by_request.meta["answer"] == "generated"
    forced = explain_request(bundle, request.replace(answer=tuple(by_request.generated_token_ids)))
    assert forced.meta["answer"] == "given" and forced.meta["answer_tokenization"] == "ids"
    np.testing.assert_array_equal(forced.methods["macs"].raw, by_request.methods["macs"].raw)
