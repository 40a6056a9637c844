"""The Gradio app with a fake model: streaming handler, error mapping, re-rendering from State, event wiring.

No model is loaded: `app.load_model` / `app.stream_explain` / `app.stream_faithfulness` are replaced by fakes that
hand out every update (the library's own streams, their merging and cancellation are tested in `test_session.py`).
The handlers are async generators, as Gradio runs them; `collect` drives one to the end.
"""

from __future__ import annotations

import asyncio
import base64
import importlib
import inspect
import re
import sys

import gradio as gr
import numpy as np
import pytest

from explainer.errors import ExplainerError, InputError, ModelLoadError
from explainer.result import Attribution, MethodScores
from visuals import side_by_side_html, top_tokens_rows

from . import upload_files

ANSWER = [" It", " is", " Paris", "<|im_end|>"]


class FakeModel:
    """Stands for a loaded model: only its identity (the library's per-model lock) is used."""


class FakeBundle:
    name = "fake-tiny"
    max_prompt_tokens = 32
    model = FakeModel()


class FakeStream:
    """The part of `explainer.session.WorkerStream` the app uses, over a plain iterator, one item per call."""

    def __init__(self, items, on_cancel=None):
        self._items = iter(items)
        self.cancelled = False
        self._on_cancel = on_cancel

    def latest(self, timeout):
        return next(self._items)

    def cancel(self, reason=None):
        self.cancelled = True
        if self._on_cancel:
            self._on_cancel()


def collect(agen) -> list:
    """Run an async generator handler to its end (as Gradio would) and return what it yielded."""

    async def run():
        return [item async for item in agen]

    return asyncio.run(run())


def first_then_close(agen, n: int = 1) -> list:
    """Take `n` updates, then close the handler as Gradio does when the visitor cancels or leaves."""

    async def run():
        out = [await agen.__anext__() for _ in range(n)]
        await agen.aclose()
        return out

    return asyncio.run(run())


class FakeLibrary:
    """Records calls; streams one `Attribution` per answer token, like the real `stream_explain`."""

    def __init__(self):
        self.loads = 0
        self.calls: list[dict] = []
        self.closed = False
        self.cancelled = False
        self.fail_after: int | None = None
        self.load_options: dict = {}

    def load_model(self, name=None, **options):
        self.loads += 1
        self.load_options = options
        return FakeBundle()

    def available_methods(self):
        return ["macs", "random"]

    def stream_explain(
        self, bundle, prompt, methods=("macs",), max_new_tokens=64, chat_template=True, progress=None, cancel=None,
        method_options=None, answer=None,
    ):  # fmt: skip
        if progress is not None:
            progress(0.5, "fake post-hoc method halfway")
        self.calls.append(
            {
                "bundle": bundle,
                "prompt": prompt,
                "methods": methods,
                "max_new_tokens": max_new_tokens,
                "chat_template": chat_template,
                "method_options": method_options,
                "answer": answer,
            }
        )
        return FakeStream(self._stream(prompt, list(methods), max_new_tokens, answer), on_cancel=self._cancel)

    def _cancel(self):
        self.cancelled = True

    def _stream(self, prompt, methods, max_new_tokens, given=None):
        try:
            if not prompt.strip():
                raise InputError("The prompt is empty: type a question first.")
            words = [" " + w for w in prompt.split()]
            tokens = ["<|im_start|>", "user", "\n", *words, "<|im_end|>"]
            n = len(tokens)
            answer = ANSWER[:max_new_tokens] if given is None else [" " + w for w in given.split()]
            if len(answer) > max_new_tokens:
                raise InputError(f"The answer has {len(answer)} tokens, more than max_new_tokens ({max_new_tokens}).")
            raw = np.random.default_rng(0).random((len(answer), n)).astype(np.float32)  # (K, N)
            for k in range(1, len(answer) + 1):
                if self.fail_after is not None and k > self.fail_after:
                    raise InputError("Out of memory on the fake device.")
                yield Attribution(
                    model="fake-tiny",
                    prompt_token_ids=list(range(n)),
                    prompt_tokens=tokens,
                    generated_token_ids=list(range(k)),
                    generated_tokens=answer[:k],
                    methods={m: MethodScores.from_raw(raw[:k], seconds=0.01 * k) for m in methods},
                    user_positions=list(range(3, 3 + len(words))),
                    meta={"status": f"fake step {k}", "answer": "generated" if given is None else "given"},
                    step_scores={"probability": [0.5 ** (i + 1) for i in range(k)], "entropy": [1.0] * k},
                )
        finally:
            self.closed = True


@pytest.fixture(scope="module")
def app_module():
    saved = sys.modules.pop("app", None)
    yield importlib.import_module("app")
    if saved is None:
        sys.modules.pop("app", None)
    else:
        sys.modules["app"] = saved


@pytest.fixture
def fake(app_module, monkeypatch):
    lib = FakeLibrary()
    monkeypatch.setattr(app_module, "load_model", lib.load_model)
    monkeypatch.setattr(app_module, "stream_explain", lib.stream_explain)
    monkeypatch.setattr(app_module, "ExplainerError", ExplainerError)
    app_module._load.cache_clear()
    yield lib
    app_module._load.cache_clear()


def _selected_step(fragment: str) -> list[str]:
    return re.findall(r'data-step="(\d+)" data-selected', fragment)


def _shown_tokens(fragment: str) -> int:
    """Prompt tokens shown over all heatmap panels, from each panel's data-pos ranges ("3-5,9")."""
    n = 0
    for flow in re.findall(r'class="xai-flow" data-pos="([^"]*)"', fragment):
        for part in filter(None, flow.split(",")):
            lo, _, hi = part.partition("-")
            n += int(hi or lo) - int(lo) + 1
    return n


def test_import_loads_no_model(app_module):
    assert app_module._load.cache_info().currsize == 0
    assert isinstance(app_module.demo, gr.Blocks)


def test_device_map_from_the_environment(app_module, fake, monkeypatch):
    monkeypatch.setenv("EXPLAINER_DEVICE_MAP", "auto")
    app_module.get_bundle()
    assert fake.load_options["device_map"] == "auto"
    app_module._load.cache_clear()
    monkeypatch.delenv("EXPLAINER_DEVICE_MAP")
    app_module.get_bundle()
    assert fake.load_options["device_map"] is None


def test_explain_streams_every_token_then_unlocks_the_slider(app_module, fake):
    start, *outs = collect(app_module.explain("Where is Paris", ["macs"], 8.0, True, False))
    # first the status line alone (it carries the progress bar), then one update per token, then the final one
    assert start[5] == app_module._STARTING and all(isinstance(x, type(gr.skip())) for x in start[:5] + start[6:])
    assert len(outs) == len(ANSWER) + 1
    for k, (answer, heatmap, rows, slider, span_end, status, state) in enumerate(outs[:-1], start=1):
        assert answer.count('class="xai-step"') == k
        assert _selected_step(answer) == [str(k - 1)]  # follows the newest token
        assert slider["value"] == k and slider["maximum"] == max(k, 2) and slider["interactive"] is False
        assert span_end["value"] == k and span_end["interactive"] is False
        assert status == f"fake step {k}"
        assert isinstance(state, Attribution) and state.num_steps == k
        assert 'data-method="macs"' in heatmap
        assert [r[:2] for r in rows[:2]] == [["macs", 1], ["macs", 2]]
    answer, heatmap, rows, slider, span_end, status, state = outs[-1]
    assert isinstance(state, Attribution) and state.generated_tokens == ANSWER
    assert span_end["value"] == span_end["maximum"] == len(ANSWER) and span_end["interactive"] is True
    assert slider["interactive"] is True and slider["value"] == slider["maximum"] == len(ANSWER)
    one = collect(app_module.explain("hi", ["macs"], 1, True, False))[-1][3]
    assert one["value"] == 1 and one["maximum"] == 2 and one["interactive"] is False  # nothing to scrub
    assert status.startswith(f"Done: {len(ANSWER)} tokens")
    assert heatmap == side_by_side_html(state, ["macs"], len(ANSWER) - 1, user_only=True)
    assert rows == [["macs", *r] for r in top_tokens_rows(state, "macs", len(ANSWER) - 1, 5, True)]
    call = fake.calls[0]
    assert call["prompt"] == "Where is Paris" and call["methods"] == ["macs"]
    assert call["max_new_tokens"] == 8 and isinstance(call["max_new_tokens"], int)
    assert call["chat_template"] is True and call["bundle"].name == "fake-tiny"


def test_library_progress_reaches_the_progress_bar(app_module, fake):
    seen = []

    def tracker(fraction, desc=None):
        seen.append((fraction, desc))

    collect(app_module.explain("Where is Paris", ["macs"], 4, True, False, progress=tracker))
    assert seen == [(0.5, "fake post-hoc method halfway")]


def test_model_is_loaded_once_per_process(app_module, fake):
    collect(app_module.explain("a b", ["macs"], 2, False, False))
    collect(app_module.explain("c d", ["macs", "random"], 2, True, True))
    assert "fake-tiny" in app_module.model_info()
    assert fake.loads == 1
    assert fake.calls[-1]["methods"] == ["macs", "random"]


def test_explainer_error_becomes_gr_error(app_module, fake):
    with pytest.raises(gr.Error, match="The prompt is empty"):
        collect(app_module.explain("   ", ["macs"], 8, True, False))
    assert fake.closed


def test_error_mid_stream_becomes_gr_error_and_cancels_the_work(app_module, fake):
    fake.fail_after = 2
    seen = []

    async def run():
        async for out in app_module.explain("Where is Paris", ["macs"], 8, True, False):
            if isinstance(out[-1], Attribution):  # not the first, status-only update
                seen.append(out[-1].num_steps)

    with pytest.raises(gr.Error, match="Out of memory"):
        asyncio.run(run())
    assert seen == [1, 2] and fake.closed and fake.cancelled


def test_cancelled_request_cancels_the_work(app_module, fake):
    out = first_then_close(app_module.explain("Where is Paris", ["macs"], 8, True, False), 2)
    assert out[-1][-1].num_steps == 1
    assert fake.cancelled  # the library's worker gets the cancel; it stops and frees the model (test_session.py)


def test_load_failure_becomes_gr_error(app_module, fake, monkeypatch):
    def broken(name=None, **options):
        raise ModelLoadError("Model 'nope' not found: check the id or folder.")

    monkeypatch.setattr(app_module, "load_model", broken)
    with pytest.raises(gr.Error, match="not found"):
        collect(app_module.explain("hi", ["macs"], 8, True, False))
    with pytest.raises(gr.Error, match="not found"):
        app_module.model_info()


def test_no_method_selected_is_a_gr_error(app_module, fake):
    with pytest.raises(gr.Error, match="at least one"):
        collect(app_module.explain("hi", [], 8, True, False))
    assert fake.calls == []


def test_render_uses_state_without_running_the_model(app_module, fake):
    state = collect(app_module.explain("Where is Paris", ["macs"], 8, True, False))[-1][-1]
    calls = len(fake.calls)
    answer, heatmap, rows = app_module.render(state, ["macs"], 2, False)  # slider is 1-based
    assert _selected_step(answer) == ["1"]
    assert heatmap == side_by_side_html(state, ["macs"], 1, user_only=True)
    assert [r[3] for r in rows] == [p for _, _, p, _ in top_tokens_rows(state, "macs", 1, 5, True)]
    _, heatmap_all, _ = app_module.render(state, ["macs"], 2, True)
    assert heatmap_all == side_by_side_html(state, ["macs"], 1, user_only=False)
    assert _shown_tokens(heatmap_all) == state.num_prompt_tokens > _shown_tokens(heatmap)
    assert len(fake.calls) == calls
    assert app_module.render(None, ["macs"], 1, False)[2] == []


def test_demo_wires_named_queued_events(app_module):
    fns = {fn.api_name: fn for fn in app_module.demo.fns.values()}
    assert {"explain", "render", "model_info"} <= set(fns)
    assert all(fn.api_name for fn in app_module.demo.fns.values())
    assert fns["explain"].concurrency_limit == 1
    assert inspect.isasyncgenfunction(fns["explain"].fn)
    cancels = [fn for fn in app_module.demo.fns.values() if fn.cancels]
    assert {tuple(app_module.demo.fns[i].api_name for i in fn.cancels) for fn in cancels} == {
        ("explain",),
        ("faithfulness",),
        ("explain_image",),
    }
    # Cancel runs nothing that sets the status (it would race with the request's last update): the handlers that
    # do run after the cancelled request, finished or not
    assert all(fn.fn is None for fn in cancels)
    for after, request in [("after_explain", "explain"), ("after_faithfulness", "faithfulness"),
                           ("after_image", "explain_image")]:  # fmt: skip
        assert fns[after].trigger_after == fns[request]._id and not fns[after].trigger_only_on_success
    assert fns["render"].fn is app_module.render
    config = app_module.demo.get_config_file()
    assert any(dep.get("api_name") == "explain" for dep in config["dependencies"])


def _image_attr(k: int, methods) -> Attribution:
    """A fake image-prompt result: 2 x 3 image tokens after two template tokens, then the question."""
    tokens = ["<|im_start|>", "<|vision_start|>", *["<|image_pad|>"] * 6, "<|vision_end|>", " What", "?"]
    raw = np.random.default_rng(0).random((k, len(tokens))).astype(np.float32)  # (K, N)
    return Attribution(
        model="fake-vlm",
        prompt_token_ids=list(range(len(tokens))),
        prompt_tokens=tokens,
        generated_token_ids=list(range(k)),
        generated_tokens=ANSWER[:k],
        methods={m: MethodScores.from_raw(raw) for m in methods},
        user_positions=[9, 10],
        meta={"status": f"fake step {k}"},
        image={"token_positions": list(range(2, 8)), "grid": [2, 3], "size": [45, 31]},
    )


def test_image_tab_without_a_vision_model_says_how_to_set_one(app_module, fake, monkeypatch):
    monkeypatch.setattr(app_module, "VLM_ID", None)
    assert "EXPLAINER_VLM" in app_module.vlm_info()
    from PIL import Image

    with pytest.raises(gr.Error, match="EXPLAINER_VLM"):
        collect(app_module.explain_image(Image.new("RGB", (45, 31)), "What?", ["macs"], 4, 0.5, True))
    assert fake.loads == 0 and fake.calls == []
    overlay, answer, question = app_module.render_image(None, ["macs"], 1, 0.5, True)
    assert overlay is None and answer == ""


class VLFake:
    """A vision-language bundle and stream: records what reaches the library, streams three fake image results."""

    def __init__(self):
        self.calls: list[dict] = []

    def stream(self, bundle, prompt, methods=("macs",), max_new_tokens=64, image=None, progress=None, **kw):
        self.calls.append(
            {"prompt": prompt, "image": image, "methods": list(methods), "max_new_tokens": max_new_tokens, **kw}
        )
        return FakeStream(_image_attr(k, methods) for k in range(1, 4))


@pytest.fixture
def vl_fake(app_module, fake, monkeypatch):
    class VLBundle(FakeBundle):
        name = "fake-vlm"
        image_processor = object()

    lib = VLFake()
    monkeypatch.setattr(app_module, "VLM_ID", "fake-vlm")
    monkeypatch.setattr(app_module, "load_model", lambda name=None, **options: VLBundle())
    monkeypatch.setattr(app_module, "stream_explain", lib.stream)
    return lib


def test_image_questions_stream_overlays_and_rerender_from_state(app_module, vl_fake, tmp_path):
    from PIL import Image

    assert "fake-vlm" in app_module.vlm_info()
    path = tmp_path / "blue.png"
    Image.new("RGB", (45, 31), (40, 90, 200)).save(path)
    outs = collect(app_module.explain_image(str(path), "What?", ["macs", "random"], 3, 0.5, True, 64))
    image = vl_fake.calls[0]["image"]  # the library gets the image our loader opened, not the path
    assert outs[0][4] == app_module._STARTING  # the status line first: it carries the progress bar
    assert len(outs) == 5 and isinstance(image, Image.Image) and image.mode == "RGB" and image.size == (45, 31)
    assert image.getpixel((3, 3)) == (40, 90, 200) and vl_fake.calls[0]["prompt"] == "What?"
    assert vl_fake.calls[0]["max_image_tokens"] == 64  # the "image detail" slider reaches the library
    overlay, answer, question, slider, status, state = outs[-1]
    assert isinstance(overlay, Image.Image) and overlay.height == 31 + 18 and overlay.width > 2 * 45
    assert slider["interactive"] is True and slider["value"] == 3 and status.startswith("Done: 3 tokens")
    assert 'data-method="macs"' in question and _shown_tokens(question) == 2 * 2  # the question only
    assert state["image"] is image  # the State keeps the loaded image: re-rendering never reads the file again
    path.unlink()
    again = app_module.render_image(state, ["macs"], 1, 0.2, False)
    assert again[0].width == 45 and len(vl_fake.calls) == 1
    with pytest.raises(gr.Error, match="Upload an image"):
        collect(app_module.explain_image(None, "What?", ["macs"], 3, 0.5, True))


@pytest.mark.parametrize("name", sorted(upload_files.BROKEN))
def test_a_broken_upload_gets_a_one_line_message_naming_the_file(app_module, vl_fake, tmp_path, name):
    path = upload_files.write(tmp_path, name)
    with pytest.raises(gr.Error, match=upload_files.BROKEN[name][1]) as info:
        collect(app_module.explain_image(str(path), "What?", ["macs"], 4, 0.5, True, 64))
    message = info.value.message
    assert "\n" not in message and message.startswith(f"Image {name!r}") and str(tmp_path) not in message
    assert vl_fake.calls == []  # refused before the model is asked


@pytest.mark.parametrize("name", sorted(upload_files.ODD))
def test_odd_formats_reach_the_library_as_rgb(app_module, vl_fake, tmp_path, name):
    path = upload_files.write(tmp_path, name)
    outs = collect(app_module.explain_image(str(path), "What?", ["macs"], 3, 0.5, True, 64))
    image = vl_fake.calls[-1]["image"]
    _, _, pixel, tolerance = upload_files.ODD[name]
    assert image.mode == "RGB" and image.size == (20, 12)
    np.testing.assert_allclose(image.getpixel((0, 0)), pixel, atol=tolerance)
    assert outs[-1][-1]["image"] is image and app_module.render_image(outs[-1][-1], ["macs"], 2, 0.5, True)[0]


def test_example_images_still_work(app_module, vl_fake):
    examples = app_module._example_images()
    assert examples
    for path in examples:
        collect(app_module.explain_image(str(path), app_module.DEFAULT_QUESTION, ["macs"], 2, 0.5, True, 64))
        assert vl_fake.calls[-1]["image"].size == (224, 160)


def test_the_upload_reaches_the_handler_unopened(app_module, vl_fake, tmp_path):
    from gradio.data_classes import ImageData

    fns = {fn.api_name: fn for fn in app_module.demo.fns.values()}
    assert fns["explain_image"].preprocess is False  # gradio hands over its raw payload
    broken = upload_files.write(tmp_path, "notes.png")
    upload = ImageData(path=str(broken), orig_name="notes.png")
    with pytest.raises(Exception, match="cannot identify image file"):
        # what the issue saw: gr.Image opens it and fails without a reason
        fns["explain_image"].inputs[0].preprocess(upload)
    payload = upload.model_dump()  # what the handler gets: {"path": ..., "orig_name": ..., "url": None, ...}
    with pytest.raises(gr.Error, match="Image 'notes.png' is not an image file"):
        collect(app_module.explain_image(payload, "What?", ["macs"], 4, 0.5, True, 64))
    png = upload_files.write(tmp_path, "bilevel.png").read_bytes()
    inline = {"path": None, "url": "data:image/png;base64," + base64.b64encode(png).decode()}
    collect(app_module.explain_image(inline, "What?", ["macs"], 4, 0.5, True, 64))
    assert vl_fake.calls[-1]["image"].size == (20, 12)
    with pytest.raises(gr.Error, match="not valid base64"):
        collect(app_module.explain_image({"url": "data:image/png;base64,&&&"}, "What?", ["macs"], 4, 0.5, True, 64))
    with pytest.raises(gr.Error, match="carries no file"):
        collect(app_module.explain_image({"path": None, "url": None}, "What?", ["macs"], 4, 0.5, True, 64))


_NOT_NUMBERS = [float("nan"), float("inf"), "many"]


@pytest.mark.parametrize("value", [0, -1, 257, 10**6, *_NOT_NUMBERS, None])
def test_max_new_tokens_past_the_slider_is_a_clear_error(app_module, fake, value):
    with pytest.raises(gr.Error, match="Max new tokens must"):
        collect(app_module.explain("Where is Paris", ["macs"], value, True, False))
    assert fake.calls == []


@pytest.mark.parametrize(
    "new, detail, message",
    [(v, 64, "Max new tokens must") for v in [0, -1, 129, 10**6, *_NOT_NUMBERS, None]]
    + [(4, v, "Image detail must") for v in [0, 15, 1025, 10**6, *_NOT_NUMBERS]],
)
def test_image_sliders_past_their_bounds_are_clear_errors(app_module, vl_fake, tmp_path, new, detail, message):
    path = upload_files.write(tmp_path, "bilevel.png")
    with pytest.raises(gr.Error, match=message):
        collect(app_module.explain_image(str(path), "What?", ["macs"], new, 0.5, True, detail))
    assert vl_fake.calls == []


def test_sliders_at_their_bounds_work(app_module, fake, vl_fake, tmp_path):
    for new in app_module.NEW_TOKENS:
        assert collect(app_module.explain("Where is Paris", ["macs"], new, True, False))[-1][-1].num_steps >= 1
    path = upload_files.write(tmp_path, "bilevel.png")
    for new, detail in zip(app_module.IMAGE_NEW_TOKENS, app_module.IMAGE_TOKENS):
        collect(app_module.explain_image(str(path), "What?", ["macs"], new, 0.5, True, detail))
        assert vl_fake.calls[-1]["max_image_tokens"] == detail


@pytest.mark.parametrize("step, shown", [(0, "0"), (-5, "0"), (2, "1"), (3, "2"), (10**6, "2"), (None, "2")])
def test_steps_past_the_slider_are_clamped_and_opacity_too(app_module, vl_fake, tmp_path, step, shown):
    path = upload_files.write(tmp_path, "bilevel.png")
    state = collect(app_module.explain_image(str(path), "What?", ["macs"], 3, 0.5, True, 64))[-1][-1]  # 3 steps
    assert _selected_step(app_module.render(state["attr"], ["macs"], step, False)[0]) == [shown]
    assert _selected_step(app_module.render_image(state, ["macs"], step, 0.5, True)[1]) == [shown]
    for opacity in (-1, 0, 1, 5):
        assert app_module.render_image(state, ["macs"], step, opacity, True)[0].size == (20, 12 + 18)


@pytest.mark.parametrize("value", _NOT_NUMBERS)
def test_steps_and_opacity_that_are_not_numbers_are_clear_errors(app_module, vl_fake, tmp_path, value):
    path = upload_files.write(tmp_path, "bilevel.png")
    image_state = collect(app_module.explain_image(str(path), "What?", ["macs"], 3, 0.5, True, 64))[-1][-1]
    with pytest.raises(gr.Error, match="generation step must"):
        app_module.render(image_state["attr"], ["macs"], value, False)
    with pytest.raises(gr.Error, match="generation step must"):
        app_module.render_image(image_state, ["macs"], value, 0.5, True)
    with pytest.raises(gr.Error, match="Overlay opacity must"):
        app_module.render_image(image_state, ["macs"], 2, value, True)
    with pytest.raises(gr.Error, match="Overlay opacity must"):
        collect(app_module.explain_image(str(path), "What?", ["macs"], 3, value, True, 64))


def _fake_report():
    from explainer.faithfulness import FaithfulnessReport, RemovalReport, SoftReport

    fractions = [0.0, 0.1, 0.2]
    removal = RemovalReport(fractions=fractions)
    for m, drop in (("macs", 0.5), ("random", 0.9)):
        curve = {"mif": [1.0, drop, drop], "lif": [1.0, 1.0, 1.0]}
        removal.curves[m] = {k: curve for k in ("logit", "ppl", "rougeL", "bleu")}
        removal.auc[m] = {k: {"mif": drop, "lif": 1.0, "srg": 1.0 - drop} for k in ("logit", "ppl", "rougeL", "bleu")}
    soft = SoftReport(pis=[0.1, 0.5], steps=[0], ns={"macs": [0.2, 0.6]}, nc={"macs": [0.5, 0.9]})
    soft.auc_ns["macs"], soft.auc_nc["macs"] = 0.16, 0.28
    return FaithfulnessReport(removal=removal, soft=soft)


def test_faithfulness_panel_shows_removal_first_then_soft(app_module, fake, monkeypatch):
    from dataclasses import replace

    attr = collect(app_module.explain("Where is Paris", ["macs"], 8.0, True, False))[-1][-1]
    calls = []
    full = _fake_report()
    full.seconds, full.status = {"removal": 1.0, "soft": 2.0}, "done"
    first = replace(full, soft=None, seconds={"removal": 1.0}, status="removal curves done")

    def fake_stream(bundle, result, methods, soft=None, steps=None, progress=None, cancel=None):
        calls.append((result, methods, soft, steps))
        progress(0.5, "halfway")
        return FakeStream([first, full])

    monkeypatch.setattr(app_module, "stream_faithfulness", fake_stream)
    outs = collect(app_module.faithfulness(attr, ["macs", "rollout"], "perplexity", app_module.SOFT_CHOICES[0], 2))
    assert calls[0][1] == ["macs"] and calls[0][2] is app_module.QUICK_SOFT  # only methods of this result
    assert calls[0][3] == [1]  # the slider's step (1-based) as a 0-based step
    start, (removal, soft, rows, status, report), last = outs
    assert start[3] == "Measuring the removal curves…"  # the status line, which carries the progress bar, at once
    assert removal is not None and soft is None and "π-Soft running" in status  # removal curves come first
    removal, soft, rows, status, report = last
    assert soft is not None and "macs" in status and "soft 2.0 s" in status
    assert [r[0] for r in rows] == ["macs", "random"] and rows[0][2] == pytest.approx(0.5)
    again = app_module.render_faithfulness(report, "BLEU")
    assert again[2] == rows and again[0] is not None
    assert app_module.render_faithfulness(None, "BLEU") == (None, None, [])
    collect(app_module.faithfulness(attr, ["macs"], "BLEU", app_module.SOFT_CHOICES[1], 2))
    assert calls[-1][3] is None  # every 5th step
    collect(app_module.faithfulness(attr, ["macs"], "BLEU", app_module.SOFT_CHOICES[2], 2))
    assert calls[-1][2] is None  # pi-Soft skipped


def test_soft_cost_is_shown_before_it_starts(app_module, fake):
    attr = collect(app_module.explain("Where is Paris", ["macs"], 8.0, True, False))[-1][-1]
    one = app_module.soft_cost_note(attr, ["macs"], app_module.SOFT_CHOICES[0], 2, None)
    every = app_module.soft_cost_note(attr, ["macs"], app_module.SOFT_CHOICES[1], 2, None)
    per_step = 2 + 2 * len(app_module.QUICK_SOFT.pis) * app_module.QUICK_SOFT.samples
    assert f"1 step × {per_step} forward passes" in one and "forward passes" in every
    assert app_module.soft_cost_note(attr, ["macs"], app_module.SOFT_CHOICES[2], 2, None) == "π-Soft: off."
    assert app_module.soft_cost_note(None, ["macs"], app_module.SOFT_CHOICES[0], 2, None) == ""


def test_faithfulness_errors_become_gr_errors(app_module, fake, monkeypatch):
    with pytest.raises(gr.Error, match="Generate an answer first"):
        collect(app_module.faithfulness(None, ["macs"], "mean logit"))
    attr = collect(app_module.explain("Where is Paris", ["macs"], 8.0, True, False))[-1][-1]
    with pytest.raises(gr.Error, match="Select at least one"):
        collect(app_module.faithfulness(attr, ["atman"], "mean logit"))

    def failing(*args, **kwargs):
        def work():
            raise InputError("No prompt positions to evaluate.")
            yield

        return FakeStream(work())

    monkeypatch.setattr(app_module, "stream_faithfulness", failing)
    with pytest.raises(gr.Error, match="No prompt positions"):
        collect(app_module.faithfulness(attr, ["macs"], "mean logit"))


def test_faithfulness_event_is_named_and_shares_the_model_queue(app_module):
    fns = {fn.api_name: fn for fn in app_module.demo.fns.values()}
    assert fns["faithfulness"].fn is app_module.faithfulness
    assert fns["faithfulness"].concurrency_limit == 1
    assert fns["faithfulness"].concurrency_id == fns["explain"].concurrency_id
    # progress is drawn on each model event's status line only, so results already shown stay readable
    statuses = {"faithfulness": 3, "explain": 5, "explain_image": 4}
    for name, index in statuses.items():
        assert list(fns[name].show_progress_on) == [fns[name].outputs[index]], name
    assert fns["render_faithfulness"].fn is app_module.render_faithfulness


def test_method_options_are_generated_from_the_configs_and_reach_the_library(app_module, fake):
    from explainer.methods import method_options

    keys = [(m, o.name) for m in app_module.available_methods() for o in method_options(m)]
    assert app_module.OPTION_KEYS == keys and len(app_module.OPTION_WIDGETS) == len(keys)
    widget = dict(zip(keys, app_module.OPTION_WIDGETS))
    assert isinstance(widget[("macs", "pooling")], gr.Dropdown) and widget[("macs", "pooling")].value == "max"
    assert isinstance(widget[("atman", "fast")], gr.Checkbox) and isinstance(widget[("macs", "alpha")], gr.Number)
    values = [0.5 if k == ("macs", "alpha") else w.value for k, w in zip(keys, app_module.OPTION_WIDGETS)]
    collect(app_module.explain("Where is Paris", ["macs"], 2, True, False, "", False, "token", *values))
    assert fake.calls[-1]["method_options"] == {"macs": {"alpha": 0.5, "pooling": "max", "redistribute": True}}
    fns = {fn.api_name: fn for fn in app_module.demo.fns.values()}
    assert len(fns["explain"].inputs) == 8 + len(keys) and len(fns["explain_image"].inputs) == 8 + len(keys)


def test_a_bad_option_is_a_clear_error(app_module, fake, monkeypatch):
    from explainer import stream_explain

    monkeypatch.setattr(app_module, "stream_explain", stream_explain)  # the real library validates the options
    monkeypatch.setattr(app_module, "get_bundle", FakeBundle)  # options are checked before the model is used
    keys = app_module.OPTION_KEYS
    values = [2.0 if k == ("macs", "alpha") else w.value for k, w in zip(keys, app_module.OPTION_WIDGETS)]
    with pytest.raises(gr.Error, match="alpha must lie in"):
        collect(app_module.explain("Where is Paris", ["macs"], 2, True, False, None, False, "token", *values))


def _checkbox_groups(app_module) -> list:
    return [
        c["props"]
        for c in app_module.demo.get_config_file()["components"]
        if c.get("type") == "checkboxgroup" and c["props"].get("label") == "Attribution methods"
    ]


def test_macs_and_rollout_are_ticked_on_first_use_in_both_tabs(app_module):
    groups = _checkbox_groups(app_module)
    assert len(groups) == 2 and all(g["value"] == ["macs", "rollout"] for g in groups)
    slow = {"atman", "attnlrp", "grad_ellm", "input_x_gradient"}
    assert slow <= {c[0] if isinstance(c, list | tuple) else c for c in groups[0]["choices"]}  # offered, not ticked


def test_image_defaults_keep_only_methods_that_explain_images(app_module, monkeypatch):
    monkeypatch.setattr(app_module, "DEFAULT_METHODS", ["macs", "input_x_gradient", "atman"])
    assert app_module._method_choices()[1] == ["macs", "input_x_gradient", "atman"]
    assert app_module._method_choices(image=True)[1] == ["macs", "atman"]  # gradients refuse image prompts
    monkeypatch.setattr(app_module, "DEFAULT_METHODS", ["input_x_gradient"])
    assert app_module._method_choices(image=True)[1] == app_module._method_choices()[0][:1]  # never none ticked


class FakeEstimates:
    """Stands for `explainer.estimate`: records what the handler passes."""

    def __init__(self):
        self.calls, self.calibrated = [], []

    def calibrate(self, bundle, attr):
        self.calibrated.append(attr)
        return []

    def estimate(self, bundle, prompt, max_new_tokens=64, chat_template=True, method_options=None, answer=None):
        from explainer.estimate import Cost, Estimate

        if not prompt.strip():
            raise InputError("The prompt is empty.")
        self.calls.append(
            {"prompt": prompt, "k": max_new_tokens, "chat": chat_template, "options": method_options, "answer": answer}
        )
        slow = Cost(forward_passes=2, forward_tokens=10)
        return [
            Estimate("macs", Cost(), 0.0, prompt_tokens=7),
            Estimate("atman", slow, 38.0, corrected=True, prompt_tokens=7),
            Estimate("input_x_gradient", slow, None, prompt_tokens=7),
        ]


def test_estimates_of_the_slower_methods_show_under_the_checkboxes(app_module, fake, monkeypatch):
    lib = FakeEstimates()
    monkeypatch.setattr(app_module, "estimate", lib.estimate)
    monkeypatch.setattr(app_module, "calibrate", lib.calibrate)
    values = [w.value for w in app_module.OPTION_WIDGETS]
    text = app_module.method_estimates("Where is Paris?", 16.0, True, None, "", *values)
    assert "7 tokens, up to 16 new" in text and "**atman** about 40 s ✓" in text
    assert "**input_x_gradient** not measured yet" in text and "macs" not in text  # free methods are not listed
    call = lib.calls[-1]
    assert call["k"] == 16 and isinstance(call["k"], int) and call["chat"] is True
    assert call["options"]["atman"]["fast"] is True  # the option widgets reach the cost model
    state = collect(app_module.explain("Where is Paris", ["macs"], 8.0, True, False))[-1][-1]
    app_module.method_estimates("Where is Paris?", 16, False, state, None, *values)
    assert lib.calibrated[-1] is state and lib.calls[-1]["chat"] is False  # a finished result corrects the figures
    assert app_module.method_estimates("  ", 16, True, None, "", *values) == app_module._ESTIMATE_HINT
    refused = app_module.method_estimates("hi", 999, True, None, "", *values)
    assert refused.startswith("No time estimate: Max new tokens")
    assert len(lib.calls) == 2
    given = app_module.method_estimates("Where is Paris?", 16, True, None, "In France.", *values)
    assert lib.calls[-1]["answer"] == "In France." and "the given answer" in given and "up to 16 new" not in given


def test_estimates_with_a_real_tiny_model(app_module, monkeypatch, llama, tokenizer):
    from explainer import bundle_from_objects
    from explainer import estimate as est

    bundle = bundle_from_objects(llama, tokenizer, name="tiny-app")
    monkeypatch.setattr(app_module, "get_bundle", lambda: bundle)
    values = [w.value for w in app_module.OPTION_WIDGETS]
    try:
        text = app_module.method_estimates("Where is Paris?", 8, True, None, "", *values)
        for method in ("atman", "attnlrp", "grad_ellm", "input_x_gradient"):
            assert f"**{method}** " in text
        assert "**macs**" not in text and "**rollout**" not in text
        broken = [0 if k == ("atman", "batch_size") else v for k, v in zip(app_module.OPTION_KEYS, values)]
        assert "batch_size" in app_module.method_estimates("Where is Paris?", 8, True, None, "", *broken)
    finally:
        est.forget_speed(bundle)


def test_estimate_event_follows_prompt_length_and_options_and_each_answer(app_module):
    fns = {fn.api_name: fn for fn in app_module.demo.fns.values()}
    event = fns["estimate"]
    assert event.fn is app_module.method_estimates and event.trigger_mode == "always_last"
    assert len(event.inputs) == 5 + len(app_module.OPTION_KEYS)  # prompt, max new, template, state, answer
    assert len(event.targets) == 4 + len(app_module.OPTION_KEYS) and {t[1] for t in event.targets} == {"change"}
    after = fns["estimate_after_explain"]  # once per answer, not on every streamed update
    assert after.fn is app_module.method_estimates and after.inputs == event.inputs
    assert after.trigger_after == fns["explain"]._id and not after.trigger_only_on_success


# --- issue 11 in the app: a given answer, step scores, spans and units, exports, reopening, stopped requests --------


def _panel_titles(fragment: str, method: str) -> list[float]:
    """The scores (hover titles) of one heatmap panel's units, in order; NaN for units without a score."""
    panel = fragment.split(f'data-method="{method}"', 1)[1].split('class="xai-panel"', 1)[0]
    flow = panel.split('class="xai-flow"', 1)[1].split("</div>", 1)[0]
    return [float(t) if t[0] in "+-" else float("nan") for t in re.findall(r"<i[^>]* title=([^\s>]+)>", flow)]


def test_a_given_answer_is_teacher_forced_and_said_so(app_module, fake):
    outs = collect(app_module.explain("Where is Paris", ["macs"], 2, True, False, "It is in France"))
    call = fake.calls[-1]
    assert call["answer"] == "It is in France"
    # the slider said 2 new tokens; the answer's 15 UTF-8 bytes (+1) always hold its tokens
    assert call["max_new_tokens"] == len(b"It is in France") + 1
    answer, heatmap, rows, slider, span_end, status, state = outs[-1]
    assert state.generated_tokens == [" It", " is", " in", " France"] and state.meta["answer"] == "given"
    assert status.startswith("Done: 4 tokens of the given answer (teacher-forced).")
    assert "Given answer (teacher-forced)" in answer and answer == app_module.answer_html(state, 3)
    assert 'data-low="true"' in answer  # the fake gives step k probability 0.5^k: steps 4+ are below 0.1
    for empty in ("", "  \n", None):  # an empty box generates, with the slider's length
        collect(app_module.explain("Where is Paris", ["macs"], 3, True, False, empty))
        assert fake.calls[-1]["answer"] is None and fake.calls[-1]["max_new_tokens"] == 3
    collect(app_module.explain("Where is Paris", ["macs"], 200, True, False, "Paris"))
    assert fake.calls[-1]["max_new_tokens"] == 200  # never lowered
    assert app_module._answer_budget("é" * 5000, 8) == app_module.MAX_NEW_TOKENS_LIMIT  # the library's limit
    with pytest.raises(gr.Error, match="The answer must be text"):
        collect(app_module.explain("Where is Paris", ["macs"], 3, True, False, ["It"]))


@pytest.mark.parametrize(
    "answer", ["Paris.", " It is Paris, the capital of France!\n\nYes.", "🙂 Zürich — 東京 \t", "a\n\n\n\n"]
)
def test_the_answer_budget_fits_a_real_tokenizer(app_module, monkeypatch, llama, tokenizer, answer):
    """The real library with a tiny model: an answer longer than the slider's max new tokens is explained whole."""
    from explainer import bundle_from_objects
    from explainer import stream_explain as real_stream

    bundle = bundle_from_objects(llama, tokenizer, name="tiny-app")
    monkeypatch.setattr(app_module, "stream_explain", real_stream)
    monkeypatch.setattr(app_module, "get_bundle", lambda: bundle)
    attr = collect(app_module.explain("Where is Paris?", ["macs"], 1, True, False, answer))[-1][-1]
    assert attr.meta["answer"] == "given" and attr.meta["status"] == "done"
    assert tokenizer.decode(attr.generated_token_ids) == answer and attr.num_steps > 1
    assert attr.num_steps <= app_module._answer_budget(answer, 1)
    assert set(attr.step_scores) == {"probability", "entropy"} and len(attr.step_scores["entropy"]) == attr.num_steps


def test_a_span_at_sentence_units_shows_mean_maps_and_top_sentences(app_module, fake):
    from visuals.granularity import span_side_by_side_html, top_sentences_html

    prompt = "Paris is big. It is in France. Berlin is far"
    state = collect(app_module.explain(prompt, ["macs", "random"], 8, True, False))[-1][-1]
    methods = ["macs", "random"]
    answer, heatmap, rows = app_module.render(state, methods, 2, False, True, 4, "sentence")  # steps 2-4, 1-based
    assert answer == app_module.answer_html(state, 1, 3)
    assert re.findall(r'data-step="(\d+)" data-selected', answer) == ["1", "2", "3"]
    assert heatmap == span_side_by_side_html(state, methods, 1, 3, "sentence") + top_sentences_html(
        state, methods, 1, 3, app_module.TOP_SENTENCES
    )
    assert 'data-granularity="sentence"' in heatmap and 'class="xai-top"' in heatmap
    assert rows == []  # top tokens are one step's; the top sentences stand in for them
    assert app_module.render(state, methods, 4, False, True, 2, "sentence") == (answer, heatmap, rows)  # either order
    # independent: token units over the span are the mean over the steps of z re-normalised over the user's tokens
    _, tokens_view, _ = app_module.render(state, ["macs"], 2, False, True, 4, "token")
    raw = state.methods["macs"].raw[1:4][:, state.user_positions].astype(np.float64)  # (3, n)
    z = (raw - raw.mean(axis=1, keepdims=True)) / raw.std(axis=1, keepdims=True)
    np.testing.assert_allclose(_panel_titles(tokens_view, "macs"), z.mean(axis=0), atol=0.006)  # titles: 2 decimals
    # one step at word units: the word view, top sentences, and that step's top tokens
    answer, heatmap, rows = app_module.render(state, ["macs"], 2, False, False, 4, "word")
    assert re.findall(r'data-step="(\d+)" data-selected', answer) == ["1"]
    assert heatmap.startswith(span_side_by_side_html(state, ["macs"], 1, 1, "word"))
    assert rows == [["macs", *r] for r in top_tokens_rows(state, "macs", 1, 5, True)]
    assert app_module.render(state, ["macs"], 2, False, False, None, "token")[1] == side_by_side_html(
        state, ["macs"], 1
    )
    with pytest.raises(gr.Error, match="Prompt units must be one of token, word, sentence"):
        app_module.render(state, ["macs"], 2, False, False, None, "paragraph")
    with pytest.raises(gr.Error, match="generation step must"):
        app_module.render(state, ["macs"], 2, False, True, "end", "token")


def test_span_and_units_follow_the_stream_and_a_finished_span_covers_the_answer(app_module, fake):
    from visuals.granularity import span_side_by_side_html

    _, *outs = collect(app_module.explain("Paris is big. It is far", ["macs"], 8, True, False, None, True, "sentence"))
    for k, (answer, heatmap, _, slider, end, _, _) in enumerate(outs[:-1], start=1):
        assert slider["value"] == end["value"] == k and not slider["interactive"]  # the newest token while live
        assert re.findall(r'data-step="(\d+)" data-selected', answer) == [str(k - 1)]
        assert 'data-granularity="sentence"' in heatmap and f"Step {k} of {k} explains" in heatmap
    answer, heatmap, rows, slider, end, _, state = outs[-1]
    k = state.num_steps
    assert slider["value"] == 1 and end["value"] == end["maximum"] == k and slider["interactive"]
    assert heatmap.startswith(span_side_by_side_html(state, ["macs"], 0, k - 1, "sentence"))
    step, end, table = app_module.span_controls(state, True)  # ticking the box: the whole answer, no token table
    assert step["value"] == 1 and end["visible"] and end["value"] == end["maximum"] == k and not table["visible"]
    step, end, table = app_module.span_controls(state, False)
    assert not end["visible"] and table["visible"]
    assert app_module.span_controls(None, True)[1]["visible"]


def _partial(app_module, fake, n: int) -> Attribution:
    """The State after a request that stopped after `n` streamed tokens (cancelled)."""
    return first_then_close(app_module.explain("Where is Paris", ["macs"], 8, True, False), n + 1)[-1][-1]


def test_a_stopped_request_gets_its_status_and_free_sliders_after_it_stops(app_module, fake):
    state = _partial(app_module, fake, 3)
    assert state.meta["status"] == "fake step 3"
    status, step, end = app_module.after_explain(state)
    assert status.startswith("Stopped after 3 tokens (cancelled") and "model is free" in status
    assert step["interactive"] and step["value"] == step["maximum"] == 3 and end["maximum"] == 3
    done = collect(app_module.explain("Where is Paris", ["macs"], 8, True, False))[-1][-1]
    done.meta["status"] = "done"
    assert all(isinstance(x, type(gr.skip())) for x in app_module.after_explain(done))  # left as shown
    assert all(isinstance(x, type(gr.skip())) for x in app_module.after_explain(None))
    # a request cancelled while it waited for the model never replaced the waiting note
    lock_note = f"{app_module._WAITING}: 1 request ahead (a cancelled one stops first)…"
    status, step, _ = app_module.after_explain(done, lock_note)
    assert status.startswith("Stopped before it started") and isinstance(step, type(gr.skip()))
    assert app_module.after_image({"attr": done, "image": None}, lock_note)[0].startswith("Stopped before it started")
    # and one stopped (or failed) before its first token never replaced the starting note
    status, step, _ = app_module.after_explain(done, app_module._STARTING)
    assert status.startswith("Stopped before the first token") and isinstance(step, type(gr.skip()))
    assert app_module.after_image(None, app_module._STARTING)[0].startswith("Stopped before the first token")
    assert all(isinstance(x, type(gr.skip())) for x in app_module.after_explain(done, "Done: 8 tokens."))
    assert app_module.after_image({"attr": state, "image": None})[0].startswith("Stopped after 3 tokens")
    assert app_module.after_faithfulness("Removal curves ready (removal 1.0 s); π-Soft running, ~3 s…").startswith(
        "Stopped"
    )
    assert isinstance(app_module.after_faithfulness("Measured on 4 answer tokens"), type(gr.skip()))


def _file(update: dict) -> bytes:
    assert update["interactive"] is True
    return open(update["value"], "rb").read()


def test_exports_are_the_libraries_files_and_reopen_to_identical_views(app_module, fake, tmp_path):
    from visuals.export import load_result, result_json
    from visuals.png import view_png
    from visuals.report import report_html

    state = collect(app_module.explain("Paris is big. It is far", ["macs", "random"], 8, True, False))[-1][-1]
    json_file, report_file = app_module.export_files(state, ["random", "macs"], False)
    assert json_file["value"].endswith("explanation-fake-tiny-4steps.json")
    assert _file(json_file).decode() == result_json(state)
    assert _file(report_file).decode() == report_html(state, ["random", "macs"], user_only=True)
    assert _file(app_module.export_report(state, ["macs", "atman"], True)).decode() == report_html(
        state, ["macs"], user_only=False
    )  # a ticked method without scores is left out
    png = _file(app_module.export_view(state, ["macs"], 2, False))
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert png == app_module.png_bytes(view_png(state, ["macs"], 1, user_only=True))
    for off in (
        app_module.export_view(state, ["macs"], 2, False, True, "token"),  # PNG draws one step's token view only
        app_module.export_view(state, ["macs"], 2, False, False, "sentence"),
        app_module.export_view(None, ["macs"], 2, False),
        *app_module.export_files(None, ["macs"], False),
    ):
        assert off == {"__type__": "update", "value": None, "interactive": False}
    saved = tmp_path / "saved.json"
    saved.write_bytes(_file(json_file))
    app_module._load.cache_clear()
    calls, loads = len(fake.calls), fake.loads
    opened = app_module.open_saved(str(saved), False, False, "token")
    attr, box, answer, heatmap, rows, step, end, status = opened
    assert fake.loads == loads and len(fake.calls) == calls  # no model loaded, none asked
    assert box["value"] == ["macs", "random"] and step["value"] == step["maximum"] == 4 and step["interactive"]
    assert status.startswith("Opened saved.json: 4 answer tokens by fake-tiny") and "no model was run" in status
    assert (answer, heatmap, rows) == app_module.render(state, ["macs", "random"], 4, False)
    for view in [(1, False, False, None, "token"), (2, True, True, 4, "sentence"), (3, False, False, None, "word")]:
        assert app_module.render(attr, ["macs", "random"], *view) == app_module.render(state, ["macs", "random"], *view)
    assert load_result(str(saved)).to_dict() == attr.to_dict()
    assert app_module.open_saved(None, False, False, "token") == (gr.skip(),) * 8
    broken = tmp_path / "broken.json"
    broken.write_text('{"model": "x"')
    with pytest.raises(gr.Error, match="not valid JSON"):
        app_module.open_saved(str(broken), False, False, "token")
    foreign = tmp_path / "foreign.json"
    mine = {"mine": MethodScores.from_raw(np.zeros((0, 1)))}
    foreign.write_text(result_json(Attribution(model="m", prompt_token_ids=[1], prompt_tokens=["a"], methods=mine)))
    box = app_module.open_saved(str(foreign), False, False, "token")[1]
    assert box["value"] == ["mine"] and box["choices"][-1] == "mine"  # an unregistered method can still be shown


def test_downloads_live_in_one_temporary_folder_that_keeps_the_newest(app_module):
    root = app_module._DOWNLOADS.root
    paths = [app_module._download(f"file {i}", "same-name.txt")["value"] for i in range(app_module.KEEP_DOWNLOADS + 5)]
    assert all(app_module.Path(p).parent.parent == root for p in paths)
    assert len(list(root.iterdir())) <= app_module.KEEP_DOWNLOADS
    assert open(paths[-1]).read() == f"file {app_module.KEEP_DOWNLOADS + 4}"  # names repeat, files do not clash
    assert not app_module.Path(paths[0]).exists()


def test_image_exports_add_the_gif_and_the_overlays(app_module, vl_fake, tmp_path):
    from visuals.overlay import gif_bytes
    from visuals.png import view_png

    path = upload_files.write(tmp_path, "bilevel.png")
    state = collect(app_module.explain_image(str(path), "What?", ["macs"], 3, 0.5, True, 64, "A dog"))[-1][-1]
    assert vl_fake.calls[-1]["answer"] == "A dog" and vl_fake.calls[-1]["max_new_tokens"] == len(b"A dog") + 1
    json_file, report_file, gif_file = app_module.export_image_files(state, ["macs"], 0.4, True)
    gif = _file(gif_file)
    assert gif[:6] == b"GIF89a" and gif == gif_bytes(state["image"], state["attr"], ["macs"], 0.4, 10)
    assert "xai-image" in _file(report_file).decode() and _file(json_file).startswith(b"{")
    png = _file(app_module.export_image_view(state, ["macs"], 2, 0.4))
    assert png == app_module.png_bytes(view_png(state["attr"], ["macs"], 1, image=state["image"], alpha=0.4))
    assert all(u["value"] is None for u in app_module.export_image_files(None, ["macs"], 0.5, True))


def test_exports_and_reopening_are_wired_after_each_answer(app_module):
    fns = {fn.api_name: fn for fn in app_module.demo.fns.values()}
    chain = ["explain", "after_explain", "export_files", "export_view_after_explain"]
    for before, after in zip(chain, chain[1:]):
        assert fns[after].trigger_after == fns[before]._id and not fns[after].trigger_only_on_success
    assert fns["export_files_after_open"].trigger_after == fns["open_saved"]._id
    assert fns["open_saved"].fn is app_module.open_saved and fns["open_saved"].targets[0][1] == "upload"
    assert fns["export_view"].trigger_after == fns["render"]._id
    image_chain = ["explain_image", "after_image", "export_image_files", "export_image_view_after_explain"]
    for before, after in zip(image_chain, image_chain[1:]):
        assert fns[after].trigger_after == fns[before]._id
    assert app_module.demo.delete_cache is not None  # Gradio's copies of served files are cleaned too
