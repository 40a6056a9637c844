"""Every registered method honours the same contract (parametrised over the registry)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from explainer import METHODS, UnknownMethodError, bundle_from_objects, explain, get_method
from explainer.capture import registered_capture_names

from .conftest import build_model

PROMPT = "What is the capital of France?"


@pytest.fixture(scope="module")
def bundle(tokenizer):
    return bundle_from_objects(build_model("qwen2"), tokenizer, name="tiny-qwen2")


@pytest.mark.parametrize("name", list(METHODS))
def test_method_contract(bundle, name):
    attr = explain(bundle, PROMPT, methods=[name], max_new_tokens=5)
    scores = attr.methods[name]
    shape = (attr.num_steps, attr.num_prompt_tokens)
    assert scores.raw.shape == scores.z.shape == shape
    assert scores.raw.dtype == scores.z.dtype == np.float32
    assert np.all(np.isfinite(scores.raw)) and np.all(np.isfinite(scores.z))
    np.testing.assert_allclose(scores.z.mean(axis=1), 0, atol=1e-4)
    assert scores.seconds >= 0
    assert registered_capture_names() == [] and bundle.model.config._attn_implementation == "sdpa"


@pytest.mark.parametrize("name", list(METHODS))
def test_method_declares_paper_and_config(name):
    cls = METHODS[name]
    module_doc = __import__(cls.__module__, fromlist=["_"]).__doc__
    assert module_doc and len(module_doc.strip()) > 40
    assert dataclasses.is_dataclass(cls.Config)
    cls.Config()  # defaults alone are valid
    assert isinstance(cls.streaming, bool)
    method = get_method(name)
    assert method.name == name and isinstance(method.options(), dict)


def test_methods_side_by_side_share_one_generation(bundle):
    attr = explain(bundle, PROMPT, methods=list(METHODS), max_new_tokens=4)
    assert set(attr.methods) == set(METHODS)
    for scores in attr.methods.values():
        assert scores.raw.shape == (attr.num_steps, attr.num_prompt_tokens)


def test_unknown_method_lists_valid_ones():
    with pytest.raises(UnknownMethodError) as err:
        get_method("lime")
    for name in METHODS:
        assert name in str(err.value)
