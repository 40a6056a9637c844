"""Attention sinks left out of the views (`hide_sinks`): token heatmaps and image overlays of hand-built results, the
z-scores checked against ones computed here, the sinks drawn hatched, and nothing changed with the toggle off."""

from __future__ import annotations

import html
import re

import numpy as np
import pytest
from PIL import Image

from explainer.result.attribution import Attribution, MethodScores, zscore
from explainer.result.image_maps import image_map, image_sinks
from explainer.result.spans import top_sentences
from visuals import Z_CLIP, side_by_side_html, top_tokens_rows
from visuals.granularity import span_side_by_side_html, top_sentences_html
from visuals.heatmap import SINK_TITLE
from visuals.overlay import cell_pixels, image_overlay, overlay_grid

from .test_visuals import RAW, expected_z, legend_zmax, make_attr

_TOKEN = re.compile(r'<i(?: class=(r\d|b\d|xg|xs))?(?: title=("[^"]*"|[^\s>"]+))?>(.*?)</i>')


def _titles(fragment: str) -> list[tuple[str, str]]:
    """(class, title) of each token of a one-panel fragment, in prompt order."""
    return [(css, title.strip('"')) for css, title, _ in _TOKEN.findall(fragment)]


def _with_sinks(attr: Attribution, positions: list[int]) -> Attribution:
    attr.meta["sinks"] = {"positions": positions, "evidence": []}
    return attr


def test_a_sink_leaves_the_z_scores_and_colour_scale_and_is_hatched():
    raw = RAW.copy()
    raw[:, 4] = 1000.0  # a user token that dominates every step
    attr = _with_sinks(make_attr({"macs": raw}), [4])
    shown = side_by_side_html(attr, ["macs"], 0, user_only=True, hide_sinks=True)
    tokens = _titles(shown)
    assert tokens[1] == ("xs", SINK_TITLE)  # user tokens 3..7: the sink is the second
    z = [float(t) for _, t in tokens[:1] + tokens[2:]]
    np.testing.assert_allclose(z, expected_z(raw[0], [3, 5, 6, 7]), atol=0.006)
    assert "z-scores over the other 4 tokens of your text; 1 attention sink left out (hatched)" in shown
    # the colour range is that of the other tokens (with it, the sink alone sets it)
    assert legend_zmax(shown)[0] == pytest.approx(np.clip(np.abs(z).max(), 1.0, Z_CLIP), abs=0.01)
    assert legend_zmax(side_by_side_html(attr, ["macs"], 0))[0] == pytest.approx(2.0, abs=1e-3)  # the sink, sqrt(n - 1)
    kept = side_by_side_html(attr, ["macs"], 0, user_only=True)  # toggle off: the sink stays, scored
    assert "xs" not in re.sub(r"<style>.*?</style>", "", kept) and kept == side_by_side_html(attr, ["macs"], 0)
    rows = top_tokens_rows(attr, "macs", 0, k=10, hide_sinks=True)
    assert [r[2] for r in rows] == [p for p in np.argsort(-raw[0]).tolist() if p in (3, 5, 6, 7)]
    assert top_tokens_rows(attr, "macs", 0, k=1)[0][2] == 4


def test_with_all_tokens_shown_the_sink_outside_the_users_text_is_left_out_too():
    attr = _with_sinks(make_attr(), [0, 8])  # template tokens with large scores
    shown = side_by_side_html(attr, ["macs"], 0, user_only=False, hide_sinks=True)
    tokens = _titles(shown)
    assert tokens[0][0] == tokens[8][0] == "xs"
    rest = [i for i in range(10) if i not in (0, 8)]
    np.testing.assert_allclose([float(tokens[i][1]) for i in rest], expected_z(RAW[0], rest), atol=0.006)
    assert "2 attention sinks left out" in shown
    # the user's view does not show them: nothing is left out there
    assert "left out" not in side_by_side_html(attr, ["macs"], 0, user_only=True, hide_sinks=True)


def test_results_without_sinks_look_the_same_with_the_toggle():
    attr = make_attr()
    for user_only in (True, False):
        assert side_by_side_html(attr, ["macs"], 1, user_only, hide_sinks=True) == side_by_side_html(
            attr, ["macs"], 1, user_only
        )


GRID = (3, 4)


def _image_attr(sink_cell: int | None = 5) -> Attribution:
    h, w = GRID
    n = 2 + h * w + 3
    raw = np.random.default_rng(0).random((2, n)).astype(np.float32)
    if sink_cell is not None:
        raw[:, 2 + sink_cell] = 50.0  # the sink image token outshines the rest
    raw[:, 2 + 10] = np.where(np.arange(2) == 0, 3.0, raw[:, 2 + 10])  # a real peak at step 0, cell 10
    attr = Attribution(
        model="synthetic",
        prompt_token_ids=list(range(n)),
        prompt_tokens=[f"t{i}" for i in range(n)],
        generated_token_ids=[0, 1],
        generated_tokens=["a", "b"],
        methods={"macs": MethodScores.from_raw(raw)},
        user_positions=list(range(2 + h * w, n)),
        image={"token_positions": list(range(2, 2 + h * w)), "grid": list(GRID), "size": [80, 60]},
    )
    if sink_cell is not None:
        attr.meta["sinks"] = {"positions": [0, 2 + sink_cell], "evidence": []}  # a text sink too
    return attr


def test_image_map_leaves_the_sink_cell_out():
    attr = _image_attr()
    cells = image_sinks(attr)
    assert cells.sum() == 1 and cells[1, 1]  # cell 5 of a 3 x 4 grid
    m = image_map(attr, "macs", 0, hide_sinks=True)
    assert np.isnan(m[1, 1]) and np.isfinite(m[~cells]).all()
    assert abs(float(np.nanmean(m))) < 1e-5 and abs(float(np.nanstd(m)) - 1) < 1e-4
    assert np.unravel_index(np.nanargmax(m), GRID) == (2, 2)  # the real peak now tops the map
    plain = image_map(attr, "macs", 0)
    assert np.unravel_index(np.argmax(plain), GRID) == (1, 1) and np.isfinite(plain).all()


def test_the_overlay_hatches_the_sink_cell_and_changes_nothing_without_sinks():
    image = Image.fromarray(np.random.default_rng(1).integers(0, 256, (60, 80, 3), dtype=np.uint8))
    attr = _image_attr()
    hidden = np.asarray(image_overlay(image, attr, "macs", 0, contour_top_percent=10, hide_sinks=True))
    mask = cell_pixels(image_sinks(attr), image.size)  # (60, 80)
    assert mask.sum() == 20 * 20 and mask[20:40, 20:40].all()
    colours = {tuple(c) for c in hidden[mask].tolist()}
    assert colours == {(110, 110, 110), (200, 200, 200)}  # stripes only: no colour map, no outline
    assert not np.array_equal(hidden, np.asarray(image_overlay(image, attr, "macs", 0, contour_top_percent=10)))
    plain = _image_attr(sink_cell=None)
    np.testing.assert_array_equal(
        np.asarray(image_overlay(image, plain, "macs", 0, hide_sinks=True)),
        np.asarray(image_overlay(image, plain, "macs", 0)),
    )
    grid = overlay_grid(image, attr, ["macs"], 0, hide_sinks=True)
    assert grid.size == overlay_grid(image, attr, ["macs"], 0).size


def test_cell_pixels_cover_the_image_exactly():
    cells = np.zeros((3, 4), dtype=bool)
    cells[0, 3] = cells[2, 0] = True
    px = cell_pixels(cells, (10, 7))  # W = 10, H = 7: cells of uneven size
    assert px.shape == (7, 10) and px[0, -1] and px[-1, 0] and not px[3, 5]
    assert cell_pixels(np.ones((3, 4), dtype=bool), (10, 7)).all()


def test_spans_words_and_top_sentences_leave_the_sinks_out_too():
    prompt = ["<|im_start|>", "user", "\n", "Paris", " is", " big", ".", " Rome", " is", " old", ".", "<|im_end|>"]
    user = list(range(3, 11))
    raw = np.random.default_rng(2).random((3, len(prompt))).astype(np.float32)
    raw[:, 7] = 100.0  # " Rome": a one-token word, a sink
    attr = _with_sinks(make_attr({"macs": raw}, prompt=prompt, generated=["a", "b", "c"], user_positions=user), [7])
    words = span_side_by_side_html(attr, ["macs"], 0, 2, "word", hide_sinks=True)
    found = _TOKEN.findall(words)
    hatched = [text for css, _, text in found if css == "xs"]
    assert hatched == [" Rome"] and "1 attention sink left out (hatched)" in words
    others = [u for u in user if u != 7]
    z = np.mean([zscore(raw[k : k + 1], others)[0] for k in range(3)], axis=0)  # the span's mean z without the sink
    shown = {html.unescape(text): float(title) for css, title, text in found if css != "xs" and title}
    assert shown["Paris"] == pytest.approx(z[3], abs=0.006) and shown[" old"] == pytest.approx(z[9], abs=0.006)
    plain = span_side_by_side_html(attr, ["macs"], 0, 2, "word")
    assert "xs" not in re.sub(r"<style>.*?</style>", "", plain) and "left out" not in plain
    # the sentence with the sink topped the table; without the sink its other tokens decide
    assert top_sentences(attr, "macs", 0, 2, 1)[0].group.start == 7
    best = top_sentences(attr, "macs", 0, 2, 2, hide_sinks=True)
    means = {s.group.start: s.score for s in best}
    assert means[7] == pytest.approx(np.nanmean(z[[8, 9, 10]]), abs=1e-5)
    assert means[3] == pytest.approx(np.nanmean(z[[3, 4, 5, 6]]), abs=1e-5)
    assert "1 attention sink" not in top_sentences_html(attr, ["macs"], 0, 2, hide_sinks=True)  # a table only
