"""Result type, z-scores and readable token strings."""

from __future__ import annotations

import json

import numpy as np
import pytest

from explainer.errors import InputError
from explainer.models.tokens import check_encodable, readable_tokens
from explainer.result.attribution import Attribution, MethodScores, zscore


def test_zscore_matches_definition_and_handles_flat_rows():
    raw = np.array([[1.0, 2.0, 3.0, 6.0], [5.0, 5.0, 5.0, 5.0]])
    z = zscore(raw)
    row = raw[0]
    np.testing.assert_allclose(z[0], (row - row.mean()) / row.std(), rtol=1e-6)
    assert np.all(z[1] == 0)


def test_zscore_of_a_row_with_nan_or_inf_is_nan_not_flat():
    raw = np.array([[1.0, np.nan, 3.0], [1.0, np.inf, 3.0], [1.0, 2.0, 3.0]])
    z = zscore(raw)
    assert np.isnan(z[0]).all() and np.isnan(z[1]).all()  # no score, rather than "every token equally important"
    np.testing.assert_allclose(z[2], [-1.2247449, 0.0, 1.2247449], rtol=1e-6)


def test_zscore_over_subset_leaves_others_nan():
    raw = np.array([[10.0, 1.0, 2.0, 3.0]])
    z = zscore(raw, [1, 2, 3])
    assert np.isnan(z[0, 0])
    np.testing.assert_allclose(z[0, 1:], [-1.2247449, 0.0, 1.2247449], rtol=1e-6)


def test_attribution_json_roundtrip(tmp_path):
    raw = np.arange(6, dtype=np.float32).reshape(2, 3)
    attr = Attribution(
        model="m",
        prompt_token_ids=[1, 2, 3],
        prompt_tokens=["a", " b", "\n"],
        generated_token_ids=[4, 5],
        generated_tokens=["x", "y"],
        methods={"macs": MethodScores.from_raw(raw, seconds=0.5, meta={"alpha": 0.8})},
        user_positions=[1, 2],
    )
    path = tmp_path / "a.json"
    attr.save_json(path)
    back = Attribution.load_json(path)
    assert back.prompt_tokens == attr.prompt_tokens and back.generated_token_ids == [4, 5]
    np.testing.assert_array_equal(back.methods["macs"].raw, raw)
    np.testing.assert_allclose(back.methods["macs"].z, zscore(raw))
    assert back.methods["macs"].meta == {"alpha": 0.8}
    assert attr.top_tokens("macs", 1, k=2)[0][:2] == (2, "\n")


def _saved() -> dict:
    raw = np.arange(6, dtype=np.float32).reshape(2, 3)  # (K, N)
    return Attribution(
        model="m",
        prompt_token_ids=[1, 2, 3],
        prompt_tokens=["a", " b", "\n"],
        generated_token_ids=[4, 5],
        generated_tokens=["x", "y"],
        methods={"macs": MethodScores.from_raw(raw)},
        user_positions=[1, 2],
        image={"token_positions": [0, 1], "grid": [1, 2], "size": [20, 10]},
        step_scores={"probability": [0.25, 1], "entropy": [1.5, 0.0]},
    ).to_dict()


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d: d.pop("prompt_tokens"), "prompt_tokens is missing"),
        (lambda d: d.update(prompt_token_ids=[1, 2, -3]), "prompt_token_ids must hold token ids"),
        (lambda d: d.update(prompt_tokens=["a", "b"]), "prompt_tokens must be 3 strings"),
        (lambda d: d.update(prompt_tokens=["a", "\ud800", "c"]), r"prompt_tokens\[1\] contains U\+D800"),
        (lambda d: d.update(user_positions=[3]), "user_positions must hold prompt positions from 0 to 2"),
        (lambda d: d["methods"]["macs"].update(raw=[[1, 2, 3]]), r"raw must be a 2 x 3 table of numbers"),
        (lambda d: d["methods"]["macs"].update(raw=[[1, "a", 3], [1, 2, 3]]), "raw must be a 2 x 3 table"),
        (lambda d: d["methods"]["macs"].update(seconds=-1), "seconds is a time in seconds"),
        (lambda d: d["image"].update(grid=[2, 2]), "grid must be \\[h, w\\] with h \\* w = 2"),
        (lambda d: d.update(meta=[]), "meta must be an object"),
        (lambda d: d.update(step_scores=[]), "step_scores must be an object"),
        (lambda d: d["step_scores"].update(entropy=[1.0]), r"step_scores\['entropy'\] must be a list of 2 numbers"),
        (lambda d: d["step_scores"].update(entropy="1, 2"), r"step_scores\['entropy'\] must be a list of 2 numbers"),
        (lambda d: d["step_scores"].update(probability=[0.5, 1.01]), "must hold probabilities from 0 to 1, found 1.01"),
        (lambda d: d["step_scores"].update(probability=[-0.0001, 1]), "probabilities from 0 to 1, found -0.0001"),
        (lambda d: d["step_scores"].update(entropy=[1.0, -1e-9]), "entropies of 0 or more \\(nats\\), found -1e-09"),
        (lambda d: d["step_scores"].update(entropy=[1.0, float("nan")]), "must hold finite numbers, found nan"),
        (lambda d: d["step_scores"].update(entropy=[1.0, 10**400]), "must hold finite numbers"),
        (lambda d: d["step_scores"].update(entropy=[1.0, "2"]), "must hold finite numbers, found '2'"),
        (lambda d: d["step_scores"].update(entropy=[1.0, True]), "must hold finite numbers, found True"),
        (lambda d: d["step_scores"].update(rank=[1]), r"step_scores\['rank'\] must be a list of 2 numbers"),
    ],
)
def test_a_malformed_saved_result_names_the_field(tmp_path, change, message):
    d = _saved()
    change(d)
    with pytest.raises(InputError, match=message):
        Attribution.from_dict(d)
    with pytest.raises(InputError, match="is a JSON object"):
        Attribution.from_dict([d])
    path = tmp_path / "bad.json"
    path.write_text("{ not json")
    with pytest.raises(InputError, match="is not valid JSON"):
        Attribution.load_json(path)
    with pytest.raises(InputError, match="does not exist"):
        Attribution.load_json(tmp_path / "missing.json")


def test_step_scores_round_trip_and_are_optional():
    d = _saved()
    back = Attribution.from_dict(json.loads(json.dumps(d)))
    assert back.step_scores == {"probability": [0.25, 1.0], "entropy": [1.5, 0.0]}
    assert back.to_dict()["step_scores"] == d["step_scores"]
    older = {key: value for key, value in d.items() if key != "step_scores"}  # saved before step scores existed
    assert Attribution.from_dict(older).step_scores == {}
    assert Attribution.from_dict(older).to_dict()["step_scores"] == {}


def test_snapshot_keeps_step_scores_apart_from_later_changes():
    attr = Attribution.from_dict(_saved())
    snap = attr.snapshot()
    attr.step_scores["probability"].append(0.5)
    attr.step_scores["rank"] = [1, 2]
    assert snap.step_scores == {"probability": [0.25, 1.0], "entropy": [1.5, 0.0]}


def test_a_saved_result_without_z_or_steps_still_loads():
    d = _saved()
    del d["methods"]["macs"]["z"]
    np.testing.assert_allclose(Attribution.from_dict(d).methods["macs"].z, zscore(np.arange(6).reshape(2, 3)))
    empty = {**d, "generated_token_ids": [], "generated_tokens": [], "methods": {"macs": {"raw": [], "z": []}},
             "step_scores": {"probability": [], "entropy": []}}  # fmt: skip
    assert Attribution.from_dict(empty).methods["macs"].raw.shape == (0, 3)


def test_lone_surrogates_are_refused_with_their_place():
    check_encodable("fine: é 日本 👩\u200d👩", "The prompt")
    with pytest.raises(InputError, match="The prompt contains U\\+DFFF at character 3"):
        check_encodable("ab\udfffc", "The prompt")


@pytest.mark.parametrize(
    "raw, expected",
    [
        (["ĠParis", "Ċ", "ĊĊ", "Hello"], [" Paris", "\n", "\n\n", "Hello"]),
        (["Ã©"], ["é"]),  # byte-level UTF-8 for é
        (["Ã"], ["\ufffd"]),  # a lone partial byte
        (["▁Paris", "<0x0A>", "is"], [" Paris", "\n", "is"]),
        ([None], ["<unk>"]),
    ],
)
def test_readable_tokens(raw, expected):
    byte_level = any(t and "Ġ" in t for t in raw) or raw == ["Ã©"] or raw == ["Ã"]
    assert readable_tokens(raw, byte_level=byte_level) == expected


def test_special_tokens_kept_verbatim():
    assert readable_tokens(["<|im_start|>", "Ġa"], {"<|im_start|>"}) == ["<|im_start|>", " a"]
