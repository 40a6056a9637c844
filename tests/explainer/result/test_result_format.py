"""One saved-result format: the CLI and the app write the same file, with a `format_version`, and files written before
it existed (tests/data: `explain --json` and the app's download of the embedded model on "Paris is", 2 steps) load."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from explainer.cli import main
from explainer.errors import InputError
from explainer.result.attribution import Attribution, load_result, result_json
from explainer.result.schema import FORMAT_VERSION

DATA = Path(__file__).resolve().parents[2] / "data"
OLD_FILES = {"cli": ("result-v0-cli.json", {"macs", "random"}), "app": ("result-v0-app.json", {"macs", "rollout"})}


@pytest.mark.parametrize("writer", list(OLD_FILES))
def test_files_of_format_0_still_load(writer):
    name, methods = OLD_FILES[writer]
    path = DATA / name
    assert "format_version" not in json.loads(path.read_text())
    for attr in (load_result(path), Attribution.load_json(path), load_result(path.read_bytes())):
        assert attr.model == "embedded:SmolLM2-135M-Instruct" and attr.prompt_tokens == ["Paris", " is"]
        assert attr.generated_tokens == [" a", " place"] and set(attr.methods) == methods
        assert attr.methods["macs"].raw.shape == (2, 2) and attr.methods["macs"].raw.dtype == np.float32
        assert attr.methods["macs"].meta["alpha"] == 0.8 and attr.meta["answer"] == "generated"
        assert attr.step_scores["probability"][0] == pytest.approx(0.24285981)


def test_both_old_writers_agree_on_the_shared_scores():
    cli, app = (load_result(DATA / OLD_FILES[w][0]) for w in ("cli", "app"))
    np.testing.assert_array_equal(cli.methods["macs"].raw, app.methods["macs"].raw)  # float64 vs float32 digits


def test_an_old_file_saved_again_is_of_the_current_format_with_the_same_scores(tmp_path):
    old = load_result(DATA / OLD_FILES["cli"][0])
    path = tmp_path / "again.json"
    old.save_json(path)
    assert json.loads(path.read_text())["format_version"] == FORMAT_VERSION
    again = load_result(path)
    for name, scores in old.methods.items():
        assert np.array_equal(scores.raw.view(np.uint32), again.methods[name].raw.view(np.uint32))


def test_the_cli_writes_what_the_app_downloads(tiny_model_dir, tmp_path):
    out = tmp_path / "r.json"
    assert main(["explain", "--model", str(tiny_model_dir), "--prompt", "Paris is", "--max-new-tokens", "3",
                 "--methods", "macs,random", "--json", str(out)]) == 0  # fmt: skip
    text = out.read_text(encoding="utf-8")
    assert result_json(load_result(out)) == text  # the app's download of the same result is the same text
    assert json.loads(text)["format_version"] == FORMAT_VERSION


def test_a_file_of_a_newer_format_is_refused_with_a_reason():
    d = json.loads((DATA / OLD_FILES["app"][0]).read_text())
    d["format_version"] = FORMAT_VERSION + 1
    with pytest.raises(InputError, match=f"format_version is {FORMAT_VERSION + 1}: this file was written by a newer"):
        Attribution.from_dict(d)
    d["format_version"] = "1"
    with pytest.raises(InputError, match="format_version is '1'"):
        Attribution.from_dict(d)


def test_unknown_fields_are_ignored():
    d = json.loads((DATA / OLD_FILES["app"][0]).read_text())
    d["comment"] = "added by hand"
    d["methods"]["macs"]["note"] = 1
    assert set(Attribution.from_dict(d).methods) == {"macs", "rollout"}


def test_a_stream_of_growing_results_writes_the_same_text_with_its_row_cache():
    """The API streams a growing result: with a row cache each update's text is `result_json`'s own, NaN and inf
    scores, per-layer blocks and a method that arrives later included, and an earlier row is not written again."""
    from explainer.result.attribution import MethodScores

    rng = np.random.default_rng(0)
    raw = rng.standard_normal((6, 11)).astype(np.float32)
    raw[1, 2], raw[2, 3] = np.nan, np.inf
    rows: dict[bytes, str] = {}
    for k in range(0, 7):
        methods = {"macs": MethodScores.from_raw(raw[:k]).with_layers(np.stack([raw[:k], 2 * raw[:k]], 1))}
        if k == 6:
            methods["random"] = MethodScores.from_raw(3 * raw)
        attr = Attribution(
            model="m", prompt_token_ids=list(range(11)), prompt_tokens=[f"t{i}" for i in range(11)],
            generated_token_ids=list(range(k)), generated_tokens=[f"g{i}" for i in range(k)], methods=methods,
        )  # fmt: skip
        for layers in (False, True):
            assert result_json(attr, layers, rows=rows) == result_json(attr, layers)
    assert load_result(result_json(attr, rows=rows).encode()).methods["random"].raw.tobytes() == (3 * raw).tobytes()
    assert len(rows) <= 4 * 6 + 2 * 6  # raw, z and two layers of each macs row, raw and z of each random row
