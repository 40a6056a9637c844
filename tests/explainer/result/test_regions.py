"""Region -> answer tokens (`explainer.result.regions`) against plain loops over hand-built results: cells under clicks,
rectangles, their image tokens, and the per-step mean z-score of a selection."""

from __future__ import annotations

import math

import numpy as np
import pytest

from explainer.errors import InputError
from explainer.result.attribution import Attribution, MethodScores
from explainer.result.regions import (
    cell_at,
    cell_positions,
    cells_in_box,
    image_region_strengths,
    region_strength,
    word_choices,
    word_region_strengths,
)

IMAGE = {"token_positions": [2, 3, 4, 5, 6, 7], "grid": [2, 3], "size": [60, 40]}  # 2 rows x 3 columns, 60 x 40 px


def image_result(raw: np.ndarray) -> Attribution:
    tokens = ["<|im_start|>", "<|vision_start|>", *["<|image_pad|>"] * 6, "<|vision_end|>", " What", "?"]
    return Attribution(
        model="fake-vlm", prompt_token_ids=list(range(len(tokens))), prompt_tokens=tokens,
        generated_token_ids=list(range(raw.shape[0])), generated_tokens=[f" t{k}" for k in range(raw.shape[0])],
        methods={"macs": MethodScores.from_raw(raw), "random": MethodScores.from_raw(raw[:, ::-1].copy())},
        user_positions=[9, 10], image=IMAGE,
    )  # fmt: skip


def plain_strength(row: list[float], over: list[int], region: list[int]) -> float:
    """Mean over `region` of the row's z-scores over `over`, with explicit loops."""
    values = [row[p] for p in over]
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
    return sum((row[p] - mean) / std for p in region) / len(region)


def test_clicks_pick_the_cell_under_them_and_rectangles_cover_the_cells_between():
    assert cell_at(IMAGE, 0, 0) == (0, 0) and cell_at(IMAGE, 59.9, 39.9) == (1, 2)
    assert cell_at(IMAGE, 20, 19.9) == (0, 1) and cell_at(IMAGE, 19.9, 20) == (1, 0)  # 20 x 20 px cells
    assert cell_at(IMAGE, -5, 100) == (1, 0)  # clamped to the grid
    assert cells_in_box((1, 2), (0, 1)) == [(0, 1), (0, 2), (1, 1), (1, 2)]  # either corner first
    assert cell_positions(IMAGE, [(1, 2), (0, 0), (0, 0)]) == [2, 7]  # row-major, each once
    with pytest.raises(InputError, match="outside"):
        cell_positions(IMAGE, [(2, 0)])


def test_region_strength_is_the_mean_z_score_of_the_region_per_step():
    raw = np.random.default_rng(3).random((4, 11)).astype(np.float32)  # (K, N)
    attr = image_result(raw)
    region = [(0, 1), (1, 1), (1, 2)]
    positions = [IMAGE["token_positions"][r * 3 + c] for r, c in region]
    got = image_region_strengths(attr, ["random", "macs", "atman"], region)
    assert list(got) == ["random", "macs"]  # the methods it has, in the order asked
    for k in range(4):
        expected = plain_strength([float(v) for v in raw[k]], IMAGE["token_positions"], positions)
        assert got["macs"][k] == pytest.approx(expected, abs=1e-5)
    whole = image_region_strengths(attr, ["macs"], cells_in_box((0, 0), (1, 2)))["macs"]
    np.testing.assert_allclose(whole, 0.0, atol=1e-6)  # the whole image is the average by definition


def test_steps_without_scores_stay_empty_and_bad_selections_say_why():
    raw = np.random.default_rng(4).random((3, 11)).astype(np.float32)
    raw[1, 4] = np.nan  # the method failed at step 2
    attr = image_result(raw)
    got = region_strength(attr, "macs", [3, 4], IMAGE["token_positions"])
    assert np.isfinite(got[[0, 2]]).all() and np.isnan(got[1])
    with pytest.raises(InputError, match="Select part"):
        region_strength(attr, "macs", [], IMAGE["token_positions"])
    with pytest.raises(InputError, match="not part"):
        region_strength(attr, "macs", [9], IMAGE["token_positions"])  # a question token in an image region
    with pytest.raises(InputError, match="No scores"):
        region_strength(attr, "atman", [3], IMAGE["token_positions"])
    text = Attribution(**{**attr.__dict__, "image": None})
    with pytest.raises(InputError, match="no image"):
        image_region_strengths(text, ["macs"], [(0, 0)])


def test_words_of_the_prompt_are_chosen_by_label_and_scored_over_the_users_text():
    tokens = ["<s>", "user", "\n", " Where", " is", " Pa", "ris", "?", " Where", "</s>"]
    raw = np.random.default_rng(5).random((2, len(tokens))).astype(np.float32)
    attr = Attribution(
        model="fake", prompt_token_ids=list(range(len(tokens))), prompt_tokens=tokens,
        generated_token_ids=[1, 2], generated_tokens=[" It", " is"], methods={"macs": MethodScores.from_raw(raw)},
        user_positions=[3, 4, 5, 6, 7, 8],
    )  # fmt: skip
    choices = word_choices(attr)
    assert choices == [("1: Where", [3]), ("2: is", [4]), ("3: Paris", [5, 6]), ("4: ?", [7]), ("5: Where", [8])]
    got = word_region_strengths(attr, ["macs"], ["3: Paris", "5: Where"])["macs"]
    for k in range(2):
        expected = plain_strength([float(v) for v in raw[k]], [3, 4, 5, 6, 7, 8], [5, 6, 8])
        assert got[k] == pytest.approx(expected, abs=1e-5)
    with pytest.raises(InputError, match="not a word"):
        word_region_strengths(attr, ["macs"], ["6: London"])
