"""The image tab's handlers with a fake vision-language model: uploads, overlays, re-rendering, exports."""

from __future__ import annotations

import base64
import re

import gradio as gr
import gradio.utils as gradio_utils
import numpy as np
import pytest
from PIL import Image

from ui import models, requests, stream
from ui.events import KEEP
from ui.guards import inputs, uploads
from ui.stream import Phase, RequestState
from ui.tabs import image_tab
from ui.tabs.image_tab import ImageResult
from visuals.export import png_bytes
from visuals.overlay import gif_bytes
from visuals.png import view_png

from ... import upload_files
from ..conftest import collect, first_then_close

NOT_NUMBERS = [float("nan"), float("inf"), "many"]


def selected_steps(fragment: str) -> list[str]:
    return re.findall(r'data-step="(\d+)" data-selected', fragment)


def shown_tokens(fragment: str) -> int:
    return sum(
        int(hi or lo) - int(lo) + 1
        for flow in re.findall(r'class="xai-flow" data-pos="([^"]*)"', fragment)
        for lo, _, hi in (part.partition("-") for part in filter(None, flow.split(",")))
    )


def asked(path, *args, new=3, answer=None) -> list[image_tab.ImageView]:
    return collect(image_tab.explain_image(str(path), "What?", ["macs"], new, 0.5, True, 64, answer, None, *args))


def test_image_tab_without_a_vision_model_says_how_to_set_one(fake, monkeypatch):
    monkeypatch.setattr(models, "model_ids", lambda: (None, None))
    assert "EXPLAINER_VLM" in models.vlm_info() and models.NO_VLM in models.vlm_info()
    with pytest.raises(gr.Error, match="EXPLAINER_VLM"):
        collect(image_tab.explain_image(Image.new("RGB", (45, 31)), "What?", ["macs"], 4, 0.5, True))
    assert fake.loads == 0 and fake.calls == []
    empty = image_tab.render_image(None, ["macs"], 1, 0.5, True)
    assert empty.overlay is None and empty.answer == "" and empty.question == image_tab.EMPTY_QUESTION


def test_without_a_vision_model_the_tab_is_one_readable_line(fake, monkeypatch):
    """Offline (no VLM), the tab shows only its model line, which says how to turn image questions on: no upload
    box, Ask button or example images (they are in the body the first view hides), and no angle brackets, which the
    page's Markdown read as a tag that cut the line at "EXPLAINER_VLM="."""
    import app

    monkeypatch.setattr(models, "model_ids", lambda: (None, None))
    assert image_tab.shown_controls().body == {"visible": False, "__type__": "update"}
    assert "<" not in models.NO_VLM and ">" not in models.NO_VLM
    assert "set to a Hub id or a local folder" in models.NO_VLM and "EXPLAINER_VLM=" in models.NO_VLM
    monkeypatch.setattr(models, "model_ids", lambda: (None, "my-vlm"))
    assert image_tab.shown_controls().body == {"visible": True, "__type__": "update"}
    fns = {fn.api_name: fn for fn in app.demo.fns.values()}
    load = fns["image_controls"]
    (body,) = load.outputs
    assert [t[1] for t in load.targets] == ["load"] and isinstance(body, gr.Column) and not body.visible

    def inside(block):
        for child in getattr(block, "children", []):
            yield child
            yield from inside(child)

    held = list(inside(body))
    assert any(isinstance(b, gr.Image) and b.interactive is not False for b in held)  # the upload box
    assert any(isinstance(b, gr.Button) and b.value == "Ask about the image" for b in held)
    assert any(isinstance(b, gr.Dataset) for b in held)  # the example images
    assert any(getattr(b, "elem_id", None) == "image-macs-layers" for b in held)  # and the tab's panels


def test_image_questions_stream_overlays_and_rerender_from_state(vl_fake, tmp_path):
    assert "fake-vlm" in models.vlm_info()
    path = upload_files.uploaded(tmp_path / "blue.png")
    Image.new("RGB", (45, 31), (40, 90, 200)).save(path)
    outs = collect(image_tab.explain_image(str(path), "What?", ["macs", "random"], 3, 0.5, True, 64))
    image = vl_fake.calls[0]["image"]  # the library gets the image our loader opened, not the path
    assert outs[0] == image_tab.ImageView(status=stream.STARTING, request=RequestState(Phase.STARTING))
    assert len(outs) == 5 and isinstance(image, Image.Image) and image.mode == "RGB" and image.size == (45, 31)
    assert image.getpixel((3, 3)) == (40, 90, 200) and vl_fake.calls[0]["prompt"] == "What?"
    assert vl_fake.calls[0]["max_image_tokens"] == 64  # the "image detail" slider reaches the library
    last = outs[-1]
    assert isinstance(last.overlay, Image.Image) and last.overlay.height == 31 + 18 and last.overlay.width > 2 * 45
    # the answer " It is Paris" has no end token: it opens on its last token
    assert last.step["interactive"] is True and last.step["value"] == 3 and last.status.startswith("Done: 3 tokens")
    assert 'data-method="macs"' in last.question and shown_tokens(last.question) == 2 * 2  # the question only
    assert last.result == ImageResult(last.result.attr, image, "What?", 64)  # the loaded image, question and budget
    gradio_utils.deep_hash(last.result)  # how Gradio tells whether the State changed: must not raise
    assert last.request == RequestState(Phase.DONE) and last.gif_file is KEEP
    path.unlink()  # re-rendering never reads the file again
    again = image_tab.render_image(last.result, ["macs"], 1, 0.2, False)
    assert again.overlay.width == 45 and len(vl_fake.calls) == 1 and again.step is KEEP
    with pytest.raises(gr.Error, match="Upload an image"):
        collect(image_tab.explain_image(None, "What?", ["macs"], 3, 0.5, True))


@pytest.mark.parametrize("name", sorted(upload_files.BROKEN))
def test_a_broken_upload_gets_a_one_line_message_naming_the_file(vl_fake, tmp_path, name):
    path = upload_files.write(tmp_path, name)
    gone = not path.exists()  # an upload that vanished: the gate's answer, as for any path it does not know
    with pytest.raises(gr.Error, match=re.escape(uploads.REFUSED) if gone else upload_files.BROKEN[name][1]) as info:
        asked(path, new=4)
    message = info.value.message
    assert "\n" not in message and str(tmp_path) not in message
    assert message == uploads.REFUSED if gone else message.startswith(f"Image {name!r}")
    assert vl_fake.calls == []  # refused before the model is asked


@pytest.mark.parametrize("name", sorted(upload_files.ODD))
def test_odd_formats_reach_the_library_as_rgb(vl_fake, tmp_path, name):
    outs = asked(upload_files.write(tmp_path, name))
    image = vl_fake.calls[-1]["image"]
    _, _, pixel, tolerance = upload_files.ODD[name]
    assert image.mode == "RGB" and image.size == (20, 12)
    np.testing.assert_allclose(image.getpixel((0, 0)), pixel, atol=tolerance)
    assert outs[-1].result.image is image and image_tab.render_image(outs[-1].result, ["macs"], 2, 0.5, True).overlay


def test_example_images_still_work(vl_fake):
    examples = image_tab.example_images()
    assert examples
    uploads.add_examples(examples)  # what building the tab's gr.Examples does (the app's test clicks them for real)
    for path in examples:
        collect(image_tab.explain_image(str(path), image_tab.DEFAULT_QUESTION, ["macs"], 2, 0.5, True, 64))
        assert vl_fake.calls[-1]["image"].size == (224, 160)


def test_the_raw_upload_payload_is_opened_by_the_handler(vl_fake, tmp_path):
    broken = upload_files.write(tmp_path, "notes.png")
    payload = {"path": str(broken), "orig_name": "notes.png", "url": None}  # what the event hands over unopened
    with pytest.raises(gr.Error, match="Image 'notes.png' is not an image file"):
        collect(image_tab.explain_image(payload, "What?", ["macs"], 4, 0.5, True, 64))
    png = upload_files.write(tmp_path, "bilevel.png").read_bytes()
    inline = {"path": None, "url": "data:image/png;base64," + base64.b64encode(png).decode()}
    collect(image_tab.explain_image(inline, "What?", ["macs"], 4, 0.5, True, 64))
    assert vl_fake.calls[-1]["image"].size == (20, 12)
    with pytest.raises(gr.Error, match="not valid base64"):
        collect(image_tab.explain_image({"url": "data:image/png;base64,&&&"}, "What?", ["macs"], 4, 0.5, True, 64))
    with pytest.raises(gr.Error, match=re.escape(uploads.REFUSED)):  # a payload without a file: the gate's answer
        collect(image_tab.explain_image({"path": None, "url": None}, "What?", ["macs"], 4, 0.5, True, 64))
    assert requests.open_image(str(tmp_path / "bilevel.png")).size == (20, 12)


@pytest.mark.parametrize(
    "new, detail, message",
    [(v, 64, "Max new tokens must") for v in [0, -1, 129, 10**6, *NOT_NUMBERS, None]]
    + [(4, v, "Image detail must") for v in [0, 15, 1025, 10**6, *NOT_NUMBERS]],
)
def test_image_sliders_past_their_bounds_are_clear_errors(vl_fake, tmp_path, new, detail, message):
    path = upload_files.write(tmp_path, "bilevel.png")
    with pytest.raises(gr.Error, match=message):
        collect(image_tab.explain_image(str(path), "What?", ["macs"], new, 0.5, True, detail))
    assert vl_fake.calls == []


def test_sliders_at_their_bounds_work(vl_fake, tmp_path):
    path = upload_files.write(tmp_path, "bilevel.png")
    for new, detail in zip(inputs.IMAGE_NEW_TOKENS, inputs.IMAGE_TOKENS):
        collect(image_tab.explain_image(str(path), "What?", ["macs"], new, 0.5, True, detail))
        assert vl_fake.calls[-1]["max_image_tokens"] == detail


@pytest.mark.parametrize("step, shown", [(0, "0"), (-5, "0"), (2, "1"), (3, "2"), (10**6, "2"), (None, "2")])
def test_steps_past_the_slider_are_clamped_and_opacity_too(vl_fake, tmp_path, step, shown):
    state = asked(upload_files.write(tmp_path, "bilevel.png"))[-1].result  # 3 steps
    assert selected_steps(image_tab.render_image(state, ["macs"], step, 0.5, True).answer) == [shown]
    for opacity in (-1, 0, 1, 5):
        assert image_tab.render_image(state, ["macs"], step, opacity, True).overlay.size == (20, 12 + 18)


@pytest.mark.parametrize("value", NOT_NUMBERS)
def test_steps_and_opacity_that_are_not_numbers_are_clear_errors(vl_fake, tmp_path, value):
    path = upload_files.write(tmp_path, "bilevel.png")
    state = asked(path)[-1].result
    with pytest.raises(gr.Error, match="generation step must"):
        image_tab.render_image(state, ["macs"], value, 0.5, True)
    with pytest.raises(gr.Error, match="Overlay opacity must"):
        image_tab.render_image(state, ["macs"], 2, value, True)
    with pytest.raises(gr.Error, match="Overlay opacity must"):
        collect(image_tab.explain_image(str(path), "What?", ["macs"], 3, value, True, 64))


def test_a_stopped_question_gets_its_status_after_it_stops(vl_fake, tmp_path):
    path = upload_files.write(tmp_path, "bilevel.png")
    views = first_then_close(image_tab.explain_image(str(path), "What?", ["macs"], 3, 0.5, True, 64), 3)
    after = image_tab.after_image(views[-1].result, views[-1].request, ["macs"], 0.5, True)
    assert after.status.startswith("Stopped after 2 tokens (cancelled)") and after.step["value"] == 2
    assert selected_steps(after.answer) == ["1"] and after.overlay is not None  # the views follow the slider
    assert after.request.phase is Phase.CANCELLED
    waited = image_tab.after_image(None, RequestState(Phase.WAITING))
    assert waited.status.startswith("Stopped before it started") and waited.step is KEEP
    assert image_tab.after_image(None, RequestState(Phase.STARTING)).status.startswith("Stopped before the first")
    assert image_tab.after_image(views[-1].result, RequestState(Phase.DONE)) == image_tab.ImageView()


def _file(update: dict) -> bytes:
    assert update["interactive"] is True
    return open(update["value"], "rb").read()


def test_image_exports_add_the_gif_and_the_overlays(vl_fake, tmp_path):
    state = asked(upload_files.write(tmp_path, "bilevel.png"), answer="A dog")[-1].result
    assert vl_fake.calls[-1]["answer"] == "A dog" and vl_fake.calls[-1]["max_new_tokens"] == len(b"A dog") + 1
    files = image_tab.export_image_files(state, ["macs"], 0.4, True)
    gif = _file(files.gif_file)
    assert gif[:6] == b"GIF89a" and gif == gif_bytes(state.image, state.attr, ["macs"], 0.4, 10)
    assert "xai-image" in _file(files.report_file).decode() and _file(files.json_file).startswith(b"{")
    png = _file(image_tab.export_image_view(state, ["macs"], 2, 0.4).png_file)
    assert png == png_bytes(view_png(state.attr, ["macs"], 1, image=state.image, alpha=0.4))
    off = image_tab.export_image_files(None, ["macs"], 0.5, True)
    assert all(getattr(off, name)["value"] is None for name in ("json_file", "report_file", "gif_file"))
    assert all(getattr(image_tab.clear_downloads(), name)["value"] is None for name in image_tab.FILES)


def test_more_images_from_the_gallery_follow_the_first(vl_fake, tmp_path):
    paths = [upload_files.uploaded(tmp_path / "a.png"), upload_files.uploaded(tmp_path / "b.png")]
    Image.new("RGB", (45, 31), (40, 90, 200)).save(paths[0])
    Image.new("RGB", (20, 10), (200, 30, 30)).save(paths[1])
    gallery = [{"image": {"path": str(paths[1]), "orig_name": "b.png"}, "caption": None}]  # the gallery's raw payload
    outs = collect(image_tab.explain_image(str(paths[0]), "What?", ["macs"], 3, 0.5, True, 64, None, gallery))
    given = vl_fake.calls[0]["image"]
    assert [img.size for img in given] == [(45, 31), (20, 10)] and given[1].getpixel((0, 0)) == (200, 30, 30)
    last = outs[-1]
    assert last.result.images == given and len(last.result.attr.images) == 2
    assert last.overlay.height > 2 * 18 + 31  # a row of overlays per image
    assert requests.open_images(str(paths[0]), []).size == (45, 31)  # an empty gallery: one image, not a list
    with pytest.raises(gr.Error, match=re.escape(uploads.REFUSED)):  # a gallery item never uploaded: the gate
        collect(image_tab.explain_image(str(paths[0]), "What?", ["macs"], 3, 0.5, True, 64, None, [{"path": "/nope"}]))
