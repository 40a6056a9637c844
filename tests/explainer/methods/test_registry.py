"""Every registered method honours the same contract (parametrised over the registry)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from explainer import METHODS, UnknownMethodError, bundle_from_objects, explain, get_method
from explainer.capture import registered_names
from explainer.methods import AttributionMethod

from ...conftest import build_model

PROMPT = "Paris is in France. What is the capital of France?"  # two sentences: Sources fits over two units or more


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
    assert registered_names() == [] and bundle.model.config._attn_implementation == "sdpa"


@pytest.mark.parametrize("name", list(METHODS))
def test_method_declares_paper_and_config(name):
    cls = METHODS[name]
    module_doc = __import__(cls.__module__, fromlist=["_"]).__doc__
    assert module_doc and len(module_doc.strip()) > 40
    assert dataclasses.is_dataclass(cls.Config)
    cls.Config()  # defaults alone are valid
    assert isinstance(cls.streaming, bool) and isinstance(cls.explains_images, bool)
    assert "display_name" in vars(cls) and cls.display_name.strip()  # each built-in names itself for people
    method = get_method(name)
    assert method.name == name and isinstance(method.options(), dict)


CAPABILITIES = ("streaming", "explains_images", "needs_prompt_embeddings", "contrastive", "needs_full_rows",
                "has_device_step")  # fmt: skip


@pytest.mark.parametrize("name", list(METHODS))
def test_method_declares_its_capabilities(name):
    """The decode paths read these flags, never a method's type: each is a bool, and a flag's hooks exist."""
    cls = METHODS[name]
    assert all(isinstance(getattr(cls, flag), bool) for flag in CAPABILITIES), name
    base = AttributionMethod
    if cls.needs_full_rows:
        assert cls.streaming and cls.consume_full_rows is not base.consume_full_rows
    if cls.has_device_step:
        assert cls.streaming and cls.device_step is not base.device_step and cls.finish_step is not base.finish_step


def test_a_subclass_with_its_own_step_loses_the_device_step():
    class Changed(METHODS["macs"]):
        def step(self, rows):
            return super().step(rows)

    class Kept(Changed):
        has_device_step = True

    assert METHODS["macs"].has_device_step and not Changed.has_device_step and Kept.has_device_step
    assert METHODS["rollout"].needs_full_rows and not METHODS["macs"].needs_full_rows


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


@pytest.mark.parametrize("name", list(METHODS))
def test_every_option_is_listed_with_its_type_and_default(name):
    from explainer.methods import method_config, method_options

    options = method_options(name)
    config = METHODS[name].Config()
    assert [o.name for o in options] == [f.name for f in dataclasses.fields(config)]
    for o in options:
        assert o.type in (bool, int, float, str) and getattr(config, o.name) == o.default
        assert isinstance(o.default, o.type) or (o.type is float and isinstance(o.default, int))
        # the default given as text round-trips through the parser
        text = str(o.default).lower() if o.type is bool else str(o.default)
        assert getattr(method_config(name, **{o.name: text}), o.name) == o.default


def test_method_specs_and_their_errors():
    from explainer.errors import InputError
    from explainer.methods import parse_methods

    names, options = parse_methods("macs:alpha=0.5:pooling=mean, rollout, atman:batch_size=4:fast=false,random")
    assert names == ["macs", "rollout", "atman", "random"]
    assert options == {"macs": {"alpha": 0.5, "pooling": "mean"}, "atman": {"batch_size": 4, "fast": False}}
    for spec, message in [
        ("", "at least one method"),
        ("macs:alpha", "key=value"),
        ("macs:alpha=high", "macs:alpha must be a number"),
        ("macs:alpha=2", "Bad options for macs: alpha must lie in"),
        ("macs:pooling=median", "macs:pooling must be one of max, mean, min"),
        ("atman:fast=maybe", "atman:fast is true or false"),
        ("atman:batch_size=2.5", "must be a number (int)"),
        ("macs:alpha=0.5,macs:alpha=0.2", "given twice"),
        ("rollout:nope=1", "Unknown option 'nope' for rollout; its options: residual, head_fusion"),
    ]:
        with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
            parse_methods(spec)
    with pytest.raises(UnknownMethodError, match="Available methods"):
        parse_methods("macs,nope")


def test_python_api_options_are_validated_too():
    from explainer.errors import InputError

    assert get_method("macs", alpha=1).config.alpha == 1.0
    with pytest.raises(InputError, match="true or false"):
        get_method("atman", fast="sometimes")
    with pytest.raises(InputError, match="Unknown option"):
        get_method("random", sed=3)
