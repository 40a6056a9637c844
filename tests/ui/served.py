"""The built app launched in this process on a free port, spoken to through Gradio's queue as a browser (or an
attacker calling events by `fn_index`, private ones included) does: `serve_app()`."""

from __future__ import annotations

import contextlib
import inspect
import json
import socket
import uuid
from collections.abc import Iterator

import gradio as gr
import httpx
import pytest

from ui import models


class Server:
    """A launched app: uploads and event calls over HTTP."""

    def __init__(self, demo: gr.Blocks, port: int):
        self.demo, self.base = demo, f"http://127.0.0.1:{port}/gradio_api"
        self.http = httpx.Client(timeout=120)

    def upload(self, name: str, data: bytes) -> str:
        response = self.http.post(f"{self.base}/upload", files=[("files", (name, data, "application/octet-stream"))])
        response.raise_for_status()
        (path,) = response.json()
        return path

    def defaults(self, fn) -> list:
        """Ordinary values of an event's inputs: each widget's value on the page (None for State, which the
        session holds), an API parameter's default ("x" for a required text)."""
        values = {c["id"]: c["props"].get("value") for c in self.demo.config["components"]}
        if fn.inputs and all(type(b).__name__ == "Api" for b in fn.inputs):
            params = list(inspect.signature(inspect.unwrap(fn.fn)).parameters.values())[: len(fn.inputs)]
            return [None if p.default is inspect.Parameter.empty and p.annotation != "str" else
                    "x" if p.default is inspect.Parameter.empty else p.default for p in params]  # fmt: skip
        return [None if b.stateful else values.get(b._id) for b in fn.inputs]

    def call(self, fn_index: int, data: list, session: str | None = None) -> list[dict]:
        """Every message of the queue for one call, to `process_completed`; `session` keeps a visitor's State
        between calls (None: a new visitor)."""
        session = session or uuid.uuid4().hex
        join = {"data": data, "fn_index": fn_index, "session_hash": session, "event_data": None, "trigger_id": None}
        self.http.post(f"{self.base}/queue/join", json=join).raise_for_status()
        messages = []
        with self.http.stream("GET", f"{self.base}/queue/data", params={"session_hash": session}) as stream:
            for line in stream.iter_lines():
                if line.startswith("data:"):
                    messages.append(json.loads(line[5:]))
                    if messages[-1].get("msg") == "process_completed":
                        break
        return messages


@contextlib.contextmanager
def serve_app() -> Iterator[Server]:
    """`app.demo` launched, offline (the image tab says it has no model); closed afterwards."""
    import app

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    patch = pytest.MonkeyPatch()
    patch.setattr(models, "model_ids", lambda: (None, None))
    app.demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    try:
        yield Server(app.demo, port)
    finally:
        app.demo.close()
        patch.undo()
