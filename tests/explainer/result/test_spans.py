"""Spans, words and sentences on hand-built `Attribution`s, checked against loops and z-scores computed here."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from explainer.errors import InputError
from explainer.models.tokens import readable_tokens
from explainer.result.attribution import Attribution, MethodScores
from explainer.result.spans import (
    Group,
    check_span,
    group_scores,
    groups,
    is_special,
    sentence_groups,
    sentence_starts,
    shown_positions,
    span_range,
    span_scores,
    token_groups,
    top_sentences,
    word_groups,
)

RNG = np.random.default_rng(7)


def make_attr(prompt: list[str], raw: dict[str, np.ndarray], user: list[int] | None = None) -> Attribution:
    k = next(iter(raw.values())).shape[0]
    return Attribution(
        model="tiny",
        prompt_token_ids=list(range(len(prompt))),
        prompt_tokens=list(prompt),
        generated_token_ids=list(range(100, 100 + k)),
        generated_tokens=[f" a{i}" for i in range(k)],
        methods={m: MethodScores.from_raw(r) for m, r in raw.items()},
        user_positions=list(range(len(prompt))) if user is None else list(user),
    )


def z_of(row: np.ndarray, cols: list[int]) -> np.ndarray:
    """(N,) z-scores of `row` over `cols` (the finite ones), NaN elsewhere: the plain formula, one column at a time."""
    cols = [c for c in cols if math.isfinite(row[c])]
    out = np.full(row.shape, np.nan)
    if not cols:
        return out
    vals = [float(row[c]) for c in cols]
    mean = sum(vals) / len(vals)
    std = math.sqrt(sum((v - mean) ** 2 for v in vals) / len(vals))
    for c in cols:
        out[c] = (float(row[c]) - mean) / std if std > 0 else 0.0
    return out


def texts(gs: list[Group]) -> list[str]:
    return [g.text for g in gs]


def check_partition(gs: list[Group], tokens: list[str], chosen: list[int]) -> None:
    """Groups cover the chosen positions exactly once, in order, each a contiguous run with its tokens' text."""
    flat = [p for g in gs for p in g.positions]
    assert flat == sorted(set(chosen)), (flat, chosen)
    for g in gs:
        assert g.stop > g.start and g.text == "".join(tokens[g.start : g.stop])


# --- spans --------------------------------------------------------------------------------------------------------

PROMPT = ["<|im_start|>", "user", "\n", "A", " b", " c", ".", " D", " e", "<|im_end|>"]
USER = [3, 4, 5, 6, 7, 8]


def test_span_is_the_mean_of_per_step_z_scores_over_all_tokens():
    raw = RNG.random((5, len(PROMPT))).astype(np.float32)
    attr = make_attr(PROMPT, {"m": raw}, USER)
    got = span_scores(attr, "m", 1, 3)
    want = [np.mean([z_of(raw[s], list(range(len(PROMPT))))[p] for s in (1, 2, 3)]) for p in range(len(PROMPT))]
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert got.dtype == np.float32 and got.shape == (len(PROMPT),)
    # a single step is its stored z row; `last` None means `first`
    np.testing.assert_allclose(span_scores(attr, "m", 2, 2), attr.methods["m"].z[2], atol=1e-6)
    np.testing.assert_array_equal(span_scores(attr, "m", 2), span_scores(attr, "m", 2, 2))
    np.testing.assert_array_equal(span_scores(attr, "m"), span_scores(attr, "m", 4, 4))  # None: the newest step
    # not the z-score of the mean raw row (that would let one peaked step dominate)
    assert not np.allclose(got, z_of(raw[1:4].mean(axis=0), list(range(len(PROMPT)))), atol=1e-3)


def test_span_over_user_positions_restandardises_each_step_and_keeps_nan():
    raw = RNG.random((4, len(PROMPT))).astype(np.float32)
    raw[1, 5] = np.nan  # no score at one step: skipped there
    raw[:, 8] = np.nan  # no score at any step: stays NaN
    attr = make_attr(PROMPT, {"m": raw}, USER)
    got = span_scores(attr, "m", 0, 3, USER)
    for p in range(len(PROMPT)):
        per_step = [z_of(raw[s], USER)[p] for s in range(4)]
        per_step = [v for v in per_step if math.isfinite(v)]
        if p not in USER or p == 8:
            assert math.isnan(got[p]), p  # excluded positions and positions never scored stay NaN
        else:
            assert got[p] == pytest.approx(np.mean(per_step), abs=1e-5), p
    assert len([s for s in range(4) if math.isfinite(z_of(raw[s], USER)[5])]) == 3


def test_span_range_is_validated_with_clear_errors():
    attr = make_attr(PROMPT, {"m": RNG.random((5, len(PROMPT)))})
    assert check_span(attr, "m", 1, 3) == (1, 3)
    assert check_span(attr, "m", np.int64(2), 4.0) == (2, 4)  # numpy ints and whole floats (sliders) are fine
    assert check_span(attr, "m") == (4, 4) and span_range(5, 0) == (0, 0)
    with pytest.raises(InputError, match="backwards"):
        check_span(attr, "m", 3, 1)
    with pytest.raises(InputError, match="tokens 1 to 5"):
        span_scores(attr, "m", 2, 5)
    with pytest.raises(InputError, match="tokens 1 to 5"):
        check_span(attr, "m", -1, 2)
    for bad in (True, 1.5, "2", None):
        with pytest.raises(InputError, match="whole number"):
            check_span(attr, "m", 0, bad) if bad is not None else check_span(attr, "m", [1])
    with pytest.raises(InputError, match="no scores for the method 'x'; it has: m"):
        span_scores(attr, "x", 0, 1)
    empty = make_attr(PROMPT, {"m": np.zeros((0, len(PROMPT)), np.float32)})
    with pytest.raises(InputError, match="generate an answer first"):
        span_scores(empty, "m", 0, 0)


# --- group scores ---------------------------------------------------------------------------------------------------


def test_group_scores_equal_explicit_loops():
    z = RNG.normal(size=30).astype(np.float32)
    z[[3, 10, 11]] = np.nan
    gs = [Group(0, 4, "", "word"), Group(4, 10, "", "word"), Group(10, 12, "", "word"), Group(12, 30, "", "word")]
    got = group_scores(z, gs)
    for g, s in zip(gs, got, strict=True):
        vals = [float(z[p]) for p in g.positions if math.isfinite(z[p])]
        if vals:
            assert s == pytest.approx(sum(vals) / len(vals), abs=1e-6)
        else:
            assert math.isnan(s)  # every token NaN: no score
    assert group_scores(z, []).shape == (0,)
    one = token_groups([str(i) for i in range(30)])
    np.testing.assert_array_equal(group_scores(z, one), z)  # token groups: the z-scores themselves


# --- words ----------------------------------------------------------------------------------------------------------


def test_words_merge_byte_level_pieces(tokenizer):
    text = "Attention consistency scores explain tokens: Paris, France!\nNumbers 0123 and punctuation."
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
    if not isinstance(ids, list):
        ids = ids["input_ids"]
    raw = tokenizer.convert_ids_to_tokens(ids)
    assert any(t.startswith("Ġ") for t in raw)  # a byte-level vocabulary
    tokens = readable_tokens(raw, set(tokenizer.all_special_tokens) | {"<|im_start|>"})
    gs = word_groups(tokens)
    check_partition(gs, tokens, list(range(len(tokens))))
    words = [g.text.strip() for g in gs if g.kind == "word"]
    assert len(tokens) > len(gs)  # pieces were merged
    for w in ["Attention", "consistency", "scores", "explain", "tokens", "Paris", "France", "Numbers", "0123"]:
        assert w in words, (w, words)
    assert [g.text for g in gs if g.kind == "special"] == ["<|im_start|>", "<|im_end|>", "<|im_start|>"]
    assert {g.text.strip() for g in gs if g.kind == "punct"} >= {":", ",", "!", "."}
    assert "\n" in [g.text for g in gs if g.kind == "space"]


def test_words_merge_sentencepiece_pieces():
    raw = ["<s>", "▁The", "▁qu", "ick", "▁fox", "'", "s", "▁", "1", "9", "9", "9", "▁den", ",", "▁3", ".", "5", "▁km"]
    raw += ["<0x0A>", "▁well", "-", "known", "▁(", "wow", ")", "▁😀", "▁東京", "タワー", "。", "</s>"]
    tokens = readable_tokens(raw, {"<s>", "</s>"}, byte_level=False)
    gs = word_groups(tokens)
    check_partition(gs, tokens, list(range(len(tokens))))
    assert texts(gs) == [
        "<s>",
        " The",
        " quick",
        " fox's",
        " 1999",  # a lone ▁ before digits starts the word
        " den",
        ",",
        " 3.5",  # a decimal point between digits joins
        " km",
        "\n",
        " well-known",
        " (",
        "wow",
        ")",
        " 😀",  # symbols, emoji included, are their own group
        " 東京",  # CJK: each token a word
        "タワー",
        "。",
        "</s>",
    ]
    assert [g.kind for g in gs if g.text in ("<s>", "</s>", "\n", ",", " 😀")] == [
        "special",
        "punct",
        "space",
        "punct",
        "special",
    ]


def test_special_tokens_and_gaps_are_groups_alone():
    tokens = ["<|im_start|>", "system", "<|im_end|>", "[INST]", "Hi", "there", "<|image_pad|>", "<|image_pad|>", "x"]
    gs = word_groups(tokens)
    assert texts(gs) == ["<|im_start|>", "system", "<|im_end|>", "[INST]", "Hithere", "<|image_pad|>"] + [
        "<|image_pad|>",
        "x",
    ]
    assert is_special("</s>") and is_special("<start_of_turn>") and not is_special("<b") and not is_special(" <b>")
    gap = word_groups(tokens, [4, 5, 8, 4])  # unsorted, repeated: normalised
    assert texts(gap) == ["Hithere", "x"]
    assert texts(word_groups(tokens, [4, 6, 5])) == ["Hithere", "<|image_pad|>"]
    assert texts(word_groups(["ab", "cd", "ef"], [0, 2])) == ["ab", "ef"]  # a gap ends a word


# --- sentences ------------------------------------------------------------------------------------------------------


def pieces(text: str) -> list[str]:
    """A GPT-2-like split: a space joins the word after it; punctuation, spaces and newlines are pieces."""
    import re

    out = re.findall(r" ?[A-Za-z]+| ?\d| ?[^\sA-Za-z\d]|\n+| +", text)
    assert "".join(out) == text
    return out


PARAGRAPH = (
    'Dr. Smith paid $3.5 million, e.g. for the U.S. office. He said "Stop." Then he left! Why?\n'
    "J. K. Rowling wrote it (see Fig. 2). It costs 1,000 dollars... and more.\n\n"
    "1. Preheat the oven.\n2. Bake it in 2020. Then eat.\n"
    "It is 5 p.m. now. Done"
)


def test_sentences_split_a_paragraph_with_abbreviations_decimals_quotes_and_newlines():
    tokens = pieces(PARAGRAPH)
    gs = sentence_groups(tokens)
    check_partition(gs, tokens, list(range(len(tokens))))
    assert [g.text.strip() for g in gs] == [
        "Dr. Smith paid $3.5 million, e.g. for the U.S. office.",
        'He said "Stop."',
        "Then he left!",
        "Why?",
        "J. K. Rowling wrote it (see Fig. 2).",
        "It costs 1,000 dollars... and more.",
        "1. Preheat the oven.",
        "2. Bake it in 2020.",  # a list number opens its line; a number ending a sentence is no list number
        "Then eat.",
        "It is 5 p.m. now.",
        "Done",
    ]
    assert all(g.kind == "sentence" for g in gs)
    assert gs[3].text.endswith("\n") and gs[5].text.endswith("\n\n")  # trailing newlines stay with their sentence


def test_sentences_split_cjk_and_newline_without_punctuation():
    text = "我喜欢巴黎。它很美！你呢？「好。」然后 Title line\nNext line"
    starts = sentence_starts(text)
    assert [text[s:][:3] for s in starts] == ["它很美", "你呢？", "「好。", "然后 ", "Nex"]
    tokens = ["我喜欢", "巴黎", "。", "它", "很美", "！", "你呢", "？", "「", "好", "。", "」", "然后", " Title"]
    tokens += [" line", "\n", "Next", " line"]
    assert texts(sentence_groups(tokens)) == ["我喜欢巴黎。", "它很美！", "你呢？", "「好。」", "然后 Title line\n"] + [
        "Next line"
    ]


def test_sentence_edge_cases():
    assert sentence_starts("") == [] and sentence_starts("No end") == []
    assert sentence_starts("\n\nLeading newlines.") == []  # nothing before them: no empty sentence
    assert sentence_starts("The answer is no. Then") == [18]  # "no" is not "No."
    assert sentence_starts("Version 2.0 is out. See") == [20]
    assert sentence_starts("Wait?! Go") == [7] and sentence_starts("Mr. Bean? Yes") == [10]
    # a token straddling a sentence end goes whole to the sentence where it starts
    assert texts(sentence_groups(["Hi", ". Yo", " there."])) == ["Hi. Yo", " there."]
    assert texts(sentence_groups(["  ", "Hi.", " ", " Yo"])) == ["  Hi. ", " Yo"]
    assert texts(sentence_groups([" ", "\n"])) == [" \n"] and sentence_groups([" ", "\n"])[0].kind == "space"


def test_sentences_keep_template_lines_out_of_user_sentences(tokenizer):
    text = "Paris is the capital. France is a country."
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
    if not isinstance(ids, list):
        ids = ids["input_ids"]
    tokens = readable_tokens(tokenizer.convert_ids_to_tokens(ids), set(tokenizer.all_special_tokens) | {"<|im_start|>"})
    joined = "".join(tokens)
    lo = joined.index(text)
    offsets = np.cumsum([0] + [len(t) for t in tokens])
    user = [i for i in range(len(tokens)) if offsets[i] < lo + len(text) and offsets[i + 1] > lo]
    attr = make_attr(tokens, {"m": RNG.random((2, len(tokens)))}, user)
    mine = groups(attr, "sentence")
    assert [g.text for g in mine] == ["Paris is the capital.", " France is a country."]
    everything = groups(attr, "sentence", user_only=False)
    check_partition(everything, tokens, list(range(len(tokens))))
    kinds = [(g.kind, g.text) for g in everything]
    assert kinds[:2] == [("special", "<|im_start|>"), ("role", "user\n")]
    assert ("role", "assistant\n") in kinds and ("sentence", "Paris is the capital. ") not in kinds
    assert [t for k, t in kinds if k == "sentence"] == ["Paris is the capital.", " France is a country."]
    with pytest.raises(InputError, match="token, word, sentence"):
        groups(attr, "paragraph")


# --- partition property ---------------------------------------------------------------------------------------------

_POOL = [" The", "cat", ".", " 3", ",", "5", "'", "s", "\n", "\n\n", " ", "", "<|im_start|>", "</s>", "!", '"', "。"]
_POOL += ["東", " 😀", "\ufffd", " e", "-", "?", ")", " Mr", "\t", "x\n", "\nY", "...", " U.S", "‮"]


@pytest.mark.parametrize("seed", range(40))
def test_groups_partition_the_chosen_positions_exactly_once_in_order(seed):
    rnd = random.Random(seed)
    tokens = [rnd.choice(_POOL) for _ in range(rnd.randint(0, 60))]
    chosen = None if seed % 3 == 0 else [p for p in range(len(tokens) + 3) if rnd.random() < 0.8]
    want = list(range(len(tokens))) if chosen is None else [p for p in chosen if p < len(tokens)]
    for build in (token_groups, word_groups, sentence_groups):
        gs = build(tokens, chosen)
        check_partition(gs, tokens, want)
        assert all(g.kind in {"token", "word", "punct", "space", "special", "sentence", "role"} for g in gs)
        for a, b in zip(gs, gs[1:], strict=False):
            assert a.stop <= b.start


# --- top sentences --------------------------------------------------------------------------------------------------


def test_top_sentences_rank_by_mean_token_z_over_the_span():
    tokens = ["<|im_start|>", "user", "\n"] + pieces(PARAGRAPH) + ["<|im_end|>", "\n"]
    n = len(tokens)
    user = list(range(3, n - 2))
    raw = {m: RNG.random((6, n)).astype(np.float32) ** 3 for m in ("a", "b")}
    attr = make_attr(tokens, raw, user)
    for m in ("a", "b"):
        got = top_sentences(attr, m, 1, 4, k=4)
        sentences = sentence_groups(tokens, user)
        z = np.mean([z_of(raw[m][s], user) for s in range(1, 5)], axis=0)  # NaN outside `user`
        means = [float(np.mean([z[p] for p in g.positions])) for g in sentences]
        order = sorted(range(len(sentences)), key=lambda i: -means[i])[:4]
        assert [t.group for t in got] == [sentences[i] for i in order]
        np.testing.assert_allclose([t.score for t in got], [means[i] for i in order], atol=1e-5)
        assert [t.rank for t in got] == [1, 2, 3, 4] and got[0].text == sentences[order[0]].text
        assert list(got[0].positions) == list(sentences[order[0]].positions)
    assert top_sentences(attr, "a", 1, 4, k=0) == []
    # over all tokens, template pieces are never ranked
    whole = top_sentences(attr, "a", 0, 5, k=100, user_only=False)
    assert {t.group.kind for t in whole} == {"sentence"} and len(whole) == 11
    pos, subset = shown_positions(attr, False)
    assert not subset and pos.tolist() == list(range(n))
