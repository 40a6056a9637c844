"""Views of hand-built `Attribution`s, checked against z-scores and colours computed here independently."""

from __future__ import annotations

import html
import math
import re

import numpy as np
import pytest

from explainer.result.attribution import Attribution, MethodScores
from visuals import (
    Z_CLIP,
    answer_html,
    bin_class,
    bin_color,
    side_by_side_html,
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

# A token: <i class=r3 title=+1.23>text</i>; no class on white tokens, no title while pending, a quoted title when
# there is no score. Gap markers (class="xh", quoted) do not match.
_TOKEN = re.compile(r'<i(?: class=(r\d|b\d|xg))?(?: title=("[^"]*"|[^\s>"]+))?>(.*?)</i>')


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


def heatmap(attr: Attribution, method: str, step: int | None = None, user_only: bool = True, zmax=None) -> str:
    """One method's panel, as the app shows a single selected method."""
    return side_by_side_html(attr, [method], step, user_only, zmax)


def positions(fragment: str) -> list[int]:
    """The prompt positions of a panel's tokens, from its data-pos ranges ("3-5,9")."""
    (ranges,) = re.findall(r'class="xai-flow" data-pos="([^"]*)"', fragment)
    out = []
    for part in filter(None, ranges.split(",")):
        lo, _, hi = part.partition("-")
        out += range(int(lo), int(hi or lo) + 1)
    return out


def spans(fragment: str) -> dict[int, tuple[float, str, str, str]]:
    """Prompt position -> (z from the hover title, background colour, hover title, unescaped text) of each token of
    one panel."""
    found = _TOKEN.findall(fragment)
    pos = positions(fragment)
    assert len(found) == len(pos), (len(found), len(pos))
    out = {}
    for p, (css, title, text) in zip(pos, found, strict=True):
        title = html.unescape(title.strip('"'))
        z = float(title) if title and title != "no score" else math.nan
        out[p] = (z, bin_color(css), title, html.unescape(text))
    return out


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
    for step in range(3):
        got = spans(heatmap(attr, "macs", step))
        by_z = sorted(got.values(), key=lambda v: v[0])
        colors = [rgb(bg) for _, bg, _, _ in by_z]
        zs = [z for z, _, _, _ in by_z]
        zmax = max(abs(z) for z in zs)
        assert 1.0 <= zmax <= Z_CLIP  # so the auto colour range is this largest |z|, neither floored nor clipped
        for z, (r, g, b) in zip(zs, colors, strict=True):
            if abs(z) / zmax < 0.5 / 8:  # less than half a colour bin: white
                assert (r, g, b) == (255, 255, 255), z
            elif z > 0:
                assert r > b, (z, r, g, b)
            else:
                assert b > r, (z, r, g, b)
            # the bin is round(8 |z| / zmax), computed here from the shown z
            assert rgb(bin_color(bin_class(z, zmax))) == (r, g, b)
        # on each side, the colour gets darker (further from white) as |z| grows
        pos = [sum(c) for z, c in zip(zs, colors, strict=True) if z > 0]
        neg = [sum(c) for z, c in zip(zs, colors, strict=True) if z < 0]
        assert pos == sorted(pos, reverse=True) and neg == sorted(neg)
        assert colors[0] != colors[-1] and len(set(colors)) >= 3
        extreme = max(by_z, key=lambda v: abs(v[0]))
        assert extreme[1] == bin_color("r8" if extreme[0] > 0 else "b8")  # the largest |z| gets the darkest bin
    got = spans(heatmap(attr, "macs", 2))
    top_pos = max(got, key=lambda p: got[p][0])
    assert top_pos == 6 and got[6][1] == bin_color("r8")  # raw 9.0 at position 6 is the largest user score at step 2
    assert rgb(bin_color("r8")) == (178, 24, 43) and rgb(bin_color("b8")) == (33, 102, 172)  # RdBu's ends


def test_html_is_escaped_everywhere():
    attr = make_attr()
    fragments = [
        heatmap(attr, "macs", 0, user_only=False),
        side_by_side_html(attr, ["macs", "<img src=x>"], 0, user_only=False),
        answer_html(attr, 2),
    ]
    for fragment in fragments:
        assert "<script>" not in fragment
        assert "<img" not in fragment
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in fragments[0]
    assert "&lt;|im_start|&gt;" in fragments[0]
    assert "&lt;b&gt;" in fragments[2] and "<b>" not in fragments[2].replace("<b>macs</b>", "")
    # tokens are element text, never attribute values: quotes in a token cannot end an attribute
    got = spans(fragments[0])
    assert got[6][3] == ' "Paris"' and got[5][3] == " <script>alert(1)</script>"
    assert all(re.fullmatch(r"[+-]\d+\.\d\d", title) for _, _, title, _ in got.values())


def test_user_only_shows_user_tokens_and_renormalises():
    attr = make_attr()
    for step in range(3):
        got = spans(heatmap(attr, "macs", step, user_only=True))
        assert sorted(got) == USER
        want = expected_z(RAW[step], USER)
        np.testing.assert_allclose([got[p][0] for p in USER], want, atol=0.005)  # titles have 2 decimals
        # the stored z (over all N tokens) is different, so re-normalising did something
        assert not np.allclose(attr.methods["macs"].z[step, USER], want, atol=1e-3)


def test_show_all_uses_stored_z_over_all_tokens():
    attr = make_attr()
    got = spans(heatmap(attr, "macs", 1, user_only=False))
    assert sorted(got) == list(range(len(PROMPT)))
    want = expected_z(RAW[1], list(range(len(PROMPT))))
    np.testing.assert_allclose([got[p][0] for p in sorted(got)], want, atol=0.005)


def test_empty_user_positions_fall_back_to_all_tokens():
    attr = make_attr(user_positions=[])
    assert heatmap(attr, "macs", 0, user_only=True) == heatmap(attr, "macs", 0, user_only=False)
    assert len(spans(heatmap(attr, "macs", 0))) == len(PROMPT)


def test_hover_shows_the_score_and_the_legend_explains_it():
    attr = make_attr()
    fragment = heatmap(attr, "macs", 0)
    got = spans(fragment)
    want = expected_z(RAW[0], USER)
    for p, z in zip(USER, want, strict=True):
        assert got[p][2] == f"{z:+.2f}"  # the title, shown on hover
        assert got[p][3] == PROMPT[p]  # the text itself, selectable, with its spaces
    legend = re.search(r'<div class="xai-legend"[^>]*aria-label="([^"]+)"', fragment)
    assert legend and "blue" in legend[1] and "red" in legend[1] and "hover" in legend[1]  # read by screen readers
    assert "hover a token for its z-score" in fragment and "bold" in fragment  # colour is not the only cue
    assert "<style>" in fragment and ".xai-flow .r8{" in fragment and "font-weight:700" in fragment


def test_positions_with_gaps_are_marked_and_kept():
    attr = make_attr(user_positions=[1, 2, 5, 6, 7])
    fragment = heatmap(attr, "macs", 0)
    assert positions(fragment) == [1, 2, 5, 6, 7] and 'data-pos="1-2,5-7"' in fragment
    assert fragment.count('title="tokens hidden"') == 1
    np.testing.assert_allclose(
        [z for z, *_ in spans(fragment).values()], expected_z(RAW[0], [1, 2, 5, 6, 7]), atol=0.005
    )


def test_newlines_become_line_breaks():
    attr = make_attr(generated=[" a", "\n", "b"])
    fragment = heatmap(attr, "macs", 0, user_only=False)
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
    alone_b = spans(heatmap(attr, "b", 0))
    scaled_b = spans(heatmap(attr, "b", 0, zmax=shared))
    alone_a = spans(heatmap(attr, "a", 0))
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
    assert sorted(pending) == USER and all(math.isnan(z) and title == "" for z, _, title, _ in pending.values())
    assert "not in this result" in panels(fragment)["atman"] and "pending" not in fragment  # a finished result
    attr.meta["status"] = "running atman"  # still being made: its post-hoc method is pending
    assert "· pending<" in panels(side_by_side_html(attr, ["macs", "atman"], 0))["atman"]
    assert "Select at least one" in side_by_side_html(attr, [], 0)


def test_steps_are_clamped():
    attr = make_attr()
    last = heatmap(attr, "macs", 2)
    assert heatmap(attr, "macs", 99) == last
    assert heatmap(attr, "macs", None) == last
    assert heatmap(attr, "macs", -4) == heatmap(attr, "macs", 0)
    assert side_by_side_html(attr, ["macs"], 50) == side_by_side_html(attr, ["macs"], 2)
    assert top_tokens_rows(attr, "macs", 7) == top_tokens_rows(attr, "macs", 2)
    assert re.findall(r'data-step="(\d+)" data-selected', answer_html(attr, 42)) == ["2"]
    assert re.findall(r'data-step="(\d+)" data-selected', answer_html(attr, -1)) == ["0"]
    assert re.findall(r'data-step="(\d+)" data-selected', answer_html(attr)) == ["2"]


def test_no_steps_yet_renders_prompt_neutral():
    empty = np.zeros((0, len(PROMPT)), dtype=np.float32)
    for attr in (make_attr({"macs": empty}, generated=[]), make_attr({}, generated=[])):
        fragment = heatmap(attr, "macs")
        got = spans(fragment)
        assert sorted(got) == USER
        assert {bg for _, bg, _, _ in got.values()} == {"rgb(255, 255, 255)"}
        assert "No generated tokens yet" in fragment
        assert legend_zmax(fragment) == []
        assert "No answer yet" in answer_html(attr)
        assert top_tokens_rows(attr, "macs") == []
        assert "no scores yet" in side_by_side_html(attr, ["macs"], None)


def test_nan_scores_are_shown_as_missing_and_skipped():
    raw = RAW.copy()
    raw[0, 5] = np.nan
    attr = make_attr({"macs": raw})
    got = spans(heatmap(attr, "macs", 0))
    assert math.isnan(got[5][0]) and "no score" in got[5][2]
    finite = [3, 4, 6, 7]
    np.testing.assert_allclose([got[p][0] for p in finite], expected_z(RAW[0], finite), atol=0.005)
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


_WORDS = "The quick brown fox jumps over the lazy dog. Paris is the capital of France, and Berlin of Germany.".split()


def test_a_streamed_update_costs_at_most_40_bytes_per_token_and_method():
    """Issue 14: the heatmap is re-sent on every streamed update; 4,000 prompt tokens and 2 methods stay lean."""
    n, k = 4000, 64
    prompt = ["<|im_start|>", "user", "\n"]
    prompt += [("\n" if i % 50 == 0 else " ") + _WORDS[i % len(_WORDS)] for i in range(n - 5)]
    prompt += ["<|im_end|>", "\n"]
    rng = np.random.default_rng(0)
    methods = {m: rng.random((k, n)).astype(np.float32) ** 3 for m in ("macs", "rollout")}  # skewed, like attention
    attr = make_attr(methods, prompt=prompt, generated=[" a"] * k, user_positions=list(range(3, n - 2)))
    one = make_attr({m: r[:, :1] for m, r in methods.items()}, prompt=["x"], generated=[" a"] * k, user_positions=[0])
    constant = 4096  # stylesheet, captions and legend, sent once per update
    assert len(side_by_side_html(one, ["macs", "rollout"], 9).encode("utf-8")) < constant
    for user_only in (True, False):
        fragment = side_by_side_html(attr, ["macs", "rollout"], 9, user_only=user_only)
        assert len(positions(panels(fragment)["macs"])) == (n - 5 if user_only else n)
        size = len(fragment.encode("utf-8"))
        assert size <= 40 * n * 2 + constant, size / (n * 2)


def _answer_tokens(fragment: str) -> list[dict[str, str]]:
    """Each answer token's attributes (data-step, data-selected, data-low, style, title) and text, in order."""
    out = []
    for attrs, text in re.findall(r'<span class="xai-step" ([^>]*)>(.*?)</span>', fragment):
        found = dict(re.findall(r'([\w-]+)="([^"]*)"', attrs))
        out.append({**found, "title": html.unescape(found["title"]), "text": html.unescape(text)})
    return out


def test_answer_strip_shows_step_scores_on_hover_and_underlines_unlikely_tokens():
    attr = make_attr()
    probabilities, entropies = [0.91234, 0.0999, 0.00004], [0.25, 3.14159, 0.0]
    attr.step_scores = {"probability": probabilities, "entropy": entropies}
    tokens = _answer_tokens(answer_html(attr, 1))
    assert [t["text"] for t in tokens] == [" Paris", " is", "<b>"]
    for i, (t, p, h) in enumerate(zip(tokens, probabilities, entropies, strict=True)):
        m = re.fullmatch(rf"step {i + 1}: '.*' · p = ([0-9.e+-]+) · entropy ([0-9.]+) nats", t["title"])
        assert m, t["title"]
        assert math.isclose(float(m[1]), p, rel_tol=5e-3) and math.isclose(float(m[2]), h, abs_tol=5e-3)
        low = p < 0.1  # the documented threshold, decided here independently of the module's constant
        assert (t.get("data-low") == "true") == low and ("underline dotted" in t["style"]) == low
    assert [t.get("data-selected") for t in tokens] == [None, "true", None]
    fragment = answer_html(attr, 1)
    assert "dotted underline: p &lt; 0.1" in fragment or "dotted underline: p < 0.1" in fragment
    assert "teacher-forced" not in fragment


def test_answer_strip_without_step_scores_has_no_scores_and_no_legend():
    attr = make_attr()
    assert attr.step_scores == {}
    fragment = answer_html(attr, 0)
    assert all(re.fullmatch(r"step \d: '.*'", t["title"]) for t in _answer_tokens(fragment))
    assert "data-low" not in fragment and "dotted underline" not in fragment
    attr.step_scores = {"probability": [0.5], "entropy": [1.0]}  # wrong length (K = 3): ignored, not misattributed
    assert answer_html(attr, 0) == fragment
    attr.step_scores = {"probability": [float("nan"), 0.01, 0.5], "entropy": [1.0, float("nan"), 2.0]}
    tokens = _answer_tokens(answer_html(attr, 0))
    assert [("p =" in t["title"], "entropy" in t["title"], "data-low" in t) for t in tokens] == [
        (False, True, False),
        (True, False, True),
        (True, True, False),
    ]


def test_answer_strip_marks_a_given_answer_and_highlights_a_span():
    attr = make_attr()
    attr.meta["answer"] = "given"
    fragment = answer_html(attr, 2, 0)  # a reversed span is the same span
    assert "Given answer (teacher-forced)" in fragment
    assert re.findall(r'data-step="(\d+)" data-selected', fragment) == ["0", "1", "2"]
    assert answer_html(attr, 0, 2) == fragment
    assert re.findall(r'data-step="(\d+)" data-selected', answer_html(attr, 1, 99)) == ["1", "2"]  # clamped
    assert re.findall(r'data-step="(\d+)" data-selected', answer_html(attr, 1, 1)) == ["1"]
    outlined = ["outline:" in t["style"] for t in _answer_tokens(answer_html(attr, 1, 1))]
    assert outlined == [False, True, False]  # one token: outlined; a span: shaded, so the run reads as one
    assert not any("outline:" in t["style"] for t in _answer_tokens(fragment))
    attr.meta["answer"] = "generated"
    assert "teacher-forced" not in answer_html(attr, 1)


def test_a_contrasted_step_names_the_foil_and_leaves_out_methods_that_cannot_be_contrastive():
    attr = make_attr({"macs": RAW, "atman": RAW[::-1].copy()})
    attr.meta["contrast"] = {
        "steps": {"2": {"target_id": 101, "target": " is", "foil_id": 7, "foil": " was"}},
        "not_contrastive": ["macs"],
    }
    fragment = side_by_side_html(attr, ["macs", "atman"], 1)
    assert "why &#x27;␣is&#x27; rather than &#x27;␣was&#x27;" in fragment  # spaces shown as ␣
    got = panels(fragment)
    assert "No contrastive map" in got["macs"] and "xai-flow" not in got["macs"]
    assert "No contrastive map" not in got["atman"] and spans(got["atman"])
    # the shared colour scale comes from the maps shown: atman's alone
    assert legend_zmax(fragment) == legend_zmax(side_by_side_html(attr, ["atman"], 1))
    assert top_tokens_rows(attr, "macs", 1) == [] and top_tokens_rows(attr, "atman", 1)
    other = side_by_side_html(attr, ["macs", "atman"], 0)  # another step: both maps, the plain caption
    assert "No contrastive map" not in other and "rather than" not in other and "explains the token" in other
    alone = side_by_side_html(attr, ["macs"], 1)  # no ticked method can be contrastive: the step is still named
    assert "No generated tokens yet" not in alone and "Step 2 of 3 explains why" in alone
    assert "No contrastive map" in panels(alone)["macs"] and 'class="xai-legend"' not in alone
    streaming = make_attr({"macs": RAW[:0]}, generated=[" Paris"])  # a token, no rows yet: the token is named
    assert "No generated tokens yet" not in side_by_side_html(streaming, ["macs"], 0)


def test_the_report_leaves_a_contrasted_step_blank_for_methods_that_cannot_be_contrastive():
    from visuals.report import report_data

    attr = make_attr({"macs": RAW, "atman": RAW[::-1].copy()})
    attr.meta["contrast"] = {
        "steps": {"2": {"target_id": 101, "target": " is", "foil_id": 7, "foil": " was"}},
        "not_contrastive": ["macs"],
    }
    data = report_data(attr, ["macs", "atman"])
    macs, atman = data["z"]
    assert all(v is None for v in macs[1]) and any(v is not None for v in macs[0])
    assert any(v is not None for v in atman[1])
    assert "rather than" in data["captions"][1] and "rather than" not in data["captions"][0]
