"""`FaithfulnessRequest`: checked once when built, with messages a user can act on; no model needed."""

from __future__ import annotations

import numpy as np
import pytest

from explainer.errors import InputError
from explainer.faithfulness import PAPER_SOFT, QUICK_SOFT, FaithfulnessRequest, RemovalConfig, SoftConfig


def test_defaults_measure_both_parts_of_every_method():
    request = FaithfulnessRequest()
    assert request.methods is None and request.positions is None and request.steps is None
    assert request.include_removal and request.soft is QUICK_SOFT and request.removal == RemovalConfig()


def test_sequences_become_tuples_and_repeated_methods_count_once():
    request = FaithfulnessRequest(
        methods=["macs", "rollout", "macs"], positions=np.array([3, 1, 2]), steps=[np.int64(4)], soft=PAPER_SOFT
    )
    assert request.methods == ("macs", "rollout") and request.positions == (3, 1, 2) and request.steps == (4,)
    assert all(type(v) is int for v in request.positions + request.steps)
    assert request == FaithfulnessRequest(methods=("macs", "rollout"), positions=(3, 1, 2), steps=(4,), soft=PAPER_SOFT)
    with pytest.raises(AttributeError):  # frozen: what was checked stays checked
        request.steps = (-1,)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"methods": []}, "No methods to measure"),
        ({"methods": "macs"}, "list of method names"),
        ({"methods": ["macs", ""]}, "list of method names"),
        ({"positions": []}, "Evaluated positions are empty"),
        ({"positions": [0, -1]}, "Evaluated positions are 0-based and cannot be negative, got -1"),
        ({"positions": [0.5]}, "Evaluated positions must be a list of whole numbers"),
        ({"positions": "012"}, "Evaluated positions must be a list of whole numbers"),
        ({"positions": [True]}, "Evaluated positions must be a list of whole numbers"),
        ({"steps": [-2]}, "pi-Soft's steps are 0-based and cannot be negative"),
        ({"steps": 3}, "pi-Soft's steps must be a list of whole numbers"),
        ({"soft": None, "steps": [0]}, "pi-Soft is off"),
        ({"soft": None, "include_removal": False}, "Nothing to measure"),
        ({"image_inputs": {"pixel_values": None}}, "text prompts only"),
        ({"image_inputs": {"pixel_values": None}, "soft": None, "include_removal": False}, "Nothing to measure"),
        ({"removal": {"seed": 1}}, "removal must be a RemovalConfig, got dict"),
        ({"soft": "quick"}, "soft must be a SoftConfig or None, got str"),
    ],
)
def test_bad_requests_are_refused_when_built(kwargs, message):
    with pytest.raises(InputError, match=message.replace("(", r"\(")):
        FaithfulnessRequest(**kwargs)


def test_image_requests_skip_pi_soft_and_do_not_compare_their_tensors():
    a = FaithfulnessRequest(methods=["macs"], positions=[2, 3], soft=None, image_inputs={"pixel_values": object()})
    b = FaithfulnessRequest(methods=["macs"], positions=[2, 3], soft=None, image_inputs={"pixel_values": object()})
    assert a == b and "pixel_values" not in repr(a)
    assert FaithfulnessRequest(soft=SoftConfig(samples=1), include_removal=False).soft.samples == 1
