"""`app.py`: the assembled page. Importing it loads no model and asks no Hub; every event is named, queued where it
runs the model, maps the library's errors, and chains the steps that follow a request. The handlers themselves are
tested in tests/ui/, the page in a real browser in tests/browser/."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path

import gradio as gr
import pytest

from explainer.methods import method_options
from ui import models, options, requests
from ui.guards import admission
from ui.panels import estimates, faithfulness
from ui.tabs import image_tab, text_tab

from . import upload_files

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def app():
    import app as module

    return module


@pytest.fixture(scope="module")
def fns(app) -> dict:
    return {fn.api_name: fn for fn in app.demo.fns.values()}


def test_importing_the_app_loads_no_model_and_asks_no_hub():
    code = (
        "import explainer.models.loading as m\n"
        "def no_network(*args, **kwargs): raise AssertionError('the Hub was asked at import')\n"
        "m._open_url = no_network\n"
        "import app\n"
        "from ui import models\n"
        "assert models.loaded_models() == 0 and models.model_ids.cache_info().currsize == 0\n"
        "assert app.demo is not None\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "EXPLAINER_MODEL", "EXPLAINER_VLM")}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


def test_app_py_only_assembles_the_page(app):
    assert len((ROOT / "app.py").read_text().splitlines()) < 100 and isinstance(app.demo, gr.Blocks)
    assert app.demo.delete_cache is not None  # Gradio's copies of served files are cleaned too


def test_the_app_keeps_freed_memory_and_summarises_gradios_event_log_rarely(app):
    """Both cost the crowd's decode steps their cores (docs/memory.md; app.py)."""
    import platform

    assert app.PROCESS.keeps_freed_memory is (platform.system() == "Linux" and platform.libc_ver()[0] == "glibc")
    assert app.demo._queue.ANAYLTICS_CACHE_FREQUENCY == int(os.environ["GRADIO_ANALYTICS_CACHE_FREQUENCY"]) >= 1000


def test_every_event_is_named_and_maps_the_library_errors(fns):
    assert all(name for name in fns)
    handlers = {name: fn.fn for name, fn in fns.items() if fn.fn is not None and not name.startswith("load_example")}
    assert len(handlers) >= 25
    assert all(getattr(fn, "maps_library_errors", False) for fn in handlers.values()), [
        name for name, fn in handlers.items() if not getattr(fn, "maps_library_errors", False)
    ]
    for name, module, fn in [("page_explain", text_tab, "explain"), ("render", text_tab, "render"),
                             ("open_saved", text_tab, "open_saved"),
                             ("page_faithfulness", faithfulness, "faithfulness"),
                             ("page_explain_image", image_tab, "explain_image"),
                             ("estimate", estimates, "method_estimates"),
                             ("model_info", models, "model_info")]:  # fmt: skip
        assert inspect.unwrap(fns[name].fn) is inspect.unwrap(getattr(module, fn))


def test_model_events_share_one_queue_and_draw_progress_on_their_status_line(fns):
    # text explain requests run side by side (their decode steps are batched, decoding/batched/); the other model
    # events one at a time: the admission gate orders both (ui/guards/admission.py), Gradio's queue holds neither
    explain, shared = fns["page_explain"], fns["page_faithfulness"]
    assert admission.SLOTS[admission.TEXT] == 16 and admission.SLOTS[admission.MODEL] == 1
    assert explain.concurrency_limit is None and explain.concurrency_id == f"gate_{admission.TEXT}"
    assert shared.concurrency_id == f"gate_{admission.MODEL}"
    for name, module in [("page_explain", text_tab), ("page_faithfulness", faithfulness),
                         ("page_explain_image", image_tab), ("explain_contrast", text_tab)]:  # fmt: skip
        fn = fns[name]
        if name != "page_explain":
            assert fn.concurrency_limit is None and fn.concurrency_id == shared.concurrency_id
        assert inspect.isasyncgenfunction(fn.fn)
        assert list(fn.show_progress_on) == [fn.outputs[module.SHOWN.index("status")]], name


def test_cancel_only_cancels_and_the_after_handlers_run_however_the_request_ended(app, fns):
    cancels = [fn for fn in app.demo.fns.values() if fn.cancels]
    assert {tuple(app.demo.fns[i].api_name for i in fn.cancels) for fn in cancels} == {
        ("page_explain",),
        ("page_faithfulness",),
        ("page_explain_image",),
        ("explain_contrast",),
        ("image_faithfulness",),
    }
    # Cancel runs nothing that sets the status (it would race with the request's last update)
    assert all(fn.fn is None for fn in cancels)
    for after, request in [("after_explain", "page_explain"), ("after_faithfulness", "page_faithfulness"),
                           ("after_image", "page_explain_image"), ("after_contrast", "explain_contrast"),
                           ("image_after_faithfulness", "image_faithfulness")]:  # fmt: skip
        assert fns[after].trigger_after == fns[request]._id and not fns[after].trigger_only_on_success


def test_exports_and_reopening_are_wired_after_each_answer(fns):
    chain = ["page_explain", "after_explain", "export_files", "export_view_after_explain"]
    for before, after in zip(chain, chain[1:]):
        assert fns[after].trigger_after == fns[before]._id and not fns[after].trigger_only_on_success
    assert fns["export_files_after_open"].trigger_after == fns["open_saved"]._id
    assert fns["export_view_after_open"].trigger_after == fns["export_files_after_open"]._id
    assert fns["open_saved"].targets[0][1] == "upload"
    assert fns["export_view"].trigger_after == fns["render"]._id
    assert fns["export_span_view"].trigger_after == fns["render_span"]._id == fns["render_span"]._id
    assert fns["render_span"].trigger_after == fns["span"]._id
    image_chain = ["page_explain_image", "after_image", "export_image_files", "export_image_view_after_explain"]
    for before, after in zip(image_chain, image_chain[1:]):
        assert fns[after].trigger_after == fns[before]._id


def test_method_options_are_inputs_of_both_explain_events(fns):
    keys = options.option_keys()
    assert keys == [(m, o.name) for m in options.method_choices()[0] for o in method_options(m)]
    explain, image = fns["page_explain"], fns["page_explain_image"]
    assert len(explain.inputs) == 8 + len(keys) and len(image.inputs) == 9 + len(keys)
    assert explain.inputs[8:] == image.inputs[9:]  # one set of widgets for both tabs


def test_macs_and_rollout_are_ticked_on_first_use_in_both_tabs(app):
    groups = [
        c["props"]
        for c in app.demo.get_config_file()["components"]
        if c.get("type") == "checkboxgroup" and c["props"].get("label") == "Attribution methods"
    ]
    assert len(groups) == 2 and all(g["value"] == ["macs", "rollout"] for g in groups)
    slow = {"atman", "attnlrp", "grad_ellm", "input_x_gradient"}
    assert slow <= {c[0] if isinstance(c, list | tuple) else c for c in groups[0]["choices"]}  # offered, not ticked


def test_estimate_event_follows_prompt_length_and_options_and_each_answer(fns):
    event = fns["estimate"]
    assert event.trigger_mode == "always_last"
    assert len(event.inputs) == 5 + len(options.option_keys())  # prompt, max new, template, state, answer
    assert len(event.targets) == 4 + len(options.option_keys()) and {t[1] for t in event.targets} == {"change"}
    after = fns["estimate_after_explain"]  # once per answer, not on every streamed update
    assert inspect.unwrap(after.fn) is inspect.unwrap(event.fn) and after.inputs == event.inputs
    assert after.trigger_after == fns["page_explain"]._id and not after.trigger_only_on_success


def test_the_upload_reaches_the_image_handler_unopened(fns, tmp_path):
    from gradio.data_classes import ImageData

    assert fns["page_explain_image"].preprocess is False  # gradio hands over its raw payload
    broken = upload_files.write(tmp_path, "notes.png")
    with pytest.raises(Exception, match="cannot identify image file"):
        # what the visitor saw before: gr.Image opens it and fails without a reason
        fns["page_explain_image"].inputs[0].preprocess(ImageData(path=str(broken), orig_name="notes.png"))
    with pytest.raises(Exception, match="Image 'notes.png' is not an image file"):
        requests.open_image(ImageData(path=str(broken), orig_name="notes.png").model_dump())


def test_the_model_lines_are_refreshed_after_each_request(app, fns):
    """A page visit loads no model, so the lines name it first and show its precision once a request loaded it."""
    from ui import models as ui_models

    assert fns["model_info_after_explain"].fn.__wrapped__ is ui_models.model_info.__wrapped__
    assert fns["vlm_info_after_explain"].fn.__wrapped__ is ui_models.vlm_info.__wrapped__


def test_the_start_up_line_names_the_hardware_threads_and_each_models_dtype(app, monkeypatch, cpu_flags):
    import re

    monkeypatch.delenv("EXPLAINER_DTYPE", raising=False)
    monkeypatch.setattr(models, "model_ids", lambda: ("org/text", None))
    line = app.start_up_line()
    threads = app.PROCESS.threads
    head = rf"MACS Explorer on CPU without native bf16: {threads} torch threads, (\S+ \S+|unknown) memory free; "
    assert re.fullmatch(head + r"text model org/text \(float32, loads with its tab's first request\); image model none",
                        line), line  # fmt: skip
    cpu_flags(" avx512_bf16")
    line = app.start_up_line()
    assert line.startswith("MACS Explorer on CPU with native bf16: ") and "org/text (bfloat16, loads" in line
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")  # nothing loaded here: the line still tells what will be
    assert app.start_up_line().startswith("MACS Explorer on ZeroGPU: ")


def test_events_that_follow_the_step_slider_take_it_unprocessed(app, fns):
    """A new request shrinks the step slider while events sent before that update still carry the old step: Gradio's
    bounds check refused them with "greater than maximum" error toasts (tests/browser/test_text_tab.py checks the
    log). Events the step's or the result's change triggers read their inputs raw; the views clamp the step."""
    blocks = app.demo.blocks
    sliders = {i for i, b in blocks.items() if getattr(b, "label", "") and str(b.label).startswith("Generation step")}
    states = {i for i, b in blocks.items() if isinstance(b, gr.State)}
    assert len(sliders) == 2
    following = {
        name for name, fn in fns.items()
        if any(b._id in sliders for b in fn.inputs)
        and any(event == "change" and (block in sliders or block in states) for block, event in fn.targets)
    }  # fmt: skip
    assert {"foil_choices", "render_layers", "render_image_layers", "render_word_region"} <= following
    assert {"render_image_region", "soft_cost_note", "image_soft_cost_note"} <= following
    assert all(not fns[name].preprocess for name in following), [n for n in following if fns[n].preprocess]
    for name in following:  # and none of them reads a component whose raw value differs from its value
        allowed = (gr.State, gr.Slider, gr.Checkbox, gr.CheckboxGroup, gr.Radio, gr.Dropdown)
        assert all(isinstance(b, allowed) for b in fns[name].inputs), name
