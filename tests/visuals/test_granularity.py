"""Token, word and sentence heatmaps and top-sentence tables, read back from their HTML and checked against scores
computed here."""

from __future__ import annotations

import html
import re

import numpy as np
import pytest

from explainer.errors import InputError
from explainer.result.attribution import Attribution, MethodScores
from explainer.result.spans import group_scores, sentence_groups, top_sentences, word_groups
from visuals.granularity import safe_text, span_side_by_side_html, top_sentences_html
from visuals.heatmap import Z_CLIP, bin_class, side_by_side_html

TEMPLATE_HEAD = ["<|im_start|>", "user", "\n"]
TEMPLATE_TAIL = ["<|im_end|>", "\n", "<|im_start|>", "assistant", "\n"]
TEXT = ["Paris", " is", " the", " cap", "ital", " of", " France", ".", " It", " has", " 2", ".", "1", " million"]
TEXT += [" people", ".", "\n", "Berlin", " is", " far", "."]
PROMPT = TEMPLATE_HEAD + TEXT + TEMPLATE_TAIL
USER = list(range(len(TEMPLATE_HEAD), len(TEMPLATE_HEAD) + len(TEXT)))
K = 5
RNG = np.random.default_rng(3)
RAW = {m: RNG.random((K, len(PROMPT))).astype(np.float32) ** 2 for m in ("macs", "rollout")}

# A unit: <i class=r3 title=+1.23>text</i>; no class on white units, no title while pending, a quoted title when
# there is no score. Gap markers (class="xh", quoted) do not match.
_UNIT = re.compile(r'<i(?: class=(r\d|b\d|xg))?(?: title=("[^"]*"|[^\s>"]+))?>(.*?)</i>')


def make_attr(
    raw: dict[str, np.ndarray] = RAW, prompt: list[str] = PROMPT, user: list[int] = USER, generated=None
) -> Attribution:
    k = next(iter(raw.values())).shape[0] if raw else 0
    generated = [" The", " city", " of", " light", "."][:k] if generated is None else generated
    return Attribution(
        model="tiny",
        prompt_token_ids=list(range(len(prompt))),
        prompt_tokens=list(prompt),
        generated_token_ids=list(range(100, 100 + len(generated))),
        generated_tokens=list(generated),
        methods={m: MethodScores.from_raw(r, seconds=0.5) for m, r in raw.items()},
        user_positions=list(user),
    )


def panels(fragment: str) -> dict[str, str]:
    parts = fragment.split('<div class="xai-panel" data-method="')[1:]
    return {html.unescape(p.split('"', 1)[0]): p for p in parts}


def units(panel: str) -> list[tuple[str, str, str]]:
    """(css class, title, unescaped text) of each unit of a panel."""
    return [
        (c, html.unescape(t.strip('"')), html.unescape(x.replace("⏎<br>", "\n"))) for c, t, x in _UNIT.findall(panel)
    ]


def ranges(spec: str) -> list[list[int]]:
    out = []
    for part in filter(None, spec.split(",")):
        lo, _, hi = part.partition("-")
        out.append(list(range(int(lo), int(hi or lo) + 1)))
    return out


def legend_zmax(fragment: str) -> float:
    (value,) = re.findall(r'class="xai-legend" data-zmax="([^"]+)"', fragment)
    return float(value)


def z_of(row: np.ndarray, cols: list[int]) -> np.ndarray:
    sub = row[cols].astype(np.float64)
    out = np.full(row.shape, np.nan)
    out[cols] = (sub - sub.mean()) / sub.std()
    return out


def test_token_granularity_at_one_step_shows_what_the_token_heatmap_shows():
    attr = make_attr()
    for user_only in (True, False):
        mine = panels(span_side_by_side_html(attr, ["macs", "rollout"], 2, granularity="token", user_only=user_only))
        theirs = panels(side_by_side_html(attr, ["macs", "rollout"], 2, user_only=user_only))
        for m in ("macs", "rollout"):
            assert units(mine[m]) == units(theirs[m])
            assert re.search(r'data-pos="[^"]*"', mine[m])[0] == re.search(r'data-pos="[^"]*"', theirs[m])[0]
            assert "data-groups" not in mine[m]


@pytest.mark.parametrize("granularity", ["word", "sentence"])
def test_groups_over_a_span_carry_the_mean_z_of_their_tokens(granularity):
    attr = make_attr()
    first, last = 1, 3
    fragment = span_side_by_side_html(attr, ["macs", "rollout"], first, last, granularity=granularity)
    zmax = legend_zmax(fragment)
    build = word_groups if granularity == "word" else sentence_groups
    groups = build(PROMPT, USER)
    for m, panel in panels(fragment).items():
        (spec,) = re.findall(r'data-groups="([^"]*)"', panel)
        assert ranges(spec) == [list(g.positions) for g in groups]  # each unit's positions, for clicks
        got = units(panel)
        assert [t for _, _, t in got] == [g.text for g in groups]  # the text, selectable, spaces kept
        # independent: z per step over the user's tokens, averaged over steps, then over each group's tokens
        z = np.mean([z_of(RAW[m][s], USER) for s in range(first, last + 1)], axis=0)
        want = [np.mean([z[p] for p in g.positions]) for g in groups]
        np.testing.assert_allclose([float(t) for _, t, _ in got], want, atol=0.005)  # titles have 2 decimals
        assert [c for c, _, _ in got] == [bin_class(w, zmax) for w in want]
    peak = max(
        abs(float(s))
        for m in RAW
        for s in group_scores(np.mean([z_of(RAW[m][s], USER) for s in range(first, last + 1)], axis=0), groups)
    )
    assert zmax == pytest.approx(min(max(peak, 0.5), Z_CLIP), rel=1e-4)  # one shared scale
    assert fragment.count('class="xai-legend"') == 1
    if granularity == "sentence":
        assert [g.text for g in groups] == ["Paris is the capital of France.", " It has 2.1 million people.\n"] + [
            "Berlin is far."
        ]


def test_captions_say_what_is_shown():
    attr = make_attr()
    span = span_side_by_side_html(attr, ["macs"], 1, 3, granularity="sentence")
    assert "Steps 2-4 of 5 explain &#x27; city of light&#x27; · mean of the per-step z-scores" in span
    assert "sentences (mean z-score of their tokens)" in span
    assert f"re-normalised over the {len(USER)} tokens of your text" in span
    assert "hover a sentence for its mean z-score" in span
    assert re.search(r'aria-label="[^"]*Each sentence&#x27;s mean z-score is its title', span)
    one = span_side_by_side_html(attr, ["macs"], 0, granularity="word", user_only=False)
    assert "Step 1 of 5 explains the token &#x27;␣The&#x27; · words" in one
    assert f"over all {len(PROMPT)} prompt tokens" in one and 'data-granularity="word"' in one
    assert "hover a token for its z-score" in span_side_by_side_html(attr, ["macs"], 0)
    assert "hover a token for its mean z-score" in span_side_by_side_html(attr, ["macs"], 0, 4)
    assert span_side_by_side_html(attr, ["macs"]) == span_side_by_side_html(attr, ["macs"], 4, 4)  # newest step


def test_pending_methods_no_methods_no_steps_and_bad_input():
    attr = make_attr()
    fragment = span_side_by_side_html(attr, ["macs", "atman"], 0, 2, granularity="word")
    pending = panels(fragment)["atman"]
    assert "not in this result" in pending and all(c == "" and t == "" for c, t, _ in units(pending))
    assert "not in this result" in panels(top_sentences_html(attr, ["macs", "atman"], 0, 2))["atman"]
    attr.meta["status"] = "running atman"  # still being made
    assert "· pending<" in panels(span_side_by_side_html(attr, ["macs", "atman"], 0, 2, granularity="word"))["atman"]
    partial = make_attr({"macs": RAW["macs"], "slow": RAW["rollout"][:2]})  # a method two steps behind
    assert "pending" in panels(span_side_by_side_html(partial, ["macs", "slow"], 1, 3))["slow"]
    assert "Select at least one" in span_side_by_side_html(attr, [])
    none = make_attr({}, generated=[])
    empty = span_side_by_side_html(none, ["macs"], granularity="sentence")
    assert "No generated tokens yet" in empty and 'class="xai-legend"' not in empty
    assert "No answer yet" in top_sentences_html(none, ["macs"])
    with pytest.raises(InputError, match="tokens 1 to 5"):
        span_side_by_side_html(attr, ["macs"], 3, 9)
    with pytest.raises(InputError, match="backwards"):
        top_sentences_html(attr, ["macs"], 3, 1)
    with pytest.raises(InputError, match="choose one of: token, word, sentence"):
        span_side_by_side_html(attr, ["macs"], 0, granularity="paragraph")


def test_top_sentences_table_follows_the_library():
    attr = make_attr()
    fragment = top_sentences_html(attr, ["macs", "rollout", "atman"], 0, 4, k=2)
    assert "Top sentences of your text · Steps 1-5 of 5" in fragment
    for m in ("macs", "rollout"):
        want = top_sentences(attr, m, 0, 4, k=2)
        panel = panels(fragment)[m]
        rows = re.findall(
            r'<tr data-pos="(\d+)-(\d+)"><td[^>]*>(\d)</td><td[^>]*><i[^>]*>([^<]*)</i></td>'
            r"<td[^>]*>(.*?)</td></tr>",
            panel,
        )
        assert [int(r[2]) for r in rows] == [1, 2]
        assert [(int(a), int(b) + 1) for a, b, *_ in rows] == [(t.group.start, t.group.stop) for t in want]
        assert [r[3] for r in rows] == [f"{t.score:+.2f}" for t in want]  # the number is written, not only coloured
        assert [html.unescape(r[4]).replace("⏎<br>", "\n") for r in rows] == [t.text.strip() for t in want]
        assert '<th scope="col"' in panel and "<caption" in panel
    assert "not in this result" in panels(fragment)["atman"]  # a finished result without it: nothing is pending
    assert "Top sentences of the whole prompt" in top_sentences_html(attr, ["macs"], 0, user_only=False)


HOSTILE = ["<script>alert(1)</script>", " \u202eevil", " שלום", " 😀", " a\x00b\x1b\x07", " &amp;", ' "q"', "."]


def test_hostile_text_is_escaped_and_made_visible():
    prompt = ["<|im_start|>"] + HOSTILE + ["\u202e", " tail", "."]
    raw = {"<img src=x onerror=alert(1)>": RNG.random((2, len(prompt))).astype(np.float32)}
    attr = make_attr(raw, prompt=prompt, user=list(range(1, len(prompt))), generated=["<b>", "\u202e\x00"])
    name = next(iter(raw))
    for granularity in ("token", "word", "sentence"):
        fragments = [
            span_side_by_side_html(attr, [name], 0, 1, granularity=granularity, user_only=False),
            span_side_by_side_html(attr, [name], 1, granularity=granularity),
            top_sentences_html(attr, [name], 0, 1, k=5),
        ]
        for fragment in fragments:
            assert "<script" not in fragment and "<img" not in fragment and "<b>" not in fragment
            assert "\u202e" not in fragment and "\x00" not in fragment and "\x1b" not in fragment
            assert all(ord(ch) >= 0x20 or ch in "\n\t" for ch in fragment)
            assert "⟨U+202E⟩" in fragment
        flow = fragments[0]
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in flow and "␀" in flow and "␛" in flow and "␇" in flow
        assert "שלום" in flow and "😀" in flow and "&amp;amp;" in flow  # RTL letters and emoji unchanged
        assert panels(flow)[name] and 'data-method="&lt;img src=x onerror=alert(1)&gt;"' in flow
        texts = [t for _, _, t in units(panels(flow)[name])]
        assert "".join(texts) == safe_text("".join(prompt))  # every character shown once, in order
    assert safe_text("a\u202eb\u2066c\r\nd\x7f\x85") == "a⟨U+202E⟩b⟨U+2066⟩c\nd␡\ufffd"


def test_a_span_view_costs_at_most_40_bytes_per_token_and_method():
    words = "The quick brown fox jumps over the lazy dog. Paris is the capital of France, and Berlin of Germany."
    words = words.split()
    n, k = 4000, 32
    prompt = TEMPLATE_HEAD + [("\n" if i % 50 == 0 else " ") + words[i % len(words)] for i in range(n - 8)]
    prompt += TEMPLATE_TAIL
    raw = {m: RNG.random((k, n)).astype(np.float32) ** 3 for m in ("macs", "rollout")}
    attr = make_attr(raw, prompt=prompt, user=list(range(3, n - 5)), generated=[" a"] * k)
    constant = 4096  # stylesheet, captions and legend
    sizes = {}
    for granularity in ("token", "word", "sentence"):
        fragment = span_side_by_side_html(attr, ["macs", "rollout"], 3, 20, granularity=granularity)
        sizes[granularity] = len(fragment.encode("utf-8"))
        assert sizes[granularity] <= 40 * n * 2 + constant, (granularity, sizes[granularity] / (n * 2))
    assert sizes["sentence"] < sizes["token"] / 2  # one unit per sentence, the text itself stays
