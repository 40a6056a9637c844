"""The app's public API (`ui/api.py`): a few named endpoints with named parameters, the page's own events private,
the endpoints on the tabs' request path; and the README's `gradio_client` call, run against the app."""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path

import gradio as gr
import numpy as np
import pytest

from explainer.result.attribution import Attribution, MethodScores, load_result, result_json
from ui import api, options, requests
from ui.guards import uploads
from visuals import top_tokens_rows

from .. import upload_files
from .conftest import collect, image_attr

ROOT = Path(__file__).resolve().parents[2]
PUBLIC = {"explain", "explain_image", "contrast", "faithfulness", "open_result", "model_info", "vlm_info"}


@pytest.fixture(scope="module")
def demo():
    import app

    return app.demo


def test_the_public_api_is_a_few_named_endpoints_with_named_parameters(demo):
    info = demo.get_api_info()
    named = info["named_endpoints"]
    assert {name.lstrip("/") for name in named} == PUBLIC and len(named) <= 12
    assert not info.get("unnamed_endpoints")
    for name, endpoint in named.items():
        names = [p["parameter_name"] for p in endpoint["parameters"]]
        assert not any(re.fullmatch(r"param_\d+", n) for n in names), (name, names)
    explain = [p["parameter_name"] for p in named["/explain"]["parameters"]]
    assert explain == ["prompt", "methods", "max_new_tokens", "chat_template", "answer", "method_options"]
    assert named["/explain"]["returns"][0]["python_type"]["type"] == "str"  # the saved-result JSON text


def test_every_event_of_the_page_is_private(demo):
    events = {fn.api_name: fn for fn in demo.fns.values()}
    public = {name for name, fn in events.items() if fn.api_visibility == "public" and fn.fn is not None}
    assert public == PUBLIC, public ^ PUBLIC
    undocumented = {name for name, fn in events.items() if fn.api_visibility == "undocumented"}
    assert undocumented <= {"load_example"}  # gr.Examples' own (image tab): fills the inputs, runs nothing
    assert {"page_explain", "after_explain", "export_view_after_open", "render", "estimate"} <= set(events)


def test_each_model_endpoint_queues_with_the_pages_event_of_the_same_request(demo):
    events = {fn.api_name: fn for fn in demo.fns.values()}
    for public, page in [("explain", "page_explain"), ("explain_image", "page_explain_image"),
                         ("contrast", "explain_contrast"), ("faithfulness", "page_faithfulness")]:  # fmt: skip
        assert events[public].concurrency_id == events[page].concurrency_id, public
        assert events[public].concurrency_limit == events[page].concurrency_limit, public
        assert getattr(events[public].fn, "maps_library_errors", False)


def test_explain_builds_the_text_tabs_request_and_returns_the_saved_json(fake):
    streamed = collect(api.explain("Where is Paris?", ["macs"], 3, method_options={"macs": {"alpha": 0.5}}))
    grown = [load_result(s.encode()) for s in streamed]  # the growing result, the complete one last
    assert [a.num_steps for a in grown] == sorted(a.num_steps for a in grown)
    attr = grown[-1]
    assert attr.num_steps == 3  # the last streamed result is the whole answer
    assert list(attr.methods) == ["macs"] and attr.generated_tokens == [" It", " is", " Paris"]
    widgets = [0.5 if key == ("macs", "alpha") else None for key in options.option_keys()]
    page = requests.text_request("Where is Paris?", ["macs"], 3, True, False, None, False, "token", *widgets)
    assert fake.calls[-1]["request"] == page  # the page's widgets and the API's object make the same request
    collect(api.explain("Where is Paris?", max_new_tokens=2))
    assert fake.calls[-1]["methods"] == options.DEFAULT_METHODS


@pytest.mark.parametrize(
    "kwargs, message",
    [({"method_options": {"macs": {"alpha": 7}}}, "alpha"), ({"methods": ["nope"]}, "nope"),
     ({"method_options": ["macs"]}, "method_options"), ({"max_new_tokens": 10_000}, "Max new tokens"),
     ({"max_new_tokens": 2.5}, "Max new tokens must be a whole number between 1 and 256, got 2.5")],
)  # fmt: skip
def test_explain_refuses_bad_values_with_the_librarys_message(fake, kwargs, message):
    with pytest.raises(gr.Error, match=message):
        collect(api.endpoint(api.explain, None)("Where is Paris?", **kwargs))
    assert fake.calls == []


def test_contrast_teacher_forces_the_answer_with_one_contrastive_step(fake):
    collect(api.contrast("Where is Paris?", "It is Paris", 3, " Lyon"))
    call = fake.calls[-1]
    assert call["answer"] == "It is Paris" and call["contrast"] == {2: " Lyon"} and call["methods"] == ["atman"]
    with pytest.raises(gr.Error, match="Give the answer"):
        collect(api.endpoint(api.contrast, None)("Where is Paris?", "  ", 1, " Lyon"))


def test_explain_image_opens_only_files_gradio_received(vl_fake, tmp_path):
    from PIL import Image

    path = tmp_path / "red.png"
    Image.new("RGB", (32, 32), "red").save(path)
    handler = api.endpoint(api.explain_image, None)
    for sent in (str(path), {"path": str(path), "meta": {"_type": "gradio.FileData"}}):  # a file never uploaded
        with pytest.raises(gr.Error, match=re.escape(uploads.REFUSED)) as refused:
            collect(handler(sent))
        assert "handle_file" in str(refused.value)  # the message says how to send a file
    upload_files.uploaded(path)  # as Gradio's /upload route records it
    collect(handler({"path": str(path), "meta": {"_type": "gradio.FileData"}}))
    assert vl_fake.calls[-1]["image"].getpixel((0, 0)) == (255, 0, 0)
    *_, saved = collect(api.explain_image(Image.open(path), "What is it?", ["macs"], 3))
    assert load_result(saved.encode()).image is not None and vl_fake.calls[-1]["prompt"] == "What is it?"


def _saved(k: int = 3) -> Attribution:
    raw = np.random.default_rng(1).random((k, 6)).astype(np.float32)  # (K, N)
    return Attribution(
        model="fake-tiny", prompt_token_ids=list(range(6)), prompt_tokens=["<s>", " a", " b", " c", " d", "</s>"],
        generated_token_ids=list(range(k)), generated_tokens=[" x", " y", " z"][:k], user_positions=[1, 2, 3, 4],
        methods={"macs": MethodScores.from_raw(raw), "rollout": MethodScores.from_raw(raw[:, ::-1].copy())},
    )  # fmt: skip


def test_open_result_gives_the_pages_top_tokens_without_a_model(fake):
    attr = _saved()
    out = api.open_result(result_json(attr), step=2, top_k=2)
    assert out["answer"] == " x y z" and out["steps"] == 3 and out["step"] == 2 and out["token"] == " y"
    for method in ("macs", "rollout"):
        rows = top_tokens_rows(attr, method, 1, 2)
        assert [list(row.values()) for row in out["top_tokens"][method]] == rows
    assert api.open_result(result_json(attr))["step"] == 3  # the last by default
    json.dumps(out)  # plain data
    assert fake.loads == 0


@pytest.mark.parametrize("sent", ["", "{not json"])
def test_open_result_calls_the_text_it_was_sent_text(fake, sent):
    with pytest.raises(gr.Error) as refused:
        api.endpoint(api.open_result, None)(sent)
    message = str(refused.value)
    assert "result text" in message and "uploaded" not in message and "file " not in message.split(";")[0]


def test_a_whole_number_given_as_a_float_is_taken(fake):
    collect(api.explain("Where is Paris?", ["macs"], 3.0))
    assert fake.calls[-1]["max_new_tokens"] == 3


def test_faithfulness_measures_text_results_of_the_apps_model_only(fake):
    handler = api.endpoint(api.faithfulness, None)
    image = result_json(image_attr(2, ["macs"]))
    with pytest.raises(gr.Error, match="image tab"):
        collect(handler(image))
    with pytest.raises(gr.Error, match="fake-tiny"):
        collect(handler(result_json(_saved()).replace("fake-tiny", "other-model")))
    assert api._faithfulness_seconds("not json") >= 1  # the GPU duration of a refused request: the minimum


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def readme_api_block() -> str:
    """The README's `gradio_client` code block."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(encoding="utf-8"), re.S)
    (block,) = [b for b in blocks if "gradio_client" in b]
    return block


def test_the_readmes_gradio_client_call_runs_against_the_app(demo, monkeypatch):
    from ui import models

    monkeypatch.setattr(models, "model_ids", lambda: (None, None))  # the embedded model, offline
    block = readme_api_block()
    assert 'Client("http://127.0.0.1:7860/")' in block
    port = _free_port()
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    try:
        scope: dict = {}
        exec(block.replace("http://127.0.0.1:7860/", f"http://127.0.0.1:{port}/"), scope)  # noqa: S102
    finally:
        demo.close()
    attr = load_result(scope["saved"].encode())
    assert attr.num_steps >= 1 and {"macs", "rollout"} <= set(attr.methods)
    assert scope["top"]["step"] == 1 and set(scope["top"]["top_tokens"]) == set(attr.methods)


def test_explain_then_faithfulness_on_the_embedded_model(monkeypatch):
    from ui import models

    monkeypatch.setattr(models, "model_ids", lambda: (None, None))  # the embedded model, offline
    *_, saved = collect(api.endpoint(api.explain, None)("Who wrote Hamlet?", ["macs"], 3))
    (report,) = collect(api.endpoint(api.faithfulness, None)(saved, ["macs"]))
    json.dumps(report)  # plain data, as the client receives it
    assert report["methods"] == ["macs"] and report["soft"] is None
    assert {"fractions", "curves", "auc"} <= set(report["removal"]) and '"macs"' in json.dumps(report["removal"]["auc"])
