"""The faithfulness panel's handlers with a fake model and fake reports."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from types import SimpleNamespace

import gradio as gr
import pytest
from PIL import Image

from explainer.errors import InputError
from explainer.faithfulness import (
    MEASURING_SOFT,
    QUICK_SOFT,
    FaithfulnessReport,
    LdsReport,
    RemovalReport,
    SoftReport,
)
from ui.events import KEEP
from ui.panels import faithfulness, measurement
from ui.panels.faithfulness import SOFT_CHOICES, FaithfulnessView
from ui.stream import Phase, RequestState
from ui.tabs import text_tab

from ..conftest import FakeStream, collect


def fake_report() -> FaithfulnessReport:
    fractions = [0.0, 0.1, 0.2]
    removal = RemovalReport(fractions=fractions)
    for m, drop in (("macs", 0.5), ("random", 0.9)):
        curve = {"mif": [1.0, drop, drop], "lif": [1.0, 1.0, 1.0]}
        removal.curves[m] = {k: curve for k in ("logit", "ppl", "rougeL", "bleu")}
        removal.auc[m] = {k: {"mif": drop, "lif": 1.0, "srg": 1.0 - drop} for k in ("logit", "ppl", "rougeL", "bleu")}
    soft = SoftReport(pis=[0.1, 0.5], steps=[0], ns={"macs": [0.2, 0.6]}, nc={"macs": [0.5, 0.9]})
    soft.auc_ns["macs"], soft.auc_nc["macs"] = 0.16, 0.28
    return FaithfulnessReport(removal=removal, soft=soft)


def plot(update: dict) -> tuple:
    """(figure, visible) of a plot's update."""
    return update["value"], update["visible"]


@pytest.fixture
def answer(fake):
    return collect(text_tab.explain("Where is Paris", ["macs"], 8.0, True, False))[-1].result


def test_faithfulness_panel_shows_removal_first_then_soft(answer, monkeypatch):
    calls = []
    full = fake_report()
    full.seconds, full.status = {"removal": 1.0, "soft": 2.0}, "done"
    first = replace(full, soft=None, seconds={"removal": 1.0}, status=f"removal curves done; {MEASURING_SOFT}")

    def fake_stream(bundle, result, request, progress=None, cancel=None):
        calls.append((result, request.methods, request.soft, request.steps))
        progress(0.5, "halfway")
        return FakeStream([first, full])

    monkeypatch.setattr(faithfulness, "stream_faithfulness", fake_stream)
    outs = collect(faithfulness.faithfulness(answer, ["macs", "rollout"], "perplexity", SOFT_CHOICES[0], 2))
    assert calls[0][1] == ("macs",) and calls[0][2] is QUICK_SOFT  # only methods of this result
    assert calls[0][3] == (1,)  # the slider's step (1-based) as a 0-based step
    start, removal_ready, *_, last = outs
    assert start == FaithfulnessView(status=faithfulness.MEASURING, request=RequestState(Phase.STARTING))
    assert removal_ready.removal is not None and plot(removal_ready.soft) == (None, True)  # removal curves first,
    # pi-Soft's plot waits for its figure
    assert "π-Soft running" in removal_ready.status and removal_ready.request == RequestState(Phase.RUNNING)
    assert plot(last.soft)[0] is not None and "macs" in last.status and "soft 2.0 s" in last.status
    assert last.status.startswith("Measured on 4 answer tokens") and last.request == RequestState(Phase.DONE)
    assert [r[0] for r in last.table] == ["macs", "random"] and last.table[0][2] == pytest.approx(0.5)
    again = faithfulness.render_faithfulness(last.report, "BLEU")
    assert again.table == last.table and again.removal is not None and again.status is KEEP
    assert faithfulness.render_faithfulness(None, "BLEU") == FaithfulnessView(
        removal=None, lds=None, lds_note="", soft=None, table=[]
    )
    assert plot(last.lds) == (None, False) and "tick *sources*" in last.lds_note  # no surrogate here: says how to
    collect(faithfulness.faithfulness(answer, ["macs"], "BLEU", SOFT_CHOICES[1], 2))
    assert calls[-1][3] is None  # every 5th step
    collect(faithfulness.faithfulness(answer, ["macs"], "BLEU", SOFT_CHOICES[2], 2))
    assert calls[-1][2] is None  # pi-Soft skipped


def test_soft_cost_is_shown_before_it_starts(answer):
    one = faithfulness.soft_cost_note(answer, ["macs"], SOFT_CHOICES[0], 2, None).cost
    every = faithfulness.soft_cost_note(answer, ["macs"], SOFT_CHOICES[1], 2, None).cost
    masks = 2 * len(QUICK_SOFT.pis) * QUICK_SOFT.samples
    per_step = 2 + masks + -(-masks // 16)  # unperturbed, all-zero, the masks, and an unperturbed row per batch of 16
    assert f"1 step × {per_step} forward passes" in one and "forward passes" in every and "about" not in one
    assert faithfulness.soft_cost_note(answer, ["macs"], SOFT_CHOICES[2], 2, None).cost == "π-Soft: off."
    assert faithfulness.soft_cost_note(None, ["macs"], SOFT_CHOICES[0], 2, None).cost == ""
    measured = fake_report()
    measured.removal.tokens_per_second = 10.0  # once the removal curves ran, their speed gives an ETA
    timed = faithfulness.soft_cost_note(answer, ["macs"], SOFT_CHOICES[0], 2, measured).cost
    tokens = int(timed.split(" over ")[1].split(" positions")[0].replace(",", ""))
    assert f"about {tokens / 10:.0f} s at the speed measured for the removal curves" in timed


@pytest.mark.parametrize("step, steps", [(None, [3]), (1, [0]), (0, [0]), (10**6, [3]), (2.0, [1])])
def test_soft_steps_follow_the_slider_clamped(answer, step, steps):
    assert measurement.soft_steps(answer, SOFT_CHOICES[0], step) == steps
    assert measurement.soft_steps(answer, SOFT_CHOICES[1], step) is None
    assert measurement.soft_steps(answer, SOFT_CHOICES[2], step) is False


def test_faithfulness_errors_become_gr_errors_and_are_recorded(answer, monkeypatch):
    with pytest.raises(gr.Error, match="Generate an answer first"):
        collect(faithfulness.faithfulness(None, ["macs"], "mean logit"))
    with pytest.raises(gr.Error, match="Select at least one"):
        collect(faithfulness.faithfulness(answer, ["atman"], "mean logit"))

    def failing(*args, **kwargs):
        def work():
            raise InputError("No prompt positions to evaluate.")
            yield

        return FakeStream(work())

    monkeypatch.setattr(faithfulness, "stream_faithfulness", failing)
    seen = []

    async def run():
        async for view in faithfulness.faithfulness(answer, ["macs"], "mean logit"):
            seen.append(view)

    with pytest.raises(gr.Error, match="No prompt positions"):
        asyncio.run(run())
    assert seen[-1].request == RequestState(Phase.STARTING, error="No prompt positions to evaluate.")
    after = faithfulness.after_faithfulness(seen[-1].request)
    assert after.status.startswith("Stopped: the measurement failed") and after.request.phase is Phase.FAILED


def test_a_measurement_that_did_not_finish_says_so_after_it_stops():
    stopped = faithfulness.after_faithfulness(RequestState(Phase.RUNNING))
    assert stopped.status.startswith("Stopped: the measurement was cancelled")
    assert stopped.request == RequestState(Phase.CANCELLED)
    assert faithfulness.after_faithfulness(RequestState(Phase.DONE)) == FaithfulnessView()
    assert faithfulness.after_faithfulness(stopped.request) == FaithfulnessView()  # said once


def test_image_results_rank_their_image_tokens_and_skip_soft(vl_fake, monkeypatch, tmp_path):
    import torch

    from explainer.models import vision
    from ui import gpu_time
    from ui.tabs import image_tab

    image = Image.new("RGB", (45, 31), (40, 90, 200))
    result = collect(image_tab.explain_image(image, "What?", ["macs", "random"], 3, 0.5, True, 64))[-1].result
    encoded, calls = [], []

    def encode(bundle, img, question, max_new_tokens=64, max_image_tokens=None):
        encoded.append((img, question, max_new_tokens, max_image_tokens))
        ids = torch.tensor([result.attr.prompt_token_ids if question == "What?" else [0, 1]])
        return SimpleNamespace(input_ids=ids, prefill_inputs={"pixel_values": "pixels"})

    def fake_stream(bundle, attr, request, progress=None, cancel=None):
        calls.append((attr, request.methods, request.soft, request.steps, request))
        full = fake_report()
        return FakeStream([replace(full, soft=None, status="removal curves done")])

    monkeypatch.setattr(vision, "encode_image_prompt", encode)
    monkeypatch.setattr(faithfulness, "stream_faithfulness", fake_stream)
    outs = collect(faithfulness.faithfulness(result, ["macs", "rollout"], "BLEU", SOFT_CHOICES[2], 2))
    assert encoded == [(image, "What?", 3, 64)]  # the question and image as asked, with the same image budget
    attr, methods, soft, steps, request = calls[0]
    assert attr is result.attr and methods == ("macs",) and soft is None and steps is None  # no pi-Soft on images
    assert request.positions == (2, 3, 4, 5, 6, 7) and request.image_inputs == {"pixel_values": "pixels"}
    last = outs[-1]
    assert last.removal is not None and plot(last.soft) == (None, False) and last.request == RequestState(Phase.DONE)
    assert "π-Soft" not in last.status
    collect(faithfulness.faithfulness(result, ["macs"], "BLEU", SOFT_CHOICES[0], 2, "image+question"))
    assert calls[-1][2] is None and calls[-1][4].positions == (2, 3, 4, 5, 6, 7, 9, 10)  # and the question's
    with pytest.raises(gr.Error, match="Unknown choice"):
        collect(faithfulness.faithfulness(result, ["macs"], "BLEU", SOFT_CHOICES[0], 2, "question"))
    stale = image_tab.ImageResult(result.attr, image, "Other?", 64)  # the prompt encodes to other tokens
    with pytest.raises(gr.Error, match="no longer match"):
        collect(faithfulness.faithfulness(stale, ["macs"], "BLEU"))
    assert len(calls) == 2
    assert faithfulness.soft_cost_note(result, ["macs"], SOFT_CHOICES[0], 2, None).cost == ""  # no pi-Soft cost
    text = gpu_time.faithfulness_seconds(result.attr, ["macs"], "BLEU", SOFT_CHOICES[2], 2)
    assert gpu_time.faithfulness_seconds(result, ["macs"], "BLEU", SOFT_CHOICES[0], 2) > text  # + vision prefill


def test_the_gpu_time_asked_is_that_of_the_request_the_handler_runs(answer, vl_fake, monkeypatch):
    """`gpu_time.faithfulness_seconds` gets the handler's own arguments: it must size the request the handler then
    streams, for every widget setting (a handler and a duration function that read the widgets differently fail)."""
    import torch

    from explainer.models import vision
    from ui import gpu_time
    from ui.tabs import image_tab

    streamed = []

    def fake_stream(bundle, attr, request, progress=None, cancel=None):
        streamed.append(request)
        return FakeStream([replace(fake_report(), status="done")])

    image = Image.new("RGB", (45, 31), (40, 90, 200))
    shown = collect(image_tab.explain_image(image, "What?", ["macs", "random"], 3, 0.5, True, 64))[-1].result
    ids = torch.tensor([shown.attr.prompt_token_ids])
    encoded = SimpleNamespace(input_ids=ids, prefill_inputs={"pixel_values": "pixels"})
    monkeypatch.setattr(vision, "encode_image_prompt", lambda *args, **kwargs: encoded)
    monkeypatch.setattr(faithfulness, "stream_faithfulness", fake_stream)
    monkeypatch.setattr(gpu_time, "gpu_duration", lambda seconds: seconds)  # the estimate itself, not rounded up
    asked = []
    settings = [(answer, ["macs", "rollout"], "BLEU", choice, step) for choice in SOFT_CHOICES for step in (1, 3, None)]
    settings += [(shown, ["macs", "random"], "BLEU", SOFT_CHOICES[0], 2, rank) for rank in ("image", "image+question")]
    for args in settings:
        collect(faithfulness.faithfulness(*args))
        request, image_result = streamed[-1], args[0] is shown
        assert request == measurement.faithfulness_request(*args[:2], *args[3:])
        expected = gpu_time.faithfulness_request_seconds(measurement.measured(args[0]), request, image_result)
        assert gpu_time.faithfulness_seconds(*args) == expected
        asked.append(expected)
    assert len(streamed) == len(settings) and len(set(asked)) == 5  # skip; steps 1 (= every 5th), 3, the newest; image


def test_the_note_promises_a_dashed_random_curve_only_where_one_is_drawn():
    """The removal curves always add the random orderings (dashed); π-Soft has no random curve (random orderings have
    no scores to calibrate) unless the result holds the random method's scores."""
    from visuals import soft_figure

    dashed = lambda fig: {t.name.split(" ")[0] for t in fig.data if t.line.dash == "dash"}  # noqa: E731
    curves = {"pis": [0.1, 0.5], "steps": [0]}
    without = SoftReport(**curves, ns={"macs": [0.2, 0.6]}, nc={"macs": [0.5, 0.9]}, auc_ns={"macs": 0.1},
                         auc_nc={"macs": 0.2})  # fmt: skip
    assert dashed(soft_figure(without)) == set()
    scored = SoftReport(**curves, ns={"macs": [0.2, 0.6], "random": [0.1, 0.2]},
                        nc={"macs": [0.5, 0.9], "random": [0.3, 0.4]}, auc_ns={"macs": 0.1, "random": 0.05},
                        auc_nc={"macs": 0.2, "random": 0.1})  # fmt: skip
    assert dashed(soft_figure(scored)) == {"random"}
    soft_part = faithfulness.NOTE.split("**π-Soft**")[1]
    assert "The random baseline is dashed" not in faithfulness.NOTE  # it read as a promise for π-Soft too
    assert "π-Soft has no random curve unless the method *random* was ticked" in soft_part
    assert "removal curves add a random baseline (random orderings, dashed)" in faithfulness.NOTE


def test_the_panel_draws_each_method_s_lds_beside_the_removal_curves():
    fit = {"held_out_spearman": 0.8, "checks": 4, "cross_validated_spearman": 0.9, "ablations": 16}
    lds = LdsReport(lds={"macs": 0.5, "sources": 0.9}, masks={"macs": 21, "sources": 17}, units=6, fit=fit)
    view = faithfulness.render_faithfulness(FaithfulnessReport(lds=lds), "BLEU")
    assert [t.y[0] for t in plot(view.lds)[0].data] == ["macs", "sources (own fit)"] and plot(view.lds)[1]
    assert "the full prompt and Sources' 20 ablations over 6 units" in view.lds_note
    assert "held out on 4 more masks +0.80" in view.lds_note
    assert view.removal is None and plot(view.soft) == (None, False)
