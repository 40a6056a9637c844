"""`ui/guards/uploads.py`, the one gate for files: only uploads of this process and the app's example files are opened;
everything else gets one message. The second half calls every event the built app registers, by `fn_index`
through Gradio's queue as an attacker would, with a server file and a missing file in each file-taking input."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import gradio as gr
import pytest
from PIL import Image

from explainer.errors import InputError
from ui.guards import uploads

from ... import upload_files
from ..served import Server, serve_app

ROOT = Path(__file__).resolve().parents[3]
SERVER_FILE = ROOT / "docs" / "app-text-mode.png"  # a file of the server no visitor uploaded
MISSING = ROOT / "docs" / "no-such-file.png"


def refused(payload) -> str:
    with pytest.raises(InputError) as info:
        uploads.uploaded_path(payload)
    return str(info.value)


def test_an_upload_is_opened_and_every_other_path_gets_the_same_message(tmp_path):
    from gradio.utils import get_upload_folder

    mine = upload_files.uploaded(tmp_path / "up" / "mine.png")
    mine.parent.mkdir()
    Image.new("RGB", (9, 9)).save(mine)
    assert uploads.uploaded_path({"path": str(mine), "orig_name": "mine.png"}) == mine.resolve()
    assert uploads.uploaded_path(mine) == mine.resolve()
    link = tmp_path / "up" / "link.png"
    link.symlink_to(SERVER_FILE)
    gone = upload_files.uploaded(tmp_path / "up" / "gone.png")  # recorded, then deleted (Gradio's cache expiry)
    relative = os.path.relpath(SERVER_FILE)
    tricks = [
        str(SERVER_FILE), str(MISSING), "/etc/passwd", "/root", "/", str(tmp_path), str(mine.parent),
        str(mine) + "/../../../../../../../" + str(SERVER_FILE), f"{mine.parent}/../up/../../../{SERVER_FILE}",
        str(link), str(gone), relative, "", "mine.png", str(mine) + "\x00", "http://127.0.0.1:9/x.png",
        f"file://{mine}", f"{get_upload_folder()}/../{SERVER_FILE}",
    ]  # fmt: skip
    payloads = [*tricks, *({"path": t} for t in tricks), {"path": None}, {"url": None}, {}, {"path": 3},
                {"path": [str(mine)]}, 3, None, [str(mine)], {"path": {"path": str(mine)}}]  # fmt: skip
    assert {refused(p) for p in payloads} == {uploads.REFUSED}
    assert str(SERVER_FILE) not in uploads.REFUSED


def test_opening_a_saved_result_goes_through_the_gate(tmp_path):
    from ui.tabs import text_tab

    for path in (SERVER_FILE, MISSING, ROOT / "tests" / "data" / "result-v0-app.json"):
        with pytest.raises(gr.Error) as info:
            text_tab.open_saved({"path": str(path), "orig_name": "saved.json"}, False, False, "token")
        assert info.value.message == uploads.REFUSED


def test_the_example_images_and_their_copies_in_gradios_cache_are_accepted(tmp_path):
    from gradio.processing_utils import save_file_to_cache
    from gradio.utils import get_upload_folder

    from ui.tabs.image_tab import example_images

    example = example_images()[0]
    uploads.add_examples([example])
    assert uploads.uploaded_path(str(example)) == example.resolve()
    cached = save_file_to_cache(example, get_upload_folder())  # where gr.Examples puts the copy it serves
    assert uploads.uploaded_path({"path": cached}) == Path(cached).resolve()
    assert refused({"path": str(Path(cached).parent)}) == uploads.REFUSED  # its folder is not a file
    assert refused(str(example.parent / "not-an-example.png")) == uploads.REFUSED


# -- every event of the built app, through Gradio's queue ---------------------------------------------------------


@pytest.fixture(scope="module")
def server():
    with serve_app() as served:
        yield served


def _takes_files(block) -> bool:
    """A component whose payload holds a FileData (Image, Gallery, File, an API parameter typed FileData...)."""
    try:
        schema = json.dumps(block.api_info())
    except Exception:  # noqa: BLE001 - a component without an API schema carries no file
        return False
    return '"path"' in schema


def _file_value(block, file: dict) -> object:
    """`file` in the shape of `block`'s payload: a Gallery's is a list of {image, caption}."""
    return [{"image": file, "caption": None}] if block.api_info().get("type") == "array" else file


def _file_inputs(server: Server) -> dict[int, list[int]]:
    return {
        index: positions
        for index, fn in server.demo.fns.items()
        if (positions := [i for i, block in enumerate(fn.inputs) if _takes_files(block)])
    }


def _answer(messages: list[dict]) -> tuple:
    """What the caller learns: each message's kind and output, without the ids and timings of the run."""
    keep = ("msg", "output", "success")
    return tuple(tuple((k, json.dumps(m.get(k), sort_keys=True)) for k in keep if k in m) for m in messages)


def _benign(server: Server, block, picture: str) -> object:
    """A real upload for an Image or File input, nothing for a Gallery (optional), so the attack on another input
    reaches the gate."""
    return None if block.api_info().get("type") == "array" else {"path": picture, "orig_name": "ok.png"}


def test_every_event_with_a_file_input_refuses_server_and_missing_files_alike(server):
    """No event, public or private, opens a file that was not uploaded; a new event with a file input is found
    here by its component's schema and must pass the same checks."""
    found = _file_inputs(server)
    names = {server.demo.fns[i].api_name for i in found}
    assert {"page_explain_image", "open_saved", "explain_image"} <= names  # the known ones, found by schema
    buffer = io.BytesIO()
    Image.new("RGB", (64, 48), (30, 120, 200)).save(buffer, "PNG")
    picture = server.upload("ok.png", buffer.getvalue())
    secret, gated = SERVER_FILE.read_bytes(), set()
    for index, positions in found.items():
        fn = server.demo.fns[index]
        for position in positions:
            block = fn.inputs[position]
            for meta in ({}, {"meta": {"_type": "gradio.FileData"}}):  # a bare dict, and one Gradio checks itself
                answers = []
                for path in (SERVER_FILE, MISSING):
                    data = server.defaults(fn)
                    for other in positions:
                        data[other] = _benign(server, fn.inputs[other], picture)
                    data[position] = _file_value(block, {"path": str(path), "orig_name": path.name, **meta})
                    messages = server.call(index, data)
                    answers.append(_answer(messages))
                    what = f"{fn.api_name} input {position} ({type(block).__name__}) meta={bool(meta)}"
                    final = messages[-1]
                    assert final["msg"] == "process_completed" and final["success"] is False, what
                    assert not any("data" in (m.get("output") or {}) for m in messages), what  # nothing came back
                    # the gate's message, or Gradio's own refusal before the handler runs (it tells nothing: None)
                    assert final["output"]["error"] in (uploads.REFUSED, None), what
                    if final["output"]["error"] == uploads.REFUSED:
                        gated.add(fn.api_name)
                assert answers[0] == answers[1], what  # whether the file exists is not told
                assert secret[:64].hex() not in json.dumps(answers)
    # bare payloads reach these handlers' gate (a gr.File's payload must carry `meta`: Gradio refuses it first)
    assert {"page_explain_image", "explain_image"} <= gated


def test_real_uploads_and_a_clicked_example_pass_the_gate(server):
    fns = {fn.api_name: (index, fn) for index, fn in server.demo.fns.items()}
    index, fn = fns["page_explain_image"]
    uploaded = server.upload("photo.png", SERVER_FILE.read_bytes())  # the same bytes, uploaded: now theirs
    data = server.defaults(fn)
    data[0] = {"path": uploaded, "orig_name": "photo.png", "meta": {"_type": "gradio.FileData"}}
    final = server.call(index, data)[-1]
    assert final["success"] is False and "EXPLAINER_VLM" in final["output"]["error"]  # past the gate, to the model
    example_index, _ = fns["load_example"]
    example = server.call(example_index, [0])[-1]
    assert example["success"], example
    image = example["output"]["data"][0]
    data[0] = image.get("value", image)  # the Image's update: the page sends its value back when asked
    assert Path(data[0]["path"]).parent.parent != ROOT / "assets"  # Gradio's cached copy, not our file
    final = server.call(index, data)[-1]
    assert final["success"] is False and "EXPLAINER_VLM" in final["output"]["error"], final
    open_index, open_fn = fns["open_saved"]
    saved = server.upload("saved.json", (ROOT / "tests" / "data").glob("*.json").__next__().read_bytes())
    data = server.defaults(open_fn)
    data[0] = {"path": saved, "orig_name": "saved.json", "meta": {"_type": "gradio.FileData"}}
    final = server.call(open_index, data)[-1]
    assert final["success"], final
