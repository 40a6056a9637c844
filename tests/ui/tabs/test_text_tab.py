"""The text tab's handlers with a fake model: streaming, errors, re-rendering from State, spans, stopped requests,
downloads and reopening."""

from __future__ import annotations

import asyncio
import re

import gradio as gr
import numpy as np
import pytest

from explainer.errors import ModelLoadError
from explainer.models.answer import MAX_NEW_TOKENS_LIMIT
from explainer.result.attribution import Attribution, MethodScores
from ui import models, options, stream
from ui.events import KEEP
from ui.guards import inputs
from ui.stream import Phase, RequestState
from ui.tabs import text_tab
from visuals import answer_html, side_by_side_html, top_tokens_rows
from visuals.export import load_result, png_bytes, result_json
from visuals.granularity import span_side_by_side_html, top_sentences_html
from visuals.png import view_png
from visuals.report import report_html

from ... import upload_files
from ..conftest import ANSWER, collect, first_then_close

NOT_NUMBERS = [float("nan"), float("inf"), "many"]
OFF = {"__type__": "update", "value": None, "interactive": False}


def selected_steps(fragment: str) -> list[str]:
    return re.findall(r'data-step="(\d+)" data-selected', fragment)


def shown_tokens(fragment: str) -> int:
    """Prompt tokens shown over all heatmap panels, from each panel's data-pos ranges ("3-5,9")."""
    n = 0
    for flow in re.findall(r'class="xai-flow" data-pos="([^"]*)"', fragment):
        for part in filter(None, flow.split(",")):
            lo, _, hi = part.partition("-")
            n += int(hi or lo) - int(lo) + 1
    return n


def panel_titles(fragment: str, method: str) -> list[float]:
    """The scores (hover titles) of one heatmap panel's units, in order; NaN for units without a score."""
    panel = fragment.split(f'data-method="{method}"', 1)[1].split('class="xai-panel"', 1)[0]
    flow = panel.split('class="xai-flow"', 1)[1].split("</div>", 1)[0]
    return [float(t) if t[0] in "+-" else float("nan") for t in re.findall(r"<i[^>]* title=([^\s>]+)>", flow)]


def answered(prompt: str = "Where is Paris", methods=("macs",), new=8, *args) -> Attribution:
    return collect(text_tab.explain(prompt, list(methods), new, True, False, *args))[-1].result


def test_explain_streams_every_token_then_opens_on_the_last_content_token(fake):
    start, *outs = collect(text_tab.explain("Where is Paris", ["macs"], 8.0, True, False))
    # first the status line alone (it carries the progress bar), then one update per token, then the final one
    assert start == text_tab.TextView(status=stream.STARTING, request=RequestState(Phase.STARTING))
    assert len(outs) == len(ANSWER) + 1
    for k, view in enumerate(outs[:-1], start=1):
        assert view.answer.count('class="xai-step"') == k
        assert selected_steps(view.answer) == [str(k - 1)]  # follows the newest token
        assert view.step["value"] == k and view.step["maximum"] == max(k, 2) and view.step["interactive"] is False
        assert view.span_end["value"] == k and view.span_end["interactive"] is False
        assert view.status == f"fake step {k}" and view.request == RequestState(Phase.RUNNING)
        assert isinstance(view.result, Attribution) and view.result.num_steps == k
        assert 'data-method="macs"' in view.heatmap
        assert [r[:2] for r in view.table[:2]] == [["macs", 1], ["macs", 2]]
    last = outs[-1]
    state = last.result
    assert state.generated_tokens == ANSWER and last.request == RequestState(Phase.DONE)
    assert last.span_end["value"] == last.span_end["maximum"] == len(ANSWER) and last.span_end["interactive"]
    # the answer ends with <|im_end|>: the view opens on " Paris", the last content token
    assert last.step["interactive"] is True and last.step["value"] == 3 and last.step["maximum"] == len(ANSWER)
    assert selected_steps(last.answer) == ["2"]
    assert last.heatmap == side_by_side_html(state, ["macs"], 2, user_only=True)
    assert last.table == [["macs", *r] for r in top_tokens_rows(state, "macs", 2, 5, True)]
    assert last.status.startswith(f"Done: {len(ANSWER)} tokens")
    assert last.methods is KEEP and last.json_file is KEEP  # an explain event changes only its own outputs
    one = collect(text_tab.explain("hi", ["macs"], 1, True, False))[-1].step
    assert one["value"] == 1 and one["maximum"] == 2 and one["interactive"] is False  # nothing to scrub
    call = fake.calls[0]
    assert call["prompt"] == "Where is Paris" and call["methods"] == ["macs"]
    assert call["max_new_tokens"] == 8 and isinstance(call["max_new_tokens"], int)
    assert call["chat_template"] is True and call["bundle"].name == "fake-tiny"


def test_library_progress_reaches_the_progress_bar(fake):
    seen = []

    def tracker(fraction, desc=None):
        seen.append((fraction, desc))

    collect(text_tab.explain("Where is Paris", ["macs"], 4, True, False, progress=tracker))
    assert seen == [(0.5, "fake post-hoc method halfway")]


def test_model_is_loaded_once_per_process(fake):
    collect(text_tab.explain("a b", ["macs"], 2, False, False))
    collect(text_tab.explain("c d", ["macs", "random"], 2, True, True))
    assert "fake-tiny" in models.model_info()
    assert fake.loads == 1 and models.loaded_models() == 1
    assert fake.calls[-1]["methods"] == ["macs", "random"]


def test_explainer_error_becomes_gr_error(fake):
    with pytest.raises(gr.Error, match="The prompt is empty"):
        collect(text_tab.explain("   ", ["macs"], 8, True, False))
    assert fake.calls == [] and fake.loads == 0  # the request refused it when built: no model loaded or asked


def test_error_mid_stream_becomes_gr_error_is_recorded_and_cancels_the_work(fake):
    fake.fail_after = 2
    seen = []

    async def run():
        async for view in text_tab.explain("Where is Paris", ["macs"], 8, True, False):
            seen.append(view)

    with pytest.raises(gr.Error, match="Out of memory"):
        asyncio.run(run())
    assert [v.result.num_steps for v in seen if v.result is not KEEP] == [1, 2] and fake.closed and fake.cancelled
    failed = seen[-1]  # the request state records the failure before it is raised
    assert failed.request == RequestState(Phase.RUNNING, error="Out of memory on the fake device.")
    assert failed.status is KEEP and failed.result is KEEP
    after = text_tab.after_explain(seen[-2].result, failed.request, ["macs"])
    assert after.status.startswith("Stopped after 2 tokens (failed with the message shown)")
    assert after.request.phase is Phase.FAILED and after.step["interactive"]
    assert text_tab.after_explain(seen[-2].result, after.request) == text_tab.TextView()  # said once


def test_cancelled_request_cancels_the_work(fake):
    out = first_then_close(text_tab.explain("Where is Paris", ["macs"], 8, True, False), 2)
    assert out[-1].result.num_steps == 1
    assert fake.cancelled  # the library's worker gets the cancel; it stops and frees the model (test_session.py)


def test_load_failure_becomes_gr_error(fake, monkeypatch):
    def broken(name=None, **kwargs):
        raise ModelLoadError("Model 'nope' not found: check the id or folder.")

    monkeypatch.setattr(models, "load_model", broken)
    with pytest.raises(gr.Error, match="not found"):
        collect(text_tab.explain("hi", ["macs"], 8, True, False))
    assert "loads with the first request" in models.model_info()  # a page visit tries no load


def test_no_method_selected_is_a_gr_error(fake):
    with pytest.raises(gr.Error, match="at least one"):
        collect(text_tab.explain("hi", [], 8, True, False))
    assert fake.calls == []


def test_render_uses_state_without_running_the_model(fake):
    state = answered()
    calls = len(fake.calls)
    view = text_tab.render(state, ["macs"], 2, False)  # slider is 1-based
    assert selected_steps(view.answer) == ["1"]
    assert view.heatmap == side_by_side_html(state, ["macs"], 1, user_only=True)
    assert [r[3] for r in view.table] == [p for _, _, p, _ in top_tokens_rows(state, "macs", 1, 5, True)]
    assert view.step is KEEP and view.result is KEEP  # a re-render changes the views only
    heatmap_all = text_tab.render(state, ["macs"], 2, True).heatmap
    assert heatmap_all == side_by_side_html(state, ["macs"], 1, user_only=False)
    assert shown_tokens(heatmap_all) == state.num_prompt_tokens > shown_tokens(view.heatmap)
    assert len(fake.calls) == calls
    assert text_tab.render(None, ["macs"], 1, False) == text_tab.TextView("", text_tab.EMPTY_HEATMAP, [])


@pytest.mark.parametrize("value", [0, -1, 257, 10**6, *NOT_NUMBERS, None])
def test_max_new_tokens_past_the_slider_is_a_clear_error(fake, value):
    with pytest.raises(gr.Error, match="Max new tokens must"):
        collect(text_tab.explain("Where is Paris", ["macs"], value, True, False))
    assert fake.calls == []


def test_sliders_at_their_bounds_work(fake):
    for new in inputs.NEW_TOKENS:
        assert answered("Where is Paris", ["macs"], new).num_steps >= 1


@pytest.mark.parametrize("step, shown", [(0, "0"), (-5, "0"), (2, "1"), (3, "2"), (10**6, "3"), (None, "3")])
def test_steps_past_the_slider_are_clamped(fake, step, shown):
    assert selected_steps(text_tab.render(answered(), ["macs"], step, False).answer) == [shown]


@pytest.mark.parametrize("value", NOT_NUMBERS)
def test_a_step_that_is_not_a_number_is_a_clear_error(fake, value):
    with pytest.raises(gr.Error, match="generation step must"):
        text_tab.render(answered(), ["macs"], value, False)


def test_method_options_reach_the_library(fake):
    keys = options.option_keys()
    values = [0.5 if k == ("macs", "alpha") else opt.default for k, opt in zip(keys, _options())]
    collect(text_tab.explain("Where is Paris", ["macs"], 2, True, False, "", False, "token", *values))
    assert fake.calls[-1]["method_options"] == {
        "macs": {"alpha": 0.5, "pooling": "max", "redistribute": True, "keep_layers": False}
    }


def _options():
    from explainer import available_methods
    from explainer.methods import method_options

    return [opt for m in available_methods() for opt in method_options(m)]


def test_a_bad_option_is_a_clear_error(fake):
    values = [2.0 if k == ("macs", "alpha") else o.default for k, o in zip(options.option_keys(), _options())]
    with pytest.raises(gr.Error, match="alpha must lie in"):  # the request checks the options when it is built
        collect(text_tab.explain("Where is Paris", ["macs"], 2, True, False, None, False, "token", *values))
    assert fake.calls == [] and fake.loads == 0  # before the model is loaded or asked


def test_a_given_answer_is_teacher_forced_and_said_so(fake):
    last = collect(text_tab.explain("Where is Paris", ["macs"], 2, True, False, "It is in France"))[-1]
    call = fake.calls[-1]
    assert call["answer"] == "It is in France"
    # the slider said 2 new tokens; a byte-level tokenizer makes at most one token per UTF-8 byte (+1)
    assert call["max_new_tokens"] == len(b"It is in France") + 1
    state = last.result
    assert state.generated_tokens == [" It", " is", " in", " France"] and state.meta["answer"] == "given"
    assert last.status.startswith("Done: 4 tokens of the given answer (teacher-forced).")
    assert "Given answer (teacher-forced)" in last.answer and last.answer == answer_html(state, 3)
    assert 'data-low="true"' in last.answer  # the fake gives step k probability 0.5^k: steps 4+ are below 0.1
    for empty in ("", "  \n", None):  # an empty box generates, with the slider's length
        collect(text_tab.explain("Where is Paris", ["macs"], 3, True, False, empty))
        assert fake.calls[-1]["answer"] is None and fake.calls[-1]["max_new_tokens"] == 3
    collect(text_tab.explain("Where is Paris", ["macs"], 200, True, False, "Paris"))
    assert fake.calls[-1]["max_new_tokens"] == 200  # never lowered
    with pytest.raises(gr.Error, match=r"more than max_new_tokens \(1024\)"):  # said by the library
        collect(text_tab.explain("Where is Paris", ["macs"], 2, True, False, "é " * 3000))
    assert fake.calls[-1]["max_new_tokens"] == MAX_NEW_TOKENS_LIMIT  # the library's limit
    with pytest.raises(gr.Error, match="The answer must be text"):
        collect(text_tab.explain("Where is Paris", ["macs"], 3, True, False, ["It"]))


@pytest.mark.parametrize("answer", ["Paris.", " It is Paris, the capital of France!\n\nYes.", "a\n\n\n\n"])
def test_a_given_answer_longer_than_the_slider_is_explained_whole(monkeypatch, llama, tokenizer, answer):
    """The real library with a tiny model: an answer longer than the slider's max new tokens is explained whole."""
    from explainer import bundle_from_objects
    from explainer.explain import stream_request as real_stream

    bundle = bundle_from_objects(llama, tokenizer, name="tiny-app")
    monkeypatch.setattr(stream, "stream_request", real_stream)
    monkeypatch.setattr(models, "get_bundle", lambda: bundle)
    attr = collect(text_tab.explain("Where is Paris?", ["macs"], 1, True, False, answer))[-1].result
    assert attr.meta["answer"] == "given" and attr.meta["status"] == "done"
    assert tokenizer.decode(attr.generated_token_ids) == answer and attr.num_steps > 1
    assert set(attr.step_scores) == {"probability", "entropy"} and len(attr.step_scores["entropy"]) == attr.num_steps


def test_a_span_at_sentence_units_shows_mean_maps_and_top_sentences(fake):
    state = answered("Paris is big. It is in France. Berlin is far", ["macs", "random"])
    methods = ["macs", "random"]
    view = text_tab.render(state, methods, 2, False, True, 4, "sentence")  # steps 2-4, 1-based
    assert view.answer == answer_html(state, 1, 3) and selected_steps(view.answer) == ["1", "2", "3"]
    assert view.heatmap == span_side_by_side_html(state, methods, 1, 3, "sentence") + top_sentences_html(
        state, methods, 1, 3, text_tab.TOP_SENTENCES
    )
    assert 'data-granularity="sentence"' in view.heatmap and 'class="xai-top"' in view.heatmap
    assert view.table == []  # top tokens are one step's; the top sentences stand in for them
    assert text_tab.render(state, methods, 4, False, True, 2, "sentence") == view  # either order
    # independent: token units over the span are the mean over the steps of z re-normalised over the user's tokens
    tokens_view = text_tab.render(state, ["macs"], 2, False, True, 4, "token").heatmap
    raw = state.methods["macs"].raw[1:4][:, state.user_positions].astype(np.float64)  # (3, n)
    z = (raw - raw.mean(axis=1, keepdims=True)) / raw.std(axis=1, keepdims=True)
    np.testing.assert_allclose(panel_titles(tokens_view, "macs"), z.mean(axis=0), atol=0.006)  # titles: 2 decimals
    # one step at word units: the word view, top sentences, and that step's top tokens
    word = text_tab.render(state, ["macs"], 2, False, False, 4, "word")
    assert selected_steps(word.answer) == ["1"]
    assert word.heatmap.startswith(span_side_by_side_html(state, ["macs"], 1, 1, "word"))
    assert word.table == [["macs", *r] for r in top_tokens_rows(state, "macs", 1, 5, True)]
    one = text_tab.render(state, ["macs"], 2, False, False, None, "token").heatmap
    assert one == side_by_side_html(state, ["macs"], 1)
    with pytest.raises(gr.Error, match="Prompt units must be one of token, word, sentence"):
        text_tab.render(state, ["macs"], 2, False, False, None, "paragraph")
    with pytest.raises(gr.Error, match="generation step must"):
        text_tab.render(state, ["macs"], 2, False, True, "end", "token")


def test_span_and_units_follow_the_stream_and_a_finished_span_covers_the_answer(fake):
    _, *outs = collect(text_tab.explain("Paris is big. It is far", ["macs"], 8, True, False, None, True, "sentence"))
    for k, view in enumerate(outs[:-1], start=1):
        assert view.step["value"] == view.span_end["value"] == k and not view.step["interactive"]  # the newest
        assert selected_steps(view.answer) == [str(k - 1)]
        assert 'data-granularity="sentence"' in view.heatmap and f"Step {k} of {k} explains" in view.heatmap
    last = outs[-1]
    k = last.result.num_steps
    assert last.step["value"] == 1 and last.span_end["value"] == last.span_end["maximum"] == k
    assert last.step["interactive"]
    assert last.heatmap.startswith(span_side_by_side_html(last.result, ["macs"], 0, k - 1, "sentence"))
    ticked = text_tab.span_controls(last.result, True)  # ticking the box: the whole answer, no token table
    assert ticked.step["value"] == 1 and ticked.span_end["visible"] and not ticked.table["visible"]
    assert ticked.span_end["value"] == ticked.span_end["maximum"] == k
    unticked = text_tab.span_controls(last.result, False)
    assert not unticked.span_end["visible"] and unticked.table["visible"] and unticked.step is KEEP
    assert text_tab.span_controls(None, True).span_end["visible"]


def partial(n: int) -> tuple[Attribution, RequestState]:
    """The result and request state after a request that stopped after `n` streamed tokens (cancelled)."""
    views = first_then_close(text_tab.explain("Where is Paris", ["macs"], 8, True, False), n + 1)
    return views[-1].result, views[-1].request


def test_a_stopped_request_gets_its_status_and_free_sliders_after_it_stops(fake):
    state, request = partial(3)
    assert state.meta["status"] == "fake step 3" and request == RequestState(Phase.RUNNING)
    after = text_tab.after_explain(state, request, ["macs"])
    assert after.status.startswith("Stopped after 3 tokens (cancelled)") and "model is free" in after.status
    assert after.step["interactive"] and after.step["value"] == after.step["maximum"] == 3
    assert after.span_end["maximum"] == 3 and after.request == RequestState(Phase.CANCELLED)
    assert after.result is state and selected_steps(after.answer) == ["2"]  # the views follow the slider
    assert after.heatmap == side_by_side_html(state, ["macs"], 2, user_only=True)
    ended, ended_request = partial(4)  # stopped after its <|im_end|>, before the methods finished
    stopped_view = text_tab.after_explain(ended, ended_request, ["macs"])
    assert stopped_view.step["value"] == 3 and selected_steps(stopped_view.answer) == ["2"]  # " Paris"
    assert text_tab.after_explain(state, after.request) == text_tab.TextView()  # said once
    done = answered()
    assert text_tab.after_explain(done, RequestState(Phase.DONE)) == text_tab.TextView()  # left as shown
    assert text_tab.after_explain(None, None) == text_tab.TextView()
    # a request cancelled while it waited for the model never replaced the waiting note
    waited = text_tab.after_explain(done, RequestState(Phase.WAITING))
    assert waited.status.startswith("Stopped before it started (cancelled while waiting") and waited.step is KEEP
    # and one stopped (or failed) before its first token never replaced the starting note
    started = text_tab.after_explain(done, RequestState(Phase.STARTING))
    assert started.status.startswith("Stopped before the first token (cancelled)") and started.step is KEEP
    failed = text_tab.after_explain(done, RequestState(Phase.STARTING, error="Model 'x' not found"))
    assert failed.status.startswith("Stopped before the first token (failed") and failed.request.phase is Phase.FAILED
    # stopped after its last update but before the end: it had finished
    done.meta["status"] = "done"
    assert text_tab.after_explain(done, RequestState(Phase.RUNNING)) == text_tab.TextView(
        request=RequestState(Phase.DONE)
    )


def _file(update: dict) -> bytes:
    assert update["interactive"] is True
    return open(update["value"], "rb").read()


def test_exports_are_the_libraries_files(fake):
    state = answered("Paris is big. It is far", ["macs", "random"])
    files = text_tab.export_files(state, ["random", "macs"], False)
    assert files.json_file["value"].endswith("explanation-fake-tiny-4steps.json")
    assert _file(files.json_file).decode() == result_json(state)
    assert _file(files.report_file).decode() == report_html(state, ["random", "macs"], user_only=True)
    report = text_tab.export_report(state, ["macs", "atman"], True).report_file
    assert _file(report).decode() == report_html(state, ["macs"], user_only=False)  # no scores: left out
    png = _file(text_tab.export_view(state, ["macs"], 2, False).png_file)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png == png_bytes(view_png(state, ["macs"], 1, user_only=True))
    for off in (
        text_tab.export_view(state, ["macs"], 2, False, True, "token").png_file,  # one step's token view only
        text_tab.export_view(state, ["macs"], 2, False, False, "sentence").png_file,
        text_tab.export_view(None, ["macs"], 2, False).png_file,
        text_tab.export_files(None, ["macs"], False).json_file,
        text_tab.export_files(None, ["macs"], False).report_file,
        *[getattr(text_tab.clear_downloads(), name) for name in text_tab.FILES],
    ):
        assert off == OFF


def test_a_saved_result_reopens_to_identical_views_without_a_model(fake, tmp_path):
    state = answered("Paris is big. It is far", ["macs", "random"])
    saved = upload_files.uploaded(tmp_path / "saved.json")
    saved.write_bytes(_file(text_tab.export_files(state, ["macs"], False).json_file))
    models.forget_models()
    calls, loads = len(fake.calls), fake.loads
    opened = text_tab.open_saved(str(saved), False, False, "token")
    assert fake.loads == loads and len(fake.calls) == calls  # no model loaded, none asked
    assert opened.methods["value"] == ["macs", "random"] and opened.request == RequestState()
    assert opened.step["value"] == 3 and opened.step["maximum"] == 4 and opened.step["interactive"]  # " Paris"
    assert opened.status.startswith("Opened saved.json: 4 answer tokens by fake-tiny") and "no model" in opened.status
    views = text_tab.render(state, ["macs", "random"], 3, False)
    assert (opened.answer, opened.heatmap, opened.table) == (views.answer, views.heatmap, views.table)
    for view in [(1, False, False, None, "token"), (2, True, True, 4, "sentence"), (3, False, False, None, "word")]:
        assert text_tab.render(opened.result, ["macs", "random"], *view) == text_tab.render(
            state, ["macs", "random"], *view
        )
    assert load_result(str(saved)).to_dict() == opened.result.to_dict()
    assert text_tab.open_saved(None, False, False, "token") == text_tab.TextView()
    broken = upload_files.uploaded(tmp_path / "broken.json")
    broken.write_text('{"model": "x"')
    with pytest.raises(gr.Error, match="not valid JSON"):
        text_tab.open_saved(str(broken), False, False, "token")
    foreign = upload_files.uploaded(tmp_path / "foreign.json")
    mine = {"mine": MethodScores.from_raw(np.zeros((0, 1)))}
    foreign.write_text(result_json(Attribution(model="m", prompt_token_ids=[1], prompt_tokens=["a"], methods=mine)))
    box = text_tab.open_saved(str(foreign), False, False, "token").methods
    assert box["value"] == ["mine"] and box["choices"][-1] == "mine"  # an unregistered method can still be shown


