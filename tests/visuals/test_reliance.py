"""The image reliance strip and its text (`visuals.reliance`) on hand-built results: each answer token coloured by
its drop in log p when the image is hidden, the step outlined and described with each method's share, the notes."""

from __future__ import annotations

import html
import math
import re

import numpy as np

from explainer.result.attribution import Attribution, MethodScores
from explainer.result.reliance import Reliance
from visuals.heatmap import diverging_color
from visuals.reliance import DROP_SCALE, LIVE, NO_IMAGE, NOT_MEASURED, reliance_html, reliance_lines

TOKENS = ["<|im_start|>", "<|image_pad|>", "<|image_pad|>", "What", "?", "\n"]
ANSWER = [" red", " <sq>", "\n"]


def result(reliance: bool = True, image: bool = True, status: str = "done") -> Attribution:
    k, n = len(ANSWER), len(TOKENS)
    rel = Reliance(
        logprob=np.log(np.array([0.9, 0.5, 0.8], dtype=np.float32)),
        image_hidden_logprob=np.log(np.array([0.01, 0.5, 0.95], dtype=np.float32)),  # drops +4.50, 0, -0.17
        image_share={"macs": np.array([0.9, 0.4, np.nan], np.float32), "random": np.array([0.5, 0.5, 0.5], np.float32)},
        image_positions=[1, 2],
        text_positions=[3, 4],
    )  # fmt: skip
    return Attribution(
        model="fake", prompt_token_ids=list(range(n)), prompt_tokens=TOKENS, generated_token_ids=[7, 8, 9],
        generated_tokens=ANSWER, methods={"macs": MethodScores.from_raw(np.ones((k, n)))}, user_positions=[3, 4],
        meta={"status": status}, image={"token_positions": [1, 2], "grid": [1, 2], "size": [28, 14]} if image else None,
        reliance=rel if reliance else None,
    )  # fmt: skip


def test_each_token_is_coloured_by_its_drop_and_the_step_is_described():
    page = reliance_html(result(), step=0)
    tokens = re.findall(r'<span class="xai-rel" data-step="(\d)" data-drop="([^"]+)"( data-selected="true")? '
                        r'style="[^"]*?background:(rgb\([^)]+\));', page)  # fmt: skip
    drops = [math.log(0.9 / 0.01), 0.0, math.log(0.8 / 0.95)]
    assert [int(s) for s, *_ in tokens] == [0, 1, 2] and [bool(sel) for _, _, sel, _ in tokens] == [True, False, False]
    np.testing.assert_allclose([float(d) for _, d, _, _ in tokens], drops, atol=1e-4)
    assert [c for *_, c in tokens] == [diverging_color(float(d), DROP_SCALE) for _, d, _, _ in tokens]
    assert tokens[0][3] == diverging_color(DROP_SCALE, DROP_SCALE)  # +4.5 nats: full red (clipped)
    assert tokens[2][3].startswith("rgb(2") and "font-weight:700" in page.split('data-step="1"')[0]  # bold: needed it
    assert "&lt;sq&gt;" in page and "<sq>" not in page  # escaped
    described = html.unescape(page)
    assert "step 1: '␣red' · p 0.900 with the image, 0.010 with it hidden from the answer: drop +4.50 nats" in described
    assert "macs 0.90, random 0.50 (an even spread: 0.50)" in described
    assert "macs –, random 0.50" in html.unescape(reliance_html(result(), step=2))  # NaN: no evidence at that step
    assert re.findall(r'data-step="(\d)" data-drop="[^"]+" data-selected', reliance_html(result())) == ["2"]  # last


def test_steps_past_the_end_are_clamped():
    assert 'data-step="2" data-drop="-0.1719" data-selected' in reliance_html(result(), step=99)
    assert 'data-step="0" data-drop="4.4998" data-selected' in reliance_html(result(), step=-5)


def test_notes_without_reliance():
    assert NO_IMAGE in reliance_html(result(image=False)) and NO_IMAGE in reliance_html(None)
    assert html.escape(LIVE) in reliance_html(result(reliance=False, status="generating: 2 tokens"))
    assert html.escape(NOT_MEASURED) in reliance_html(result(reliance=False))
    old = result(reliance=False)
    del old.meta["status"]  # files saved before the status was kept are finished
    assert html.escape(NOT_MEASURED) in reliance_html(old)
    assert reliance_lines(result(reliance=False)) == []
    failed = result(reliance=False)
    failed.meta["reliance_error"] = "This model's attention cannot be edited."
    assert "This model&#x27;s attention cannot be edited." in reliance_html(failed)


def test_the_text_has_a_line_per_token():
    lines = reliance_lines(result())
    assert len(lines) == 2 + len(ANSWER) and "(an even spread: 0.50)" in lines[1]
    step_1 = "  step   1         ' red': log p   -0.105 /   -4.605  drop  +4.500  | share macs 0.90  random 0.50"
    assert lines[2] == step_1
