"""The contrast accordion's handlers with a fake library: the foils offered are the step's alternatives, and the
request explains the answer shown again, teacher-forced, with that step contrastive."""

from __future__ import annotations

import gradio as gr
import numpy as np
import pytest

from explainer.result.attribution import Attribution, MethodScores
from ui import models, stream
from ui.panels import contrast

from ..conftest import FakeBundle, FakeStream, collect, request_fields

ALTERNATIVES = [
    [{"id": 10, "token": " It", "p": 0.6}, {"id": 11, "token": " This", "p": 0.2}],
    [
        {"id": 20, "token": " is", "p": 0.7},
        {"id": 21, "token": " was", "p": 0.1},
        {"id": 22, "token": " are", "p": 0.05},
    ],
]


def result(**meta) -> Attribution:
    raw = np.random.default_rng(0).random((2, 5)).astype(np.float32)
    return Attribution(
        model="fake-tiny",
        prompt_token_ids=list(range(5)),
        prompt_tokens=["<s>", " Where", " is", " it", "?"],
        generated_token_ids=[10, 20],
        generated_tokens=[" It", " is"],
        methods={"macs": MethodScores.from_raw(raw), "atman": MethodScores.from_raw(raw)},
        user_positions=[1, 2, 3, 4],
        meta={"status": "done", "alternatives": ALTERNATIVES, **meta},
    )


def test_the_foils_are_the_steps_alternatives_without_its_own_token():
    view = contrast.foil_choices(result(), 2)
    assert view.foil["choices"] == [("' was' · p = 0.100", "21"), ("' are' · p = 0.050", "22")]
    assert view.foil["value"] == "21"
    assert contrast.foil_choices(result(), 1).foil["choices"] == [("' This' · p = 0.200", "11")]
    assert contrast.foil_choices(None, 1).foil["choices"] == []
    assert contrast.foil_choices(result(alternatives=[]), 1).foil["choices"] == []  # an older saved result


class Recorder:
    def __init__(self):
        self.calls = []

    def __call__(self, bundle, request, progress=None, cancel=None):
        self.calls.append(request_fields(request))
        foils = self.calls[-1]["contrast"]
        attr = result(
            answer="given",
            contrast={"steps": {"1": {"target": " It", "foil": " This", "target_id": 10, "foil_id": 11}},
                      "not_contrastive": ["macs"]},
        )  # fmt: skip
        assert foils == {0: 11} or foils == {0: " That"}
        return FakeStream([attr])


@pytest.fixture
def recorder(monkeypatch):
    rec = Recorder()
    monkeypatch.setattr(models, "model_ids", lambda: (None, None))
    monkeypatch.setattr(models, "load_model", lambda *a, **k: FakeBundle())
    monkeypatch.setattr(stream, "stream_request", rec)
    models.forget_models()
    yield rec
    models.forget_models()


def run(shown, step, picked, typed=""):
    return collect(
        contrast.explain_contrast("Where is it?", ["macs", "atman"], True, False, "token", shown, step, picked, typed)
    )


def test_the_request_teacher_forces_the_answer_shown_with_the_step_contrastive(recorder):
    views = run(result(), 1, "11")
    (call,) = recorder.calls
    assert call["answer"] == [10, 20] and call["max_new_tokens"] == 2 and call["contrast"] == {0: 11}
    final = views[-1]
    assert final.step["value"] == 1  # opened on the contrasted step, not on the last token as after a generation
    assert "rather than" in final.heatmap and "No contrastive map" in final.heatmap
    assert 'data-step="0" data-selected' in final.answer
    assert final.result.meta["contrast"]["not_contrastive"] == ["macs"]
    run(result(), 1, "11", typed=" That")  # a typed foil wins over the dropdown
    assert recorder.calls[-1]["contrast"] == {0: " That"}


def test_with_no_contrastive_method_ticked_atman_is_added_ticked_and_said(recorder):
    """The default MACS + Rollout cannot be contrastive: AtMan is added (as /contrast does), and the step named."""
    ticked = ["macs", "rollout"]
    views = collect(contrast.explain_contrast("Where is it?", ticked, True, False, "token", result(), 1, "11", ""))
    assert recorder.calls[-1]["methods"] == ["macs", "rollout", "atman"]
    assert views[0].methods["value"] == ["macs", "rollout", "atman"]  # the box ticks it: later views keep it
    final = views[-1]
    assert "AtMan was added" in final.status
    assert "No generated tokens yet" not in final.heatmap and "Step 1 of 2 explains why" in final.heatmap
    assert [row[0] for row in final.table] and {row[0] for row in final.table} == {"atman"}  # its top tokens
    collect(contrast.explain_contrast("Where is it?", ["atman"], True, False, "token", result(), 1, "11", ""))
    assert recorder.calls[-1]["methods"] == ["atman"]  # a contrastive method ticked: nothing is added
    assert contrast.contrastive_methods(["macs", "input_x_gradient"]) == ["macs", "input_x_gradient"]
    assert contrast.contrastive_methods(["random"]) == ["random", "atman"]


def test_the_contrast_endpoint_adds_atman_by_the_same_rule(recorder):
    from ui import api

    collect(api.contrast("Where is it?", "It is", 1, " That", ["macs"]))
    assert recorder.calls[-1]["methods"] == ["macs", "atman"]


@pytest.mark.parametrize(
    ("shown", "picked", "message"),
    [(None, "21", "Generate an answer first"), (result(status="generating"), "21", "Generate an answer first"),
     (result(), None, "Pick a foil"), (result(), "abc", "Not a token id")],
)  # fmt: skip
def test_bad_requests_get_a_message(recorder, shown, picked, message):
    with pytest.raises(gr.Error, match=message):
        run(shown, 1, picked)
    assert recorder.calls == []
