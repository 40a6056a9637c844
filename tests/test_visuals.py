"""Views of hand-built `Attribution`s, checked against z-scores and colours computed here independently."""

from __future__ import annotations

import html
import math
import re

import numpy as np
import pytest

from explainer.result import Attribution, MethodScores
from visuals import (
    Z_CLIP,
    answer_html,
    side_by_side_html,
    token_heatmap_figure,
    token_heatmap_html,
    top_tokens_rows,
    visible_whitespace,
)

PROMPT = [
    "<|im_start|>",
    "user",
    "\n",
    "Where",
    " is",
    " <script>alert(1)</script>",
    ' "Paris"',
    "?",
    "<|im_end|>",
    "\n",
]
USER = [3, 4, 5, 6, 7]
# (K=3, N=10): distinct values so every z-score differs; the template tokens get large scores on purpose so that
# re-normalising over the user's tokens visibly changes the result.
RAW = np.array(
    [
        [9.0, 8.0, 7.0, 0.5, 1.5, 4.0, 2.0, 3.0, 9.5, 6.0],
        [1.0, 2.0, 3.0, 6.0, 5.0, 0.2, 4.0, 1.0, 0.0, 0.5],
        [0.0, 0.0, 0.0, 1.0, 3.0, 2.0, 9.0, 4.0, 0.0, 0.0],
    ],
    dtype=np.float32,
)

_SPAN = re.compile(
    r'<span class="xai-tok" data-pos="(\d+)" data-z="([^"]+)" style="[^"]*background-color:([^;]+);[^"]*" '
    r'title="([^"]*)">'
)


def make_attr(
    methods: dict[str, np.ndarray] | None = None,
    prompt: list[str] = PROMPT,
    generated: list[str] | None = None,
    user_positions: list[int] = USER,
    seconds: float = 0.25,
) -> Attribution:
    methods = {"macs": RAW} if methods is None else methods
    k = next(iter(methods.values())).shape[0] if methods else 0
    generated = [" Paris", " is", "<b>"][:k] if generated is None else generated
    return Attribution(
        model="tiny",
        prompt_token_ids=list(range(len(prompt))),
        prompt_tokens=list(prompt),
        generated_token_ids=list(range(100, 100 + len(generated))),
        generated_tokens=list(generated),
        methods={name: MethodScores.from_raw(raw, seconds=seconds) for name, raw in methods.items()},
        user_positions=list(user_positions),
    )


def spans(fragment: str) -> dict[int, tuple[float, str, str]]:
    """Prompt position -> (z, background colour, unescaped hover title) of each token span."""
    return {int(p): (float(z), bg.strip(), html.unescape(t)) for p, z, bg, t in _SPAN.findall(fragment)}


def rgb(color: str) -> tuple[int, int, int]:
    m = re.fullmatch(r"rgb\((\d+), (\d+), (\d+)\)", color)
    assert m, color
    return tuple(int(v) for v in m.groups())


def expected_z(row: np.ndarray, cols: list[int]) -> np.ndarray:
    sub = row[cols].astype(np.float64)
    return (sub - sub.mean()) / sub.std()


def panels(fragment: str) -> dict[str, str]:
    parts = fragment.split('<div class="xai-panel" data-method="')[1:]
    return {p.split('"', 1)[0]: p for p in parts}


def legend_zmax(fragment: str) -> list[float]:
    return [float(v) for v in re.findall(r'class="xai-legend" data-zmax="([^"]+)"', fragment)]


def test_highest_z_gets_reddest_colour_and_lowest_the_bluest():
    attr = make_attr()
    got = spans(token_heatmap_html(attr, "macs", 2))
    by_z = sorted(got.values(), key=lambda v: v[0])
    colors = [rgb(bg) for _, bg, _ in by_z]
    zs = [z for z, _, _ in by_z]
    for z, (r, g, b) in zip(zs, colors, strict=True):
        if z > 0.05:
            assert r > b, (z, r, g, b)
        elif z < -0.05:
            assert b > r, (z, r, g, b)
    # on each side, the colour gets darker (further from white) as |z| grows
    pos = [sum(c) for z, c in zip(zs, colors, strict=True) if z > 0]
    neg = [sum(c) for z, c in zip(zs, colors, strict=True) if z < 0]
    assert pos == sorted(pos, reverse=True) and len(set(pos)) == len(pos)
    assert neg == sorted(neg) and len(set(neg)) == len(neg)
    top_pos = max(got, key=lambda p: got[p][0])
    assert top_pos == 6  # raw 9.0 at position 6 is the largest user score at step 2
    r, g, b = rgb(got[top_pos][1])
    assert r - g == max(rgb(bg)[0] - rgb(bg)[1] for _, bg, _ in got.values())


def test_html_is_escaped_everywhere():
    attr = make_attr()
    fragments = [
        token_heatmap_html(attr, "macs", 0, user_only=False),
        side_by_side_html(attr, ["macs", "<img src=x>"], 0, user_only=False),
        answer_html(attr, 2),
    ]
    for fragment in fragments:
        assert "<script>" not in fragment
        assert "<img" not in fragment
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in fragments[0]
    assert "&lt;|im_start|&gt;" in fragments[0]
    assert "&lt;b&gt;" in fragments[2] and "<b>" not in fragments[2].replace("<b>macs</b>", "")
    # quotes inside a token cannot end the title attribute early
    titles = {p: t for p, (_, _, t) in spans(fragments[0]).items()}
    assert titles[6].startswith("'␣\"Paris\"'")
    assert "position 6" in titles[6]


def test_user_only_shows_user_tokens_and_renormalises():
    attr = make_attr()
    for step in range(3):
        got = spans(token_heatmap_html(attr, "macs", step, user_only=True))
        assert sorted(got) == USER
        want = expected_z(RAW[step], USER)
        np.testing.assert_allclose([got[p][0] for p in USER], want, rtol=1e-4, atol=1e-5)
        # the stored z (over all N tokens) is different, so re-normalising did something
        assert not np.allclose(attr.methods["macs"].z[step, USER], want, atol=1e-3)


def test_show_all_uses_stored_z_over_all_tokens():
    attr = make_attr()
    got = spans(token_heatmap_html(attr, "macs", 1, user_only=False))
    assert sorted(got) == list(range(len(PROMPT)))
    want = expected_z(RAW[1], list(range(len(PROMPT))))
    np.testing.assert_allclose([got[p][0] for p in sorted(got)], want, rtol=1e-4, atol=1e-5)


def test_empty_user_positions_fall_back_to_all_tokens():
    attr = make_attr(user_positions=[])
    assert token_heatmap_html(attr, "macs", 0, user_only=True) == token_heatmap_html(attr, "macs", 0, user_only=False)
    assert len(spans(token_heatmap_html(attr, "macs", 0))) == len(PROMPT)


def test_hover_shows_token_position_and_score():
    attr = make_attr()
    got = spans(token_heatmap_html(attr, "macs", 0))
    want = expected_z(RAW[0], USER)
    for p, z in zip(USER, want, strict=True):
        title = got[p][2]
        assert f"position {p}" in title
        assert f"z = {z:+.2f}" in title
        assert visible_whitespace(PROMPT[p]) in title
    assert "'␣is'" in got[4][2]  # spaces visible in the hover


def test_newlines_become_line_breaks():
    attr = make_attr(generated=[" a", "\n", "b"])
    fragment = token_heatmap_html(attr, "macs", 0, user_only=False)
    assert "⏎<br>" in fragment
    assert "⏎<br>" in answer_html(attr, 1)
    assert visible_whitespace(" a\n\tb") == "␣a⏎⇥b"
    assert visible_whitespace(" a\n", spaces=False) == " a⏎"


def test_side_by_side_shares_one_colour_scale():
    prompt = ["w", "x", "y", "z"]
    a = np.array([[0.0, 0.0, 0.0, 1.0]], dtype=np.float32)  # z = [-1/sqrt3 x3, sqrt3]
    b = np.array([[0.0, 0.0, 1.0, 1.0]], dtype=np.float32)  # z = [-1, -1, 1, 1]
    attr = make_attr({"a": a, "b": b}, prompt=prompt, generated=[" t"], user_positions=[])
    shared = math.sqrt(3.0)
    fragment = side_by_side_html(attr, ["a", "b"], 0)
    assert legend_zmax(fragment) == [pytest.approx(shared, rel=1e-4)]  # one legend for all panels
    got = {m: spans(p) for m, p in panels(fragment).items()}
    assert set(got) == {"a", "b"}
    alone_b = spans(token_heatmap_html(attr, "b", 0))
    scaled_b = spans(token_heatmap_html(attr, "b", 0, zmax=shared))
    alone_a = spans(token_heatmap_html(attr, "a", 0))
    # b on its own saturates at |z| = 1; next to a it uses a's range, so its z = 1 is lighter than a's peak
    assert got["b"][2][1] == scaled_b[2][1] != alone_b[2][1]
    assert got["a"][3][1] == alone_a[3][1]
    assert sum(rgb(got["b"][2][1])) > sum(rgb(got["a"][3][1]))
    assert "0.25 s" in fragment


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_side_by_side_one_panel_per_method(n):
    names = ["macs", "rollout", "atman", "random"][:n]
    attr = make_attr({name: RAW * (i + 1) for i, name in enumerate(names)})
    fragment = side_by_side_html(attr, names, 1)
    assert list(panels(fragment)) == names
    assert "display:grid" in fragment
    assert len(legend_zmax(fragment)) == 1


def test_side_by_side_pending_method_and_no_methods():
    attr = make_attr()
    fragment = side_by_side_html(attr, ["macs", "atman"], 0)
    pending = spans(panels(fragment)["atman"])
    assert sorted(pending) == USER and all(math.isnan(z) for z, _, _ in pending.values())
    assert "pending" in panels(fragment)["atman"]
    assert "Select at least one" in side_by_side_html(attr, [], 0)


def test_steps_are_clamped():
    attr = make_attr()
    last = token_heatmap_html(attr, "macs", 2)
    assert token_heatmap_html(attr, "macs", 99) == last
    assert token_heatmap_html(attr, "macs", None) == last
    assert token_heatmap_html(attr, "macs", -4) == token_heatmap_html(attr, "macs", 0)
    assert side_by_side_html(attr, ["macs"], 50) == side_by_side_html(attr, ["macs"], 2)
    assert top_tokens_rows(attr, "macs", 7) == top_tokens_rows(attr, "macs", 2)
    assert re.findall(r'data-step="(\d+)" data-selected', answer_html(attr, 42)) == ["2"]
    assert re.findall(r'data-step="(\d+)" data-selected', answer_html(attr, -1)) == ["0"]
    assert re.findall(r'data-step="(\d+)" data-selected', answer_html(attr)) == ["2"]


def test_no_steps_yet_renders_prompt_neutral():
    empty = np.zeros((0, len(PROMPT)), dtype=np.float32)
    for attr in (make_attr({"macs": empty}, generated=[]), make_attr({}, generated=[])):
        fragment = token_heatmap_html(attr, "macs")
        got = spans(fragment)
        assert sorted(got) == USER
        assert {bg for _, bg, _ in got.values()} == {"#ffffff"}
        assert "No generated tokens yet" in fragment
        assert legend_zmax(fragment) == []
        assert "No answer yet" in answer_html(attr)
        assert top_tokens_rows(attr, "macs") == []
        assert "no scores yet" in side_by_side_html(attr, ["macs"], None)
        fig = token_heatmap_figure(attr, "macs")
        assert sum(t != "" for row in fig.data[0].text for t in row) == len(USER)
        assert np.nansum(np.abs(np.asarray(fig.data[0].z, dtype=float))) == 0


def test_nan_scores_are_shown_as_missing_and_skipped():
    raw = RAW.copy()
    raw[0, 5] = np.nan
    attr = make_attr({"macs": raw})
    got = spans(token_heatmap_html(attr, "macs", 0))
    assert math.isnan(got[5][0]) and "no score" in got[5][2]
    finite = [3, 4, 6, 7]
    np.testing.assert_allclose([got[p][0] for p in finite], expected_z(RAW[0], finite), rtol=1e-4, atol=1e-5)
    rows = top_tokens_rows(attr, "macs", 0, k=10)
    assert [r[2] for r in rows] == sorted(finite, key=lambda p: -got[p][0])


def test_top_tokens_rows_order_and_renormalisation():
    attr = make_attr()
    step = 1
    want = expected_z(RAW[step], USER)
    order = np.argsort(-want, kind="stable")[:3]
    rows = top_tokens_rows(attr, "macs", step, k=3)
    assert [r[0] for r in rows] == [1, 2, 3]
    assert [r[2] for r in rows] == [USER[i] for i in order]
    assert [r[1] for r in rows] == [visible_whitespace(PROMPT[USER[i]]) for i in order]
    np.testing.assert_allclose([r[3] for r in rows], want[order], atol=1e-3)
    # over all tokens the ranking agrees with the library's own `top_tokens`
    rows_all = top_tokens_rows(attr, "macs", step, k=4, user_only=False)
    assert [r[2] for r in rows_all] == [p for p, _, _ in attr.top_tokens("macs", step, 4)]


def test_figure_has_one_cell_text_per_token_and_hover_with_score():
    prompt = [f" t{i}" for i in range(20)]
    raw = np.arange(40, dtype=np.float32).reshape(2, 20) % 7
    attr = make_attr({"macs": raw}, prompt=prompt, generated=[" a", " b"], user_positions=list(range(2, 20)))
    fig = token_heatmap_figure(attr, "macs", 1, user_only=True)
    trace = fig.data[0]
    z = np.asarray(trace.z, dtype=float)
    assert z.shape == (2, 16)  # 18 user tokens wrap onto two rows of 16
    texts = [t for row in trace.text for t in row if t != ""]
    assert texts == [visible_whitespace(prompt[p]) for p in range(2, 20)]
    want = expected_z(raw[1], list(range(2, 20)))
    np.testing.assert_allclose(z.ravel()[:18], want, rtol=1e-4, atol=1e-5)
    assert np.isnan(z.ravel()[18:]).all()
    hovers = [h for row in trace.hovertext for h in row if h != ""]
    assert len(hovers) == 18
    for i, p in enumerate(range(2, 20)):
        assert visible_whitespace(prompt[p]) in hovers[i]
        assert f"position {p}" in hovers[i]
        assert f"z = {want[i]:+.2f}" in hovers[i]
    assert trace.zmid == 0 and trace.zmax == -trace.zmin <= Z_CLIP
    assert trace.reversescale is True
    full = token_heatmap_figure(attr, "macs", 1, user_only=False)
    assert sum(t != "" for row in full.data[0].text for t in row) == 20
