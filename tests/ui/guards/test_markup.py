"""`ui/guards/markup.py`, the one rule for text from outside, and the handlers that put such text into Markdown, HTML
and toasts: markup in every field of a saved result, in a model's name and in typed input is shown as text, never drawn.

Markdown is rendered here with markdown-it (CommonMark, inline HTML on, GFM tables and strikethrough), as Gradio's
Markdown renders it in the page; the browser test (`tests/browser/test_markup.py`) checks the real page."""

from __future__ import annotations

import asyncio
import html
import re
import uuid

import gradio as gr
import pytest
from markdown_it import MarkdownIt

from explainer.errors import InputError
from ui import models, stream
from ui.guards import uploads
from ui.guards.markup import html_text, markdown_code, markdown_text
from ui.panels import contrast
from ui.tabs import examples, image_tab, text_tab
from visuals.export import result_json

from ... import upload_files
from ...hostile import INJECTED, SINK, drawn_markup, hostile_result, markup
from ..conftest import FakeBundle, collect
from ..served import serve_app

HOSTILE = [
    markup("field"), "<script>alert(1)</script>", "<b>bold</b> & &amp; &lt;", "[link](http://127.0.0.1:9/x)",
    "![img](http://127.0.0.1:9/x.png)", "<http://127.0.0.1:9/auto>", "http://127.0.0.1:9/bare www.example.com",
    "**b** __u__ *e* _e_ ~~s~~ `c` ``c`` $x$ $$y$$", "# heading", "- item", "12. item", "> quote", "a | b\n-|-\nc | d",
    "line\nbreak\r\n\n# next", "back\\slash \\[x\\]", "[ref]: http://127.0.0.1:9/ref", "a@b.example", "\\",
    "<!-- comment -->", "&#60;img&#62;", "name\x00nul", "ütf-8 ✓ 中文 emoji 🙂",
]  # fmt: skip
MD = MarkdownIt("commonmark", {"html": True}).enable(["table", "strikethrough"])


def shown_text(rendered: str) -> str:
    """What a reader sees of rendered HTML: the text, tags removed, entities resolved, runs of spaces as one."""
    return " ".join(html.unescape(re.sub(r"<[^>]*>", "", rendered)).split())


def typed(text: str) -> str:
    """`text` as it shows on one line: line breaks and runs of spaces as one space, NUL as U+FFFD (CommonMark)."""
    return " ".join(text.replace("\x00", "\ufffd").split())


@pytest.mark.parametrize("text", HOSTILE)
def test_markdown_text_draws_nothing_and_shows_the_text_as_typed(text):
    rendered = MD.render(markdown_text(text))
    assert re.findall(r"<(?!/?p>)[a-z!/]", rendered) == []  # no element but the paragraph around it
    assert shown_text(rendered) == typed(text)


@pytest.mark.parametrize("text", HOSTILE)
def test_html_text_and_code_spans_show_the_text_as_typed(text):
    assert "<" not in html_text(text) and html.unescape(html_text(text)) == text
    rendered = MD.render(markdown_code(text))
    code = re.fullmatch(r"<p><code>(.*)</code></p>\n", rendered, re.S)
    assert code and " ".join(html.unescape(code.group(1)).split()) == typed(text)


def _markdown_drawn(text: str) -> list[str]:
    rendered = MD.render(text)
    return drawn_markup(rendered) + re.findall(r"<(?:a|img)\b", rendered)


def _opened(tmp_path):
    path = upload_files.uploaded(tmp_path / "saved.json")
    path.write_text(result_json(hostile_result()))
    name = markup("file") + ".json"  # the visitor's own file name, as the upload payload carries it
    return text_tab.open_saved({"path": str(path), "orig_name": name}, False, False, "token")


def test_opening_a_saved_result_with_markup_in_every_field_draws_none_of_it(fake, tmp_path):
    opened = _opened(tmp_path)
    assert _markdown_drawn(opened.status) == []
    seen = shown_text(MD.render(opened.status))
    for field in ("file", "model", "method"):  # shown as written
        assert typed(markup(field)) in seen
    for view in (opened.answer, opened.heatmap):  # gr.HTML
        assert drawn_markup(view) == [] and INJECTED in html.unescape(view)
    for span in [(1, False, False, None, "token"), (2, True, True, 3, "sentence"), (3, False, False, None, "word")]:
        view = text_tab.render(opened.result, list(opened.result.methods), *span)
        assert drawn_markup(view.answer) == [] and drawn_markup(view.heatmap) == []
    assert opened.methods["value"] == ["macs", markup("method")]  # a CheckboxGroup's labels are text, not HTML


def test_status_lines_of_a_result_escape_its_fields():
    attr = hostile_result()
    for line in (stream.status_line(attr, True), stream.status_line(attr, False), examples.saved_status(attr, "x")):
        assert _markdown_drawn(line) == [], line
    assert typed(markup("status")) in shown_text(MD.render(stream.status_line(attr, True)))
    assert typed(markup("method")) in shown_text(MD.render(stream.status_line(attr, False)))
    assert typed(markup("model")) in shown_text(MD.render(examples.saved_status(attr, markup("label"))))


def test_model_lines_escape_the_models_names(fake, monkeypatch):
    monkeypatch.setattr(models, "model_ids", lambda: (markup("text-model"), markup("vlm")))
    for line in (models.model_info(), models.vlm_info()):
        assert _markdown_drawn(line) == [] and SINK in shown_text(MD.render(line))


def test_a_stopped_requests_note_escapes_the_error_message():
    def start(cancel):
        raise InputError(markup("error"))

    updates = []

    async def collect_until_error():
        async for update in stream.run_stream(FakeBundle(), start, "none"):
            updates.append(update)

    with pytest.raises(InputError):
        asyncio.run(collect_until_error())
    note = [u.note for u in updates if u.note][-1]  # the last: why it stopped
    assert _markdown_drawn(note) == [] and typed(markup("error")) in shown_text(MD.render(note))


def _finished():
    attr = hostile_result()
    attr.meta["status"] = "done"
    return attr


def test_toasts_quote_typed_foils_and_file_names_as_text(fake, tmp_path):
    with pytest.raises(gr.Error) as foil:  # a dropdown value sent by hand, quoted in the message
        collect(contrast.explain_contrast("p", ["atman"], True, False, "token", _finished(), 1, markup("foil"), None))
    with pytest.raises(gr.Error) as refused:
        text_tab.open_saved({"path": markup("path")}, False, False, "token")
    assert refused.value.message == uploads.REFUSED
    broken = upload_files.write(tmp_path, "notes.png")
    with pytest.raises(gr.Error) as named:  # the message names the image by the visitor's file name
        payload = {"path": str(broken), "orig_name": markup("name")}
        collect(image_tab.explain_image(payload, "?", ["macs"], 4, 0.5, True))
    for message in (foil.value.message, named.value.message):
        assert drawn_markup(message) == [] and "<" not in message and INJECTED in html.unescape(message)


def _values(update) -> list:
    """The text an output carries: a value, or an update's value and its choices' labels."""
    if isinstance(update, dict) and update.get("__type__") == "update":
        labels = [c[0] if isinstance(c, list | tuple) else c for c in update.get("choices") or []]
        return [update.get("value"), *labels]
    return [update]


def test_every_event_in_a_session_holding_markup_draws_none_of_it(monkeypatch):
    """Every event the app registers, called through Gradio's queue in one visitor's session that opened a saved
    result with markup in every field, with markup in every text box and a model whose loading fails with markup in
    its message: no Markdown, HTML or error toast it returns draws any of it. A new event is covered as it is
    registered."""

    def no_model(*_, **__):
        raise InputError(markup("load-error"))

    monkeypatch.setattr(models, "get_bundle", no_model)
    monkeypatch.setattr(models, "get_vl_bundle", no_model)
    attr = _finished()
    with serve_app() as server:
        session = uuid.uuid4().hex
        fns = {fn.api_name: (index, fn) for index, fn in server.demo.fns.items()}
        index, fn = fns["open_saved"]
        data = server.defaults(fn)
        saved = server.upload("saved.json", result_json(attr).encode())
        data[0] = {"path": saved, "orig_name": "saved.json", "meta": {"_type": "gradio.FileData"}}
        opened = server.call(index, data, session)[-1]
        assert opened["success"], opened
        status = fn.outputs.index(next(b for b in fn.outputs if isinstance(b, gr.Markdown)))
        assert drawn_markup(MD.render(opened["output"]["data"][status])) == []
        shown = [shown_text(MD.render(opened["output"]["data"][status]))]
        for index, fn in server.demo.fns.items():
            if fn.fn is None:
                continue
            data = server.defaults(fn)
            for i, block in enumerate(fn.inputs):
                if isinstance(block, gr.Textbox) or (type(block).__name__ == "Api" and isinstance(data[i], str)):
                    data[i] = markup(f"box{i}")
            final = server.call(index, data, session)[-1]
            what = f"{fn.api_name} ({index})"
            if not final["success"]:
                error = final["output"].get("error") or ""
                assert "<" not in error and drawn_markup(error) == [], what
                shown.append(html.unescape(error))
                continue
            for block, update in zip(fn.outputs, final["output"]["data"]):
                for value in _values(update):
                    if isinstance(block, gr.Markdown) and isinstance(value, str):
                        assert drawn_markup(MD.render(value)) == [], (what, value)  # (the app's own links are fine)
                        shown.append(shown_text(MD.render(value)))
                    elif isinstance(block, gr.HTML) and isinstance(value, str):
                        assert drawn_markup(value) == [], what
                        shown.append(html.unescape(value))
    seen = "\n".join(shown)
    for field in ("model", "method", "load-error"):  # the markup reached the outputs, as text
        assert f'id="{INJECTED}-{field}-img"' in seen, field
