"""The examples' saved results (`assets/examples.json`, `ui/tabs/examples.py`): each matches its prompt and the current
file format and opens without a model; a clicked example and the first page view show one at once."""

from __future__ import annotations

import inspect
import json

import pytest

from explainer.models.loading import EMBEDDED_MODEL, load_model
from explainer.result.attribution import Attribution, MethodScores
from explainer.result.schema import FORMAT_VERSION
from ui import models
from ui.tabs import examples, text_tab

SHOWN = examples.examples()


@pytest.fixture(scope="module")
def embedded():
    return load_model(dtype="float32")  # the model the saved results come from (scripts/make_examples.py)


def test_every_example_has_a_small_saved_result_in_the_current_format():
    assert SHOWN and all(e["label"].strip() and e["prompt"].strip() for e in SHOWN)
    for example in SHOWN:
        path = examples.ROOT / example["result"]
        assert path.is_file() and path.stat().st_size < 1_000_000, example["result"]
        data = json.loads(path.read_text(encoding="utf-8"))
        assert data["format_version"] == FORMAT_VERSION, example["result"]
        assert data["meta"]["saved"]["prompt"] == example["prompt"]
        assert data["model"] == EMBEDDED_MODEL and data["meta"]["dtype"] == "float32"


@pytest.mark.parametrize("example", SHOWN, ids=[e["label"] for e in SHOWN])
def test_each_saved_result_is_its_examples_prompt_on_the_embedded_model(embedded, example):
    attr = examples.saved_result(example)
    encoded = embedded.encode(example["prompt"], chat_template=attr.meta["chat_template"])
    assert encoded.input_ids[0].tolist() == attr.prompt_token_ids
    assert attr.generated_tokens == embedded.readable(attr.generated_token_ids)
    assert {"macs", "rollout"} <= set(attr.methods) and attr.num_steps >= 1



def test_a_clicked_example_shows_its_saved_result_at_once_without_a_model(no_model):
    for i, example in enumerate(SHOWN):
        view = text_tab.open_example(i, ["macs", "atman"], False)
        attr = view.result
        assert isinstance(attr, Attribution) and view.prompt == example["prompt"]
        assert view.methods["value"] == ["macs", "atman"] and 'data-method="atman"' in view.heatmap
        assert view.status.startswith(f"Saved result of the example “{example['label']}”")
        assert f"by {attr.model} in float32, made {attr.meta['saved']['date']}" in view.status
        assert "press **Generate** to run it live" in view.status
        assert not view.status.startswith("Done:")  # the browser tests wait for "Done: …" after Generate
    assert models.loaded_models() == 0


def test_the_first_page_view_is_the_first_examples_saved_result_then_the_model_line(no_model):
    import app
    from ui.tabs import share

    first = share.first_view(["macs", "rollout"], False, False, "token", None)
    assert first.prompt == SHOWN[0]["prompt"] and first.methods["value"] == ["macs", "rollout"]
    assert first.result.prompt_token_ids == examples.saved_result(SHOWN[0]).prompt_token_ids
    fns = {fn.api_name: fn for fn in app.demo.fns.values()}
    load = fns["first_view"]
    assert [t[1] for t in load.targets] == ["load"] and inspect.unwrap(load.fn) is inspect.unwrap(share.first_view)
    assert fns["model_info"].trigger_after == load._id  # the model line is filled once the example is shown
    assert fns["open_example"].targets[0][1] == "click"
    assert models.loaded_models() == 0


def test_saved_timings_are_shown_and_do_not_correct_this_machines_estimates():
    for example in SHOWN:
        raw = json.loads((examples.ROOT / example["result"]).read_text(encoding="utf-8"))
        assert any(m["seconds"] > 0 for m in raw["methods"].values())  # the file keeps what it took there
        attr = examples.saved_result(example)
        assert {m: s.seconds for m, s in attr.methods.items()} == {m: v["seconds"] for m, v in raw["methods"].items()}
        assert attr.opened  # `estimate.calibrate` skips an opened file's timings
    first = text_tab.open_example(0, ["macs", "rollout"], False)
    raw = json.loads((examples.ROOT / SHOWN[0]["result"]).read_text(encoding="utf-8"))
    assert f"· {raw['methods']['macs']['seconds']:.2f} s" in first.heatmap and "· 0.00 s" not in first.heatmap


def test_shown_methods_are_the_ticked_ones_the_result_has_else_the_defaults():
    attr = Attribution(model="m", prompt_token_ids=[1], prompt_tokens=["a"])
    attr.methods = {m: MethodScores.from_raw([[0.0]]) for m in ("macs", "rollout", "atman")}
    assert examples.shown_methods(attr, ["atman", "input_x_gradient"], ["macs", "rollout"]) == ["atman"]
    assert examples.shown_methods(attr, ["input_x_gradient"], ["macs", "rollout"]) == ["macs", "rollout"]
    assert examples.shown_methods(attr, [], ["grad_ellm"]) == ["macs"]


def test_an_example_out_of_range_changes_nothing_and_image_examples_say_they_run_live():
    assert text_tab.open_example(len(SHOWN), ["macs"], False) == text_tab.TextView()
    assert "run live" in examples.IMAGE_EXAMPLES_LABEL and "random" in examples.IMAGE_EXAMPLES_LABEL
