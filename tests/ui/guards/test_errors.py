"""The one decorator that turns the library's typed errors into `gr.Error`, for every kind of handler."""

from __future__ import annotations

import asyncio
import html
import inspect
import json
import subprocess
import sys
from pathlib import Path

import gradio as gr
import pytest

from explainer.errors import InputError, UnknownMethodError
from ui.guards.errors import user_errors, wrap_handler


@user_errors
def plain(x: int, progress: gr.Progress = gr.Progress()) -> int:  # noqa: B008
    """Doc."""
    if x < 0:
        raise InputError("x must not be negative")
    if x == 0:
        raise ValueError("a bug, not the visitor's doing")
    return x


@user_errors
async def coroutine(x: int) -> int:
    if x < 0:
        raise UnknownMethodError("No method 'x'; valid: macs")
    return x


closed = []


@user_errors
def generator(n: int):
    try:
        yield from range(n)
        raise InputError("ran out")
    finally:
        closed.append("generator")


@user_errors
async def agenerator(n: int):
    try:
        for i in range(n):
            yield i
        raise InputError("ran out")
    finally:
        closed.append("agenerator")


def test_each_kind_keeps_its_kind_name_and_signature():
    assert inspect.signature(plain) == inspect.signature(inspect.unwrap(plain)) and plain.__doc__ == "Doc."
    assert not inspect.isgeneratorfunction(plain) and inspect.iscoroutinefunction(coroutine)
    assert inspect.isgeneratorfunction(generator) and inspect.isasyncgenfunction(agenerator)
    assert all(f.maps_library_errors for f in (plain, coroutine, generator, agenerator))


def test_library_errors_become_gr_errors_and_others_pass():
    assert plain(3) == 3
    with pytest.raises(gr.Error, match="x must not be negative"):
        plain(-1)
    with pytest.raises(ValueError, match="a bug"):  # not the library's: Gradio shows its generic error
        plain(0)
    with pytest.raises(gr.Error) as info:
        asyncio.run(coroutine(-1))
    assert info.value.message == "No method 'x'; valid: macs"  # the message as the library wrote it
    with pytest.raises(gr.Error, match="ran out"):
        list(generator(2))

    async def drain():
        return [i async for i in agenerator(2)]

    with pytest.raises(gr.Error, match="ran out"):
        asyncio.run(drain())


def test_closing_a_wrapped_generator_early_closes_the_handler_at_once():
    closed.clear()
    gen = generator(5)
    assert next(gen) == 0
    gen.close()

    async def take_one_and_leave():
        agen = agenerator(5)
        assert await agen.__anext__() == 0
        await agen.aclose()

    asyncio.run(take_one_and_leave())
    assert closed == ["generator", "agenerator"]  # the handlers' finally ran (the app cancels the work there)


def test_results_and_updates_can_be_converted():
    assert wrap_handler(plain, lambda x: x * 10)(2) == 20
    assert next(wrap_handler(generator, str)(2)) == "0"


def test_a_toast_shows_markup_as_text():
    """Gradio draws a toast as HTML: a message quoting what the visitor typed must not make a tag."""

    @user_errors
    def foil(typed: str) -> None:
        raise InputError(f"Not a token id: {typed!r}. Restart with EXPLAINER_VLM=<hub id or local folder>.")

    with pytest.raises(gr.Error) as info:
        foil('<img id="xai-inj" src="http://127.0.0.1:9/x.png">')
    message = info.value.message
    assert "<" not in message and ">" not in message
    assert html.unescape(message) == (
        'Not a token id: \'<img id="xai-inj" src="http://127.0.0.1:9/x.png">\'. '
        "Restart with EXPLAINER_VLM=<hub id or local folder>."
    )  # all of it shows, as written


SERVED = """
import json, logging, socket, sys, uuid
import gradio as gr, httpx
from tests.ui.guards.test_errors import plain

logging.basicConfig(stream=sys.stderr, format="LOG %(levelname)s %(name)s %(message)s")
logging.getLogger("explainer.ui").setLevel(logging.INFO)
with gr.Blocks() as blocks:
    box = gr.Number()
    box.change(plain, inputs=box, outputs=box, api_name="plain")
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
blocks.queue().launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
base = f"http://127.0.0.1:{port}/gradio_api"

def call(value):
    session = uuid.uuid4().hex
    join = {"data": [value], "fn_index": 0, "session_hash": session}
    httpx.post(f"{base}/queue/join", json=join, timeout=60).raise_for_status()
    with httpx.stream("GET", f"{base}/queue/data", params={"session_hash": session}, timeout=60) as stream:
        for line in stream.iter_lines():
            message = json.loads(line[5:]) if line.startswith("data:") else {}
            if message.get("msg") == "process_completed":
                return message

print("=== refused", file=sys.stderr, flush=True)
refused = call(-1)
print("=== fault", file=sys.stderr, flush=True)
fault = call(0)
print("=== end", file=sys.stderr, flush=True)
print("RESULT " + json.dumps({"refused": refused, "fault": fault}), flush=True)
blocks.close()
"""


def test_a_user_error_logs_one_info_line_and_a_fault_its_traceback():
    """Through Gradio's queue, as in the app (a fresh process, its stderr read whole): a user error is one INFO line
    and no traceback; a bug still prints its traceback."""
    root = Path(__file__).resolve().parents[3]
    done = subprocess.run(
        [sys.executable, "-c", SERVED], cwd=root, capture_output=True, text=True, timeout=300, check=False
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    answers = json.loads(next(ln[7:] for ln in done.stdout.splitlines() if ln.startswith("RESULT ")))
    refused, fault = answers["refused"], answers["fault"]
    before, rest = done.stderr.split("=== refused\n", 1)[1].split("=== fault\n", 1)
    during_fault = rest.split("=== end\n", 1)[0]
    assert refused["success"] is False and refused["output"]["error"] == "x must not be negative"
    assert "Traceback" not in before, before
    lines = [line for line in before.splitlines() if line.startswith("LOG ")]
    assert lines == ["LOG INFO explainer.ui user error in plain: InputError: 'x must not be negative'"], before
    assert fault["success"] is False
    assert "Traceback" in during_fault and "ValueError: a bug, not the visitor's doing" in during_fault  # all of it
    assert not [line for line in during_fault.splitlines() if line.startswith("LOG ")]  # no user-error line for it
