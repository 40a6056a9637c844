"""Result type, z-scores and readable token strings."""

from __future__ import annotations

import numpy as np
import pytest

from explainer.result import Attribution, MethodScores, zscore
from explainer.tokens import readable_tokens


def test_zscore_matches_definition_and_handles_flat_rows():
    raw = np.array([[1.0, 2.0, 3.0, 6.0], [5.0, 5.0, 5.0, 5.0]])
    z = zscore(raw)
    row = raw[0]
    np.testing.assert_allclose(z[0], (row - row.mean()) / row.std(), rtol=1e-6)
    assert np.all(z[1] == 0)


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
