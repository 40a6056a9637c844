"""The Gradio app with a fake model: streaming handler, error mapping, re-rendering from State, event wiring.

No model is loaded: `app.load_model` / `app.stream_explain` are replaced by fakes. When the `explainer` package does
not (yet) export its public API, a stand-in module is put in `sys.modules` just for importing `app`.
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys
import types

import gradio as gr
import numpy as np
import pytest

import explainer
from explainer.errors import ExplainerError, InputError, ModelLoadError
from explainer.result import Attribution, MethodScores
from visuals import side_by_side_html, top_tokens_rows

ANSWER = [" It", " is", " Paris", "<|im_end|>"]


class FakeBundle:
    name = "fake-tiny"
    max_prompt_tokens = 32


class FakeLibrary:
    """Records calls; streams one `Attribution` per answer token, like the real `stream_explain`."""

    def __init__(self):
        self.loads = 0
        self.calls: list[dict] = []
        self.closed = False
        self.fail_after: int | None = None

    def load_model(self, name=None):
        self.loads += 1
        return FakeBundle()

    def available_methods(self):
        return ["macs", "random"]

    def stream_explain(self, bundle, prompt, methods=("macs",), max_new_tokens=64, chat_template=True, progress=None):
        if progress is not None:
            progress(0.5, "fake post-hoc method halfway")
        self.calls.append(
            {
                "bundle": bundle,
                "prompt": prompt,
                "methods": methods,
                "max_new_tokens": max_new_tokens,
                "chat_template": chat_template,
            }
        )
        return self._stream(prompt, list(methods), max_new_tokens)

    def _stream(self, prompt, methods, max_new_tokens):
        try:
            if not prompt.strip():
                raise InputError("The prompt is empty: type a question first.")
            words = [" " + w for w in prompt.split()]
            tokens = ["<|im_start|>", "user", "\n", *words, "<|im_end|>"]
            n = len(tokens)
            answer = ANSWER[:max_new_tokens]
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
                    meta={"status": f"fake step {k}"},
                )
        finally:
            self.closed = True


_API = ("load_model", "stream_explain", "available_methods", "ExplainerError")


@pytest.fixture(scope="module")
def app_module():
    saved = {name: sys.modules.get(name) for name in ("explainer", "app")}
    if not all(hasattr(explainer, name) for name in _API):
        stand_in = FakeLibrary()
        fake = types.ModuleType("explainer")
        fake.__path__ = list(explainer.__path__)  # submodules such as explainer.result still import
        fake.ExplainerError = ExplainerError
        fake.load_model = stand_in.load_model
        fake.stream_explain = stand_in.stream_explain
        fake.available_methods = stand_in.available_methods
        sys.modules["explainer"] = fake
    sys.modules.pop("app", None)
    try:
        module = importlib.import_module("app")
    finally:
        if saved["explainer"] is not None:
            sys.modules["explainer"] = saved["explainer"]
    yield module
    if saved["app"] is None:
        sys.modules.pop("app", None)
    else:
        sys.modules["app"] = saved["app"]


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


def test_import_loads_no_model(app_module):
    assert app_module._load.cache_info().currsize == 0
    assert isinstance(app_module.demo, gr.Blocks)


def test_explain_streams_every_token_then_unlocks_the_slider(app_module, fake):
    outs = list(app_module.explain("Where is Paris", ["macs"], 8.0, True, False))
    assert len(outs) == len(ANSWER) + 1  # one per token, then the final one
    for k, (answer, heatmap, rows, slider, status, state) in enumerate(outs[:-1], start=1):
        assert answer.count('class="xai-step"') == k
        assert _selected_step(answer) == [str(k - 1)]  # follows the newest token
        assert slider["value"] == k and slider["maximum"] == max(k, 2) and slider["interactive"] is False
        assert status == f"fake step {k}"
        assert isinstance(state, Attribution) and state.num_steps == k
        assert 'data-method="macs"' in heatmap
        assert [r[:2] for r in rows[:2]] == [["macs", 1], ["macs", 2]]
    answer, heatmap, rows, slider, status, state = outs[-1]
    assert isinstance(state, Attribution) and state.generated_tokens == ANSWER
    assert slider["interactive"] is True and slider["value"] == slider["maximum"] == len(ANSWER)
    one = list(app_module.explain("hi", ["macs"], 1, True, False))[-1][3]
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

    list(app_module.explain("Where is Paris", ["macs"], 4, True, False, progress=tracker))
    assert seen == [(0.5, "fake post-hoc method halfway")]


def test_model_is_loaded_once_per_process(app_module, fake):
    list(app_module.explain("a b", ["macs"], 2, False, False))
    list(app_module.explain("c d", ["macs", "random"], 2, True, True))
    assert "fake-tiny" in app_module.model_info()
    assert fake.loads == 1
    assert fake.calls[-1]["methods"] == ["macs", "random"]


def test_explainer_error_becomes_gr_error(app_module, fake):
    with pytest.raises(gr.Error, match="The prompt is empty"):
        list(app_module.explain("   ", ["macs"], 8, True, False))
    assert fake.closed


def test_error_mid_stream_becomes_gr_error_and_closes_the_stream(app_module, fake):
    fake.fail_after = 2
    gen = app_module.explain("Where is Paris", ["macs"], 8, True, False)
    assert next(gen)[-1].num_steps == 1
    assert next(gen)[-1].num_steps == 2
    with pytest.raises(gr.Error, match="Out of memory"):
        next(gen)
    assert fake.closed


def test_cancelled_request_closes_the_stream(app_module, fake):
    gen = app_module.explain("Where is Paris", ["macs"], 8, True, False)
    next(gen)
    gen.close()  # what Gradio does when the user leaves
    assert fake.closed


def test_load_failure_becomes_gr_error(app_module, fake, monkeypatch):
    def broken(name=None):
        raise ModelLoadError("Model 'nope' not found: check the id or folder.")

    monkeypatch.setattr(app_module, "load_model", broken)
    with pytest.raises(gr.Error, match="not found"):
        list(app_module.explain("hi", ["macs"], 8, True, False))
    with pytest.raises(gr.Error, match="not found"):
        app_module.model_info()


def test_no_method_selected_is_a_gr_error(app_module, fake):
    with pytest.raises(gr.Error, match="at least one"):
        list(app_module.explain("hi", [], 8, True, False))
    assert fake.calls == []


def test_render_uses_state_without_running_the_model(app_module, fake):
    state = list(app_module.explain("Where is Paris", ["macs"], 8, True, False))[-1][-1]
    calls = len(fake.calls)
    answer, heatmap, rows = app_module.render(state, ["macs"], 2, False)  # slider is 1-based
    assert _selected_step(answer) == ["1"]
    assert heatmap == side_by_side_html(state, ["macs"], 1, user_only=True)
    assert [r[3] for r in rows] == [p for _, _, p, _ in top_tokens_rows(state, "macs", 1, 5, True)]
    _, heatmap_all, _ = app_module.render(state, ["macs"], 2, True)
    assert heatmap_all == side_by_side_html(state, ["macs"], 1, user_only=False)
    assert heatmap_all.count('class="xai-tok"') == state.num_prompt_tokens > heatmap.count('class="xai-tok"')
    assert len(fake.calls) == calls
    assert app_module.render(None, ["macs"], 1, False)[2] == []


def test_demo_wires_named_queued_events(app_module):
    fns = {fn.api_name: fn for fn in app_module.demo.fns.values()}
    assert {"explain", "render", "model_info"} <= set(fns)
    assert all(fn.api_name for fn in app_module.demo.fns.values())
    assert fns["explain"].concurrency_limit == 1
    assert inspect.isgeneratorfunction(fns["explain"].fn)
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
        list(app_module.explain_image(Image.new("RGB", (45, 31)), "What?", ["macs"], 4, 0.5, True))
    assert fake.loads == 0 and fake.calls == []
    overlay, answer, question = app_module.render_image(None, ["macs"], 1, 0.5, True)
    assert overlay is None and answer == ""


def test_image_questions_stream_overlays_and_rerender_from_state(app_module, fake, monkeypatch):
    from PIL import Image

    calls = []

    def fake_stream(bundle, prompt, methods=("macs",), max_new_tokens=64, image=None, progress=None, **kw):
        calls.append({"prompt": prompt, "image": image, "methods": list(methods), **kw})
        for k in range(1, 4):
            yield _image_attr(k, methods)

    class VLBundle(FakeBundle):
        name = "fake-vlm"
        image_processor = object()

    monkeypatch.setattr(app_module, "VLM_ID", "fake-vlm")
    monkeypatch.setattr(app_module, "load_model", lambda name=None: VLBundle())
    monkeypatch.setattr(app_module, "stream_explain", fake_stream)
    assert "fake-vlm" in app_module.vlm_info()
    image = Image.new("RGB", (45, 31), (40, 90, 200))
    outs = list(app_module.explain_image(image, "What?", ["macs", "random"], 3, 0.5, True, 64))
    assert len(outs) == 4 and calls[0]["image"] is image and calls[0]["prompt"] == "What?"
    assert calls[0]["max_image_tokens"] == 64  # the "image detail" slider reaches the library
    overlay, answer, question, slider, status, state = outs[-1]
    assert isinstance(overlay, Image.Image) and overlay.height == 31 + 18 and overlay.width > 2 * 45
    assert slider["interactive"] is True and slider["value"] == 3 and status.startswith("Done: 3 tokens")
    assert 'data-method="macs"' in question and question.count('class="xai-tok"') == 2 * 2  # the question only
    again = app_module.render_image(state, ["macs"], 1, 0.2, False)
    assert again[0].width == 45 and len(calls) == 1
    with pytest.raises(gr.Error, match="Upload an image"):
        list(app_module.explain_image(None, "What?", ["macs"], 3, 0.5, True))


def test_image_events_are_named(app_module):
    fns = {fn.api_name for fn in app_module.demo.fns.values()}
    assert {"explain_image", "render_image", "vlm_info"} <= fns


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


def test_faithfulness_panel_measures_and_rerenders(app_module, fake, monkeypatch):
    attr = list(app_module.explain("Where is Paris", ["macs"], 8.0, True, False))[-1][-1]
    calls = []

    def fake_measure(bundle, result, methods, soft=None, progress=None):
        calls.append((result, methods, soft))
        progress(0.5, "halfway")
        return _fake_report()

    monkeypatch.setattr(app_module, "measure_faithfulness", fake_measure)
    removal, soft, rows, status, report = app_module.faithfulness(attr, ["macs", "rollout"], "perplexity")
    assert calls[0][1] == ["macs"] and calls[0][2] is app_module.QUICK_SOFT  # only methods of this result
    assert removal is not None and soft is not None and "macs" in status
    assert [r[0] for r in rows] == ["macs", "random"] and rows[0][2] == pytest.approx(0.5)
    again = app_module.render_faithfulness(report, "BLEU")
    assert again[2] == rows and again[0] is not None
    assert app_module.render_faithfulness(None, "BLEU") == (None, None, [])


def test_faithfulness_errors_become_gr_errors(app_module, fake, monkeypatch):
    with pytest.raises(gr.Error, match="Generate an answer first"):
        app_module.faithfulness(None, ["macs"], "mean logit")
    attr = list(app_module.explain("Where is Paris", ["macs"], 8.0, True, False))[-1][-1]
    with pytest.raises(gr.Error, match="Select at least one"):
        app_module.faithfulness(attr, ["atman"], "mean logit")

    def failing(*args, **kwargs):
        raise InputError("No prompt positions to evaluate.")

    monkeypatch.setattr(app_module, "measure_faithfulness", failing)
    with pytest.raises(gr.Error, match="No prompt positions"):
        app_module.faithfulness(attr, ["macs"], "mean logit")


def test_faithfulness_event_is_named_and_shares_the_model_queue(app_module):
    fns = {fn.api_name: fn for fn in app_module.demo.fns.values()}
    assert fns["faithfulness"].fn is app_module.faithfulness
    assert fns["faithfulness"].concurrency_limit == 1
    assert fns["faithfulness"].concurrency_id == fns["explain"].concurrency_id
    assert fns["render_faithfulness"].fn is app_module.render_faithfulness
