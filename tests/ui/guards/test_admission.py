"""The admission gate (ui/guards/admission.py) and the visitor's identity (ui/guards/visitors.py), against the served
app: fair turns by visitor, each limit and its message on the page's event and through the public API, a cancelling
client that frees its slots, and a visitor behind a trusted proxy and one that is not.

The library is a fake whose every request streams only once the test releases it (`Held`), so the tests decide
which requests are in flight. Calls go through Gradio's queue as a browser or a script sends them: several events of
one session joined, then its one event stream read (`Visitor`).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid

import httpx
import pytest
from gradio_client import Client

from explainer.decoding.fair import current_visitor
from ui import stream
from ui.guards import admission, visitors

from ..conftest import FakeLibrary, FakeStream
from ..served import serve_app

WAIT = 60.0


class HeldStream(FakeStream):
    """A fake request that yields its items only once `go` is set."""

    def __init__(self, items, go: threading.Event, on_cancel):
        super().__init__(items, on_cancel)
        self.go = go

    def latest(self, timeout):
        if not self.go.wait(timeout):
            return None
        return next(self._items)


class Held(FakeLibrary):
    """The fake library; each request (by prompt) waits for `release(prompt)`; `started` is the order they began."""

    def __init__(self):
        super().__init__()
        self.gates: dict[str, threading.Event] = {}
        self.started: list[str] = []
        self.visitors: dict[str, object] = {}  # the visitor the library work runs as, by prompt

    def stream_request(self, bundle, request, progress=None, cancel=None):
        self.started.append(request.prompt)
        self.visitors[request.prompt] = current_visitor()
        go = self.gates.setdefault(request.prompt, threading.Event())
        return HeldStream(self._stream(request.prompt, list(request.methods), request.max_new_tokens), go, None)

    def release(self, prompt: str) -> None:
        self.gates.setdefault(prompt, threading.Event()).set()


@pytest.fixture
def held(fake, monkeypatch):
    lib = Held()
    monkeypatch.setattr(stream, "stream_request", lib.stream_request)
    monkeypatch.setattr(admission, "GATE", admission.Gate())
    for name in (admission.RUNNING_ENV, admission.QUEUED_ENV, admission.QUEUE_ENV, visitors.TRUSTED_PROXIES_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv(visitors.SPACE_ENV, raising=False)
    yield lib
    for event in lib.gates.values():
        event.set()


@pytest.fixture(scope="module")
def server():
    with serve_app() as served:
        yield served


def _wait(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {admission.GATE.counts()}"
        time.sleep(0.01)


class Visitor:
    """One session (or one address behind a proxy): joins events, reads its event stream in a thread."""

    def __init__(self, server, headers: dict | None = None):
        self.server, self.session, self.headers = server, uuid.uuid4().hex, headers or {}
        self.http = httpx.Client(timeout=WAIT)
        self.done: dict[str, dict] = {}
        self.messages: list[dict] = []
        self._reader: threading.Thread | None = None

    def ask(self, event: str, prompt: str) -> str:
        """Join `event` (an api name: the page's `page_explain` or the API's `explain`) with `prompt`; its event id."""
        index, fn = next((i, f) for i, f in self.server.demo.fns.items() if f.api_name == event)
        data = self.server.defaults(fn)
        data[0] = prompt
        if event == "page_explain":
            data[2] = 4  # max new tokens
        join = {"data": data, "fn_index": index, "session_hash": self.session, "event_data": None, "trigger_id": None}
        response = self.http.post(f"{self.server.base}/queue/join", json=join, headers=self.headers)
        response.raise_for_status()
        if self._reader is None or not self._reader.is_alive():  # the stream closes when none of its events is left
            self._reader = threading.Thread(target=self._read, daemon=True)
            self._reader.start()
        return response.json()["event_id"]

    def _read(self) -> None:
        url = f"{self.server.base}/queue/data"
        with self.http.stream("GET", url, params={"session_hash": self.session}) as lines:
            for line in lines.iter_lines():
                if line.startswith("data:"):
                    message = json.loads(line[5:])
                    self.messages.append(message)
                    if message.get("msg") == "process_completed":
                        self.done[message["event_id"]] = message
                    if message.get("msg") == "close_stream":
                        return

    def result(self, event_id: str) -> dict:
        _wait(lambda: event_id in self.done, f"event {event_id}")
        return self.done[event_id]

    def notes(self, event_id: str) -> list[str]:
        """The status notes the page was sent for one event while it waited."""
        out = []
        for m in self.messages:
            if m.get("event_id") == event_id and m.get("msg") == "process_generating":
                out += [str(v) for v in json.dumps(m["output"].get("data")).split('"') if "in line" in v]
        return out

    def cancel(self, event: str, event_id: str) -> None:
        index = next(i for i, f in self.server.demo.fns.items() if f.api_name == event)
        body = {"session_hash": self.session, "fn_index": index, "event_id": event_id}
        self.http.post(f"{self.server.base}/cancel", json=body).raise_for_status()


def _error(message: dict) -> str:
    assert not message["success"], message
    return message["output"].get("error") or ""


def test_a_slot_goes_to_the_visitor_served_least_recently(server, held, monkeypatch):
    monkeypatch.setitem(admission.GATE.slots, admission.TEXT, 1)  # one text request at a time: the order shows
    flood, other = Visitor(server), Visitor(server)
    first = flood.ask("page_explain", "flood one")
    _wait(lambda: held.started == ["flood one"], "the first request to start")
    rest = [flood.ask("page_explain", "flood two")]
    _wait(lambda: admission.GATE.counts() == (1, 1), "the flood to queue")
    rest.append(flood.ask("page_explain", "flood three"))
    _wait(lambda: admission.GATE.counts() == (1, 2), "the flood to queue")
    late = other.ask("explain", "other one")  # through the API: the same gate
    _wait(lambda: admission.GATE.counts() == (1, 3), "the other visitor to queue")
    for prompt in ("flood one", "other one", "flood two", "flood three"):
        held.release(prompt)
    for visitor, event_id in [(flood, first), (other, late), *((flood, e) for e in rest)]:
        assert visitor.result(event_id)["success"]
    assert held.started == ["flood one", "other one", "flood two", "flood three"]  # not first come, first served
    # the library's work runs as its visitor: the batched decode orders its rows by the same rule
    assert held.visitors["flood one"] == held.visitors["flood three"] == f"session:{flood.session}"
    assert held.visitors["other one"] == f"session:{other.session}"
    assert any("in line" in note for note in flood.notes(rest[1]))  # the page showed its place while it waited


@pytest.mark.parametrize("event", ["page_explain", "explain"])
def test_each_limit_refuses_at_once_with_why_and_when(server, held, monkeypatch, event):
    monkeypatch.setenv(admission.RUNNING_ENV, "2")
    monkeypatch.setenv(admission.QUEUED_ENV, "1")
    monkeypatch.setenv(admission.QUEUE_ENV, "2")
    monkeypatch.setitem(admission.GATE.slots, admission.TEXT, 2)  # the flood's two fill the group: others wait
    flood = Visitor(server)
    ids = []
    for i, counts in enumerate([(1, 0), (2, 0), (2, 1)]):  # each one in the gate before the next is sent
        ids.append(flood.ask(event, f"flood {i}"))
        _wait(lambda counts=counts: admission.GATE.counts() == counts, f"request {i} at the gate")
    ids.append(flood.ask(event, "flood 3"))
    _wait(lambda: ids[3] in flood.done, "the request over the limits to be answered")
    refused = _error(flood.done[ids[3]])  # answered at once, while the others still wait or run
    assert "2 request(s) running and 1 waiting" in refused and "Try again when one of yours has finished" in refused
    assert admission.GATE.counts() == (2, 1)
    other, third = Visitor(server), Visitor(server)
    waiting = other.ask(event, "other 0")
    _wait(lambda: admission.GATE.counts() == (2, 2), "the second visitor to queue")
    full = _error(third.result(third.ask(event, "third 0")))  # the line holds 2: the bound
    assert "The app is busy: 2 requests are waiting" in full and "Try again in" in full
    for prompt in ["flood 0", "flood 1", "flood 2", "other 0"]:
        held.release(prompt)
    assert all(flood.result(i)["success"] for i in ids[:3]) and other.result(waiting)["success"]
    assert admission.GATE.counts() == (0, 0)


def test_the_api_client_hears_the_refusal_as_an_error_with_its_message(server, held, monkeypatch):
    monkeypatch.setenv(admission.RUNNING_ENV, "1")
    monkeypatch.setenv(admission.QUEUED_ENV, "1")
    client = Client(server.base.removesuffix("/gradio_api"), verbose=False)
    jobs = []
    for i, counts in enumerate([(1, 0), (1, 1), (1, 1)]):  # each one in the gate before the next is sent
        jobs.append(client.submit(prompt=f"c{i}", methods=["macs"], max_new_tokens=4, api_name="/explain"))
        _wait(lambda counts=counts: admission.GATE.counts() == counts, f"request {i} at the gate")
    _wait(lambda: jobs[2].done(), "the third request's refusal")
    with pytest.raises(Exception, match="the most one visitor may have"):
        jobs[2].result()
    held.release("c0")
    held.release("c1")
    assert all(json.loads(job.result())["model"] == "fake-tiny" for job in jobs[:2])
    client.close()


def test_a_flooding_client_that_cancels_frees_its_slots(server, held):
    flood = Visitor(server)
    ids = []
    for i in range(4):  # 2 run, 2 wait
        ids.append(flood.ask("page_explain", f"cancelled {i}"))
        _wait(lambda i=i: sum(admission.GATE.counts()) == i + 1, f"request {i} at the gate")
    _wait(lambda: admission.GATE.counts() == (2, 2), "the flood to run and queue")
    for event_id in ids:  # as a script's `job.cancel()` does, or the page's Cancel button
        flood.cancel("page_explain", event_id)
    for event_id in ids:
        flood.result(event_id)
    _wait(lambda: admission.GATE.counts() == (0, 0), "the slots to be freed")
    again = flood.ask("page_explain", "after the cancel")
    held.release("after the cancel")
    assert flood.result(again)["success"]


@pytest.mark.parametrize("trusted", [True, False])
def test_a_visitor_behind_a_trusted_proxy_is_its_address_and_a_forwarded_header_is_ignored_otherwise(
    server, held, monkeypatch, trusted
):
    monkeypatch.setenv(visitors.TRUSTED_PROXIES_ENV, "1" if trusted else "0")
    monkeypatch.setenv(admission.RUNNING_ENV, "1")
    monkeypatch.setenv(admission.QUEUED_ENV, "1")
    # three sessions of one client: the proxy appended its address last; the first entries are the client's own
    sessions = [Visitor(server, {"X-Forwarded-For": f"10.0.0.{i}, 203.0.113.7"}) for i in range(3)]
    ids = []
    for i, visitor in enumerate(sessions[:2]):
        ids.append(visitor.ask("explain", f"proxied {i}"))
        _wait(lambda i=i: sum(admission.GATE.counts()) == i + 1, f"request {i} at the gate")
    ids.append(sessions[2].ask("explain", "proxied 2"))
    if trusted:  # one visitor (203.0.113.7): one runs, one waits, the third is refused
        assert "the most one visitor may have" in _error(sessions[2].result(ids[2]))
        assert admission.GATE.counts() == (1, 1)
    else:  # three sessions, three visitors: all run
        _wait(lambda: admission.GATE.counts() == (3, 0), "three visitors to run")
    for i in range(3):
        held.release(f"proxied {i}")
    assert all(sessions[i].result(ids[i])["success"] for i in range(2))


def test_the_visitor_key():
    class Request:
        def __init__(self, forwarded=None, session="s1"):
            self.headers = httpx.Headers({"x-forwarded-for": forwarded} if forwarded else {})
            self.session_hash = session

    assert visitors.forwarded_address(httpx.Headers({"x-forwarded-for": "1.1.1.1, 2.2.2.2"}), 1) == "2.2.2.2"
    assert visitors.forwarded_address(httpx.Headers({"x-forwarded-for": "1.1.1.1, 2.2.2.2"}), 2) == "1.1.1.1"
    assert visitors.forwarded_address(httpx.Headers({"x-forwarded-for": "2.2.2.2"}), 2) is None  # not via both
    assert visitors.visitor_key(Request("9.9.9.9")) == "session:s1"  # no trusted proxy: the header is ignored
    assert visitors.visitor_key(None) == "anonymous"


def test_the_limits_come_from_their_variables(monkeypatch):
    monkeypatch.setenv(admission.RUNNING_ENV, "5")
    monkeypatch.setenv(admission.QUEUED_ENV, "zero")
    assert admission.limit(admission.RUNNING_ENV) == 5
    assert admission.limit(admission.QUEUED_ENV) == admission.DEFAULTS[admission.QUEUED_ENV]
    monkeypatch.setenv(visitors.SPACE_ENV, "user/space")
    monkeypatch.delenv(visitors.TRUSTED_PROXIES_ENV, raising=False)
    assert visitors.trusted_proxies() == 1  # a Space sits behind one proxy


# --- the three wrappers, without a server ---------------------------------------------------------------------------
class _Request:
    def __init__(self, session: str):
        self.headers = httpx.Headers({})
        self.session_hash = session


def _counting(n: int, seen: list, closed: list, kind: str):
    """A handler of `kind` (a plain or async generator function, or a coroutine function) that records the visitor it
    runs as and whether it was closed."""

    def gen():
        try:
            for i in range(n):
                seen.append(current_visitor())
                yield i
        finally:
            closed.append(True)

    async def agen():
        for item in gen():
            yield item

    async def call():
        return list(gen())

    return {"sync": gen, "async": agen, "call": call}[kind]


async def _drive(wrapped, held: admission.Ticket, gate: admission.Gate, kind: str, take: int) -> list:
    """Items of a gated handler (the waiting notes first) while another visitor holds the one slot, which is freed
    once the handler has waited one poll; `take` items, then the wrapper is closed."""
    out = []
    if kind == "call":
        task = asyncio.ensure_future(wrapped(_Request("b")))
        await asyncio.sleep(0.05)
        assert gate.counts() == (1, 1) and not task.done()  # it waits its turn
        gate.leave(held)
        return await task
    gen = wrapped(_Request("b"))
    step = (lambda: next(gen)) if kind == "sync" else gen.__anext__
    first = step()
    out.append(first if kind == "sync" else await first)
    gate.leave(held)
    while len(out) < take:
        item = step()
        out.append(item if kind == "sync" else await item)
    await gen.aclose() if kind == "async" else gen.close()
    return out


@pytest.mark.parametrize("kind", ["sync", "async", "call"])
def test_each_wrapper_waits_its_turn_runs_as_its_visitor_and_always_leaves(kind, monkeypatch):
    monkeypatch.setattr(admission, "POLL_SECONDS", 0.001)
    gate = admission.Gate({admission.MODEL: 1})
    held = gate.enter("session:a", admission.MODEL)  # another visitor holds the one slot
    seen, closed = [], []
    wrapped = admission.gated(_counting(5, seen, closed, kind), admission.MODEL, lambda note: note, gate)
    out = asyncio.run(_drive(wrapped, held, gate, kind, take=3))
    if kind == "call":
        assert out == [0, 1, 2, 3, 4]
    else:  # the note of its place in line, shown once, then the handler's items; closed after two of them
        assert out[0] == admission.waiting_note((1, admission.FIRST_GUESS_SECONDS)) and out[1:] == [0, 1]
    assert set(seen) == {"session:b"} and closed == [True]
    assert gate.counts() == (0, 0)  # the request left the gate when its wrapper ended early


def test_a_refused_request_never_runs_and_leaves_nothing(monkeypatch):
    monkeypatch.setenv(admission.QUEUE_ENV, "1")
    gate = admission.Gate({admission.MODEL: 1})
    gate.enter("session:a", admission.MODEL)
    gate.enter("session:c", admission.MODEL)  # waits: the line is full
    seen, closed = [], []
    wrapped = admission.gated(_counting(2, seen, closed, "sync"), admission.MODEL, None, gate)
    with pytest.raises(admission.Busy, match="busy"):
        next(wrapped(_Request("b")))
    assert seen == closed == [] and gate.counts() == (1, 1)
