"""The time estimate line under the text tab's methods."""

from __future__ import annotations

import pytest

from explainer import bundle_from_objects
from explainer import estimate as est
from explainer.errors import InputError
from explainer.methods import method_options
from ui import models, options
from ui.panels import estimates
from ui.tabs import text_tab

from ..conftest import collect


def defaults() -> list:
    return [opt.default for m in options.method_choices()[0] for opt in method_options(m)]


class FakeEstimates:
    """Stands for `explainer.estimate`: records what the handler passes."""

    def __init__(self):
        self.calls, self.calibrated = [], []

    def calibrate(self, bundle, attr):
        self.calibrated.append(attr)
        return []

    def estimate(
        self, bundle, prompt, max_new_tokens=64, chat_template=True, method_options=None, answer=None, probe=True
    ):
        if not prompt.strip():
            raise InputError("The prompt is empty.")
        self.calls.append(
            {"prompt": prompt, "k": max_new_tokens, "chat": chat_template, "options": method_options, "answer": answer}
        )
        slow = est.Cost(forward_passes=2, forward_tokens=10)
        return [
            est.Estimate("macs", est.Cost(), 0.0, prompt_tokens=7),
            est.Estimate("atman", slow, 38.0, corrected=True, prompt_tokens=7),
            est.Estimate("input_x_gradient", slow, None, prompt_tokens=7),
        ]


def test_estimates_of_the_slower_methods_show_under_the_checkboxes(fake, monkeypatch):
    lib = FakeEstimates()
    monkeypatch.setattr(estimates, "estimate", lib.estimate)
    monkeypatch.setattr(estimates, "calibrate", lib.calibrate)
    values = defaults()
    text = estimates.method_estimates("Where is Paris?", 16.0, True, None, "", *values)
    assert "7 tokens, up to 16 new" in text and "**atman** about 40 s ✓" in text
    assert "**input_x_gradient** not measured yet" in text and "macs" not in text  # free methods are not listed
    call = lib.calls[-1]
    assert call["k"] == 16 and isinstance(call["k"], int) and call["chat"] is True
    assert call["options"]["atman"]["fast"] is True  # the option widgets reach the cost model
    state = collect(text_tab.explain("Where is Paris", ["macs"], 8.0, True, False))[-1].result
    estimates.method_estimates("Where is Paris?", 16, False, state, None, *values)
    assert lib.calibrated[-1] is state and lib.calls[-1]["chat"] is False  # a finished result corrects the figures
    assert estimates.method_estimates("  ", 16, True, None, "", *values) == estimates.HINT
    refused = estimates.method_estimates("hi", 999, True, None, "", *values)
    assert refused.startswith("No time estimate: Max new tokens")
    assert len(lib.calls) == 2
    given = estimates.method_estimates("Where is Paris?", 16, True, None, "In France.", *values)
    assert lib.calls[-1]["answer"] == "In France." and "the given answer" in given and "up to 16 new" not in given


def test_estimates_with_a_real_tiny_model(monkeypatch, llama, tokenizer):
    bundle = bundle_from_objects(llama, tokenizer, name="tiny-app")
    monkeypatch.setattr(models, "get_bundle", lambda: bundle)
    values = defaults()
    try:
        text = estimates.method_estimates("Where is Paris?", 8, True, None, "", *values)
        for method in ("atman", "attnlrp", "grad_ellm", "input_x_gradient"):
            assert f"**{method}** " in text
        assert "**macs**" not in text and "**rollout**" not in text
        broken = [-1 if k == ("atman", "batch_size") else v for k, v in zip(options.option_keys(), values)]
        # the message, escaped for the Markdown line
        assert r"batch\_size" in estimates.method_estimates("Where is Paris?", 8, True, None, "", *broken)
    finally:
        est.forget_speed(bundle)


@pytest.mark.parametrize("prompt", [None, 3, "", " \n"])
def test_no_prompt_shows_the_hint(prompt):
    assert estimates.method_estimates(prompt, 8, True, None, "") == estimates.HINT
