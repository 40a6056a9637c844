"""The shared "Leave out attention sinks" view option: the text and image tabs' views follow it, it is off by default
(and says why), and the assembled app wires it into both tabs' re-rendering, also once an answer is complete."""

from __future__ import annotations

import re

import numpy as np
import pytest
from PIL import Image

from explainer.result.attribution import Attribution, MethodScores
from ui import options
from ui.tabs import image_tab, text_tab
from ui.tabs.image_tab import ImageResult

GRID = (2, 3)


def _result(image: bool = False, sinks: bool = True) -> Attribution:
    """Prompt: 2 template tokens, (image tokens,) 4 question tokens; the first question token is a sink that
    outscores everything at every step."""
    n_image = GRID[0] * GRID[1] if image else 0
    n = 2 + n_image + 4
    raw = np.random.default_rng(0).random((2, n)).astype(np.float32)
    raw[:, 2 + n_image] = 100.0
    if image:
        raw[:, 2] = 100.0  # the first image token too
    attr = Attribution(
        model="synthetic",
        prompt_token_ids=list(range(n)),
        prompt_tokens=[f"t{i}" for i in range(n)],
        generated_token_ids=[0, 1],
        generated_tokens=["a", "b"],
        methods={"macs": MethodScores.from_raw(raw)},
        user_positions=list(range(2 + n_image, n)),
        image={"token_positions": list(range(2, 2 + n_image)), "grid": list(GRID), "size": [60, 40]} if image else None,
    )
    if sinks:
        attr.meta["sinks"] = {"positions": [2, 2 + n_image] if image else [2], "evidence": []}
    return attr


def _hatched(fragment: str) -> int:
    return len(re.findall(r"<i class=xs ", fragment))


def test_the_text_tab_leaves_the_sinks_out_when_ticked():
    attr = _result()
    on = text_tab.render(attr, ["macs"], 1, False, False, None, "token", True)
    off = text_tab.render(attr, ["macs"], 1, False, False, None, "token", False)
    assert _hatched(on.heatmap) == 1 and _hatched(off.heatmap) == 0
    assert off == text_tab.render(attr, ["macs"], 1, False)  # off is the view as before
    assert 2 not in [row[3] for row in on.table] and off.table[0][3] == 2  # the sink topped the table
    span = text_tab.render(attr, ["macs"], 1, False, True, 2, "token", True)  # a span of steps follows it too
    assert _hatched(span.heatmap) == 1 and "1 attention sink left out" in span.heatmap
    assert _hatched(text_tab.render(attr, ["macs"], 1, False, True, 2, "token").heatmap) == 0
    plain = _result(sinks=False)
    assert text_tab.render(plain, ["macs"], 1, False, hide_sinks=True) == text_tab.render(plain, ["macs"], 1, False)


def test_the_image_tab_leaves_the_sinks_out_of_overlays_and_question_when_ticked():
    attr = _result(image=True)
    result = ImageResult(attr, Image.new("RGB", (60, 40), (40, 90, 200)))
    on = image_tab.render_image(result, ["macs"], 1, 0.5, True, True)
    off = image_tab.render_image(result, ["macs"], 1, 0.5, True)
    assert _hatched(on.question) == 1 and _hatched(off.question) == 0
    pixels = np.asarray(on.overlay)
    assert on.overlay.size == off.overlay.size and not np.array_equal(pixels, np.asarray(off.overlay))
    assert {tuple(p) for p in pixels[18 + 5, 5:15].tolist()} <= {(110, 110, 110), (200, 200, 200)}  # cell (0, 0)
    assert image_tab.render_image(None, ["macs"], 1, 0.5, True, True).overlay is None


def test_the_toggle_is_off_by_default_and_says_why():
    assert options.HIDE_SINKS_DEFAULT is False
    assert "Off by default" in options.HIDE_SINKS_INFO and "JSON" in options.HIDE_SINKS_INFO


@pytest.fixture(scope="module")
def fns() -> dict:
    import app

    return {fn.api_name: fn for fn in app.demo.fns.values()}


def test_both_tabs_rerender_with_the_toggle(fns):
    render, render_image = fns["render"], fns["render_image"]
    toggle = render.inputs[-1]
    assert toggle.label.startswith("Leave out attention sinks") and toggle.value is False
    assert render_image.inputs[-1] is toggle  # one checkbox for both tabs
    for fn in (render, render_image):
        assert any(t[0] == toggle._id and t[1] == "input" for t in fn.targets)
    for name, after in [("render_after_explain", "after_explain"), ("render_image_after_explain", "after_image"),
                        ("render_after_open", "open_saved")]:  # fmt: skip
        assert fns[name].trigger_after == fns[after]._id and fns[name].inputs[-1] is toggle


def test_after_an_answer_the_views_are_drawn_again_only_to_leave_sinks_out():
    attr = _result()
    args = (["macs"], 1, False, False, None, "token")
    assert text_tab.render_sinks(attr, *args, True) == text_tab.render(attr, *args, True)
    for quiet in (text_tab.render_sinks(attr, *args, False), text_tab.render_sinks(_result(sinks=False), *args, True),
                  text_tab.render_sinks(None, *args, True)):  # fmt: skip
        assert quiet == text_tab.TextView()  # nothing changes: no late redraw
    result = ImageResult(_result(image=True), Image.new("RGB", (60, 40)))
    drawn = image_tab.render_image_sinks(result, ["macs"], 1, 0.5, True, True)
    assert np.array_equal(
        np.asarray(drawn.overlay), np.asarray(image_tab.render_image(result, ["macs"], 1, 0.5, True, True).overlay)
    )
    assert image_tab.render_image_sinks(result, ["macs"], 1, 0.5, True, False) == image_tab.ImageView()
