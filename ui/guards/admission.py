"""The admission gate of the events that run a model: per-visitor limits, a bounded queue, and fair turns.

Every such event, on the page and in the public API alike, goes through `gated` (put around the handler outside the
GPU wrapper, by `events.Components.bind` and `api.endpoint`). A request of visitor V (`visitors.visitor_key`):

- runs at once when V has fewer than `EXPLAINER_VISITOR_RUNNING` requests running (default 2), its group has a free
  slot (`SLOTS`: text explain requests decode together in up to 16 rows, the other model events one at a time) and
  no other visitor who may run waits for it;
- else waits, when V has fewer than `EXPLAINER_VISITOR_QUEUED` requests waiting (default 4) and the app fewer than
  `EXPLAINER_QUEUE_LIMIT` (default 32); the page shows its true place in line, and a waiting request that is
  cancelled leaves the line at once;
- else is refused at once with a message that says why and when to try again (`Busy`, a `gr.Error` toast on the
  page, an error through the API): never dropped silently.

When a slot frees, the next request comes from the visitor served least recently (`explainer.decoding.fair`: round
robin across visitors), not the oldest request. The handler runs as its visitor (`fair.as_visitor`), so the batched
decode admits its rows by the same rule. A request stops counting as soon as its handler ends, however it
ended (finished, failed, cancelled, the visitor left). Gradio's own queue does not hold these events
(`concurrency_limit=None`): it would serve them first come, first served.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import os
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Hashable, Iterator
from typing import Any

import anyio
import gradio as gr

from explainer.decoding.fair import FairQueue, as_visitor
from explainer.errors import ExplainerError
from explainer.estimate import format_seconds

from .visitors import visitor_key

TEXT, MODEL = "text", "model"  # the groups: text explain requests (batched together) and every other model event
SLOTS = {TEXT: 16, MODEL: 1}  # requests of a group running at once (16: the batched decode's rows on a CPU)
RUNNING_ENV, QUEUED_ENV, QUEUE_ENV = "EXPLAINER_VISITOR_RUNNING", "EXPLAINER_VISITOR_QUEUED", "EXPLAINER_QUEUE_LIMIT"
DEFAULTS = {RUNNING_ENV: 2, QUEUED_ENV: 4, QUEUE_ENV: 32}  # a public Space's; a private box may raise them
POLL_SECONDS = 0.05  # how often a waiting request looks whether its turn came
STALE_SECONDS = 5.0  # a waiting request whose loop has not looked for this long was abandoned (see `Gate.place`)
FIRST_GUESS_SECONDS = 10.0  # a request's time before any has been measured (for "try again in about ...")


class Busy(ExplainerError):
    """A request refused at the gate: what limit it met, and when to try again."""


@dataclasses.dataclass(eq=False)
class Ticket:
    """One request at the gate."""

    visitor: Hashable
    group: str
    admitted: bool = False
    started: float = 0.0
    seen: float = dataclasses.field(default_factory=time.monotonic)  # its wait loop last looked (`Gate.place`)
    claimed: bool = False  # admitted, and its wait loop saw it: its handler runs


def limit(name: str) -> int:
    """The limit `name` from its environment variable (a whole number, at least 1), else its default."""
    try:
        return max(1, int(os.environ.get(name, "")))
    except ValueError:
        return DEFAULTS[name]


class Gate:
    """The gate's state (see the module docstring); thread-safe."""

    def __init__(self, slots: dict[str, int] | None = None) -> None:
        self.slots = dict(slots or SLOTS)
        self._lock = threading.Lock()
        self._queue: FairQueue[Ticket] = FairQueue()
        self._admitted: list[Ticket] = []
        self._running: Counter[Hashable] = Counter()  # admitted requests per visitor
        self._busy: Counter[str] = Counter()  # admitted requests per group
        self._started: dict[Hashable, list[float]] = {}  # when each visitor's running requests started
        self._seconds = {group: FIRST_GUESS_SECONDS for group in self.slots}  # a request's recent time, per group

    def enter(self, visitor: Hashable, group: str) -> Ticket:
        """A ticket for a request, admitted now or waiting in line.

        Raises:
            Busy: the visitor has as many requests waiting as one may, or the line is full.
        """
        ticket = Ticket(visitor, group)
        running, queued, total = limit(RUNNING_ENV), limit(QUEUED_ENV), limit(QUEUE_ENV)
        with self._lock:
            self._queue.push(visitor, ticket)
            self._dispatch()
            if ticket.admitted:
                ticket.claimed = True
                return ticket
            self._queue.remove(ticket)
            mine = self._queue.waiting(visitor)
            if mine >= queued:
                raise Busy(
                    f"You already have {self._running[visitor]} request(s) running and {mine} waiting, the most one "
                    f"visitor may have ({running} running, {queued} waiting); this one was not queued. Try again "
                    f"when one of yours has finished, in {format_seconds(self._next_end(visitor))}."
                )
            if len(self._queue) >= total:
                wait = self._seconds[group] * (1 + len(self._queue) / self.slots[group])
                raise Busy(
                    f"The app is busy: {len(self._queue)} requests are waiting, the most it queues; this one was not "
                    f"queued. Try again in {format_seconds(wait)}."
                )
            self._queue.push(visitor, ticket)
            return ticket

    def leave(self, ticket: Ticket) -> None:
        """The request ended (any way) or left the line: its slot goes to the next visitor in turn."""
        with self._lock:
            if ticket.admitted:
                if ticket.claimed:
                    took = time.monotonic() - ticket.started
                    self._seconds[ticket.group] = 0.8 * self._seconds[ticket.group] + 0.2 * took
                self._release(ticket)
            else:
                self._queue.remove(ticket)
            self._dispatch()

    def _release(self, ticket: Ticket) -> None:
        ticket.admitted = False
        self._admitted.remove(ticket)
        self._running[ticket.visitor] -= 1
        self._busy[ticket.group] -= 1
        self._started[ticket.visitor].remove(ticket.started)
        if not self._running[ticket.visitor]:
            del self._running[ticket.visitor], self._started[ticket.visitor]

    def place(self, ticket: Ticket) -> tuple[int, float] | None:
        """(its place in line, 1 = next; the estimated seconds until its turn) while `ticket` waits, else None.

        The wait loop calls this every `POLL_SECONDS`: a waiting request whose loop stops calling it (Gradio can
        cancel an event between two updates of its handler and leave the handler's generator suspended at its last
        update) leaves the line after `STALE_SECONDS`, so it never takes a slot nobody will use. A loop that comes
        back after that joins the line again at its end."""
        with self._lock:
            ticket.seen = time.monotonic()
            if not ticket.admitted and ticket not in self._queue:
                self._queue.push(ticket.visitor, ticket)
                self._dispatch()
            if ticket.admitted:
                ticket.claimed = True
                return None
            line = [t for t in self._queue.order() if t.group == ticket.group]
            if ticket not in line:
                return None
            ahead = line.index(ticket)
            free_in = self._seconds[ticket.group] * (1 + ahead // self.slots[ticket.group])
            return ahead + 1, free_in

    def counts(self) -> tuple[int, int]:
        """(requests running, requests waiting)."""
        with self._lock:
            self._dispatch()  # the abandoned leave the line
            return sum(self._running.values()), len(self._queue)

    def _dispatch(self) -> None:
        """Admit waiting requests while some may run: the fair queue's order, among visitors under their running
        limit, into groups with a free slot."""
        most = limit(RUNNING_ENV)
        now = time.monotonic()
        self._queue.drop(lambda t: now - t.seen > STALE_SECONDS)
        for ticket in [t for t in self._admitted if not t.claimed and now - t.seen > STALE_SECONDS]:
            self._release(ticket)  # admitted while its loop was gone: the slot goes to someone who is there

        def may_run(ticket: Ticket) -> bool:
            return self._running[ticket.visitor] < most and self._busy[ticket.group] < self.slots[ticket.group]

        while True:
            ready = [t for t in self._queue.order() if may_run(t)]
            if not ready:
                return
            ticket = self._queue.take(ready[0])
            ticket.admitted, ticket.started = True, time.monotonic()
            self._admitted.append(ticket)
            self._running[ticket.visitor] += 1
            self._busy[ticket.group] += 1
            self._started.setdefault(ticket.visitor, []).append(ticket.started)

    def _next_end(self, visitor: Hashable) -> float:
        started = self._started.get(visitor)
        if not started:
            return 1.0
        return max(1.0, min(self._seconds.values()) - (time.monotonic() - min(started)))


GATE = Gate()


def waiting_note(place: tuple[int, float]) -> str:
    position, seconds = place
    line = "next in line" if position == 1 else f"number {position} in line"
    return f"Waiting for your turn: {line}, {format_seconds(seconds)} (visitors take turns)…"


def gated(
    fn: Callable[..., Any], group: str, waiting: Callable[[str], Any] | None = None, gate: Gate | None = None
) -> Callable[..., Any]:
    """`fn` (an async or plain generator function, or a coroutine function) behind the gate: Gradio passes the
    request (`gr.Request`, a first parameter added to `fn`'s signature), which names the visitor; while the request
    waits, `waiting(note)` is yielded each time its place in line changes (generators only; None: nothing is shown).

    Raises (from the wrapper):
        Busy: refused at the gate (`wrap_handler` turns it into `gr.Error`).
    """
    kind = _async_gen if inspect.isasyncgenfunction(fn) else _sync_gen if inspect.isgeneratorfunction(fn) else _call
    return with_request(functools.wraps(fn)(kind(fn, group, waiting, gate)), fn)


_DONE = object()  # the handler's generator has ended


class _Turn:
    """One request's way through the gate, the logic the wrappers share: `_turn` enters and leaves, `polls` waits,
    `next` / `anext` step the handler as its visitor. The wrappers add only how they sleep and await."""

    def __init__(self, gate: Gate, ticket: Ticket) -> None:
        self.gate, self.ticket = gate, ticket
        self.shown: str | None = None  # the waiting note last shown

    def polls(self, waiting: Callable[[str], Any] | None) -> Iterator[Any]:
        """One item a poll (the caller sleeps `POLL_SECONDS` after each) until the request's turn comes:
        `waiting(note)` where its place in line changed, else None."""
        while (place := self.gate.place(self.ticket)) is not None:
            note = waiting_note(place)
            if waiting is None or note == self.shown:
                yield None
                continue
            self.shown = note
            yield waiting(note)

    def next(self, gen: Iterator[Any]) -> Any:
        """The handler's next item (`_DONE` at its end), run as its visitor: the library work it starts knows whose
        it is (`fair.py`)."""
        with as_visitor(self.ticket.visitor):
            return next(gen, _DONE)

    async def anext(self, gen: AsyncIterator[Any]) -> Any:
        """`next` for an async generator."""
        with as_visitor(self.ticket.visitor):
            return await anext(gen, _DONE)


@contextlib.contextmanager
def _turn(request: gr.Request, group: str, gate: Gate | None) -> Iterator[_Turn]:
    """A request's turn: it enters the gate (`Busy` when refused) and leaves it however the block ends."""
    at = gate or GATE  # looked up per call: a test may give the app a fresh gate
    ticket = at.enter(visitor_key(request), group)
    try:
        yield _Turn(at, ticket)
    finally:
        at.leave(ticket)


def _async_gen(fn: Callable[..., Any], group: str, waiting: Any, gate: Gate | None) -> Callable[..., Any]:
    async def wrapper(request: gr.Request, *args: Any, **kwargs: Any) -> Any:
        with _turn(request, group, gate) as turn:
            for view in turn.polls(waiting):
                if view is not None:
                    yield view
                await anyio.sleep(POLL_SECONDS)
            async with contextlib.aclosing(fn(*args, **kwargs)) as gen:
                while (item := await turn.anext(gen)) is not _DONE:
                    yield item

    return wrapper


def _sync_gen(fn: Callable[..., Any], group: str, waiting: Any, gate: Gate | None) -> Callable[..., Any]:
    def wrapper(request: gr.Request, *args: Any, **kwargs: Any) -> Any:  # on ZeroGPU (`hardware.on_gpu`): a thread
        with _turn(request, group, gate) as turn:
            for view in turn.polls(waiting):
                if view is not None:
                    yield view
                time.sleep(POLL_SECONDS)
            with contextlib.closing(fn(*args, **kwargs)) as gen:
                yield from iter(functools.partial(turn.next, gen), _DONE)  # its items until `_DONE`

    return wrapper


def _call(fn: Callable[..., Any], group: str, waiting: Any, gate: Gate | None) -> Callable[..., Any]:
    async def wrapper(request: gr.Request, *args: Any, **kwargs: Any) -> Any:
        with _turn(request, group, gate) as turn:
            for _ in turn.polls(None):
                await anyio.sleep(POLL_SECONDS)
            with as_visitor(turn.ticket.visitor):
                result = fn(*args, **kwargs)
                return await result if inspect.isawaitable(result) else result

    return wrapper


def with_request(wrapper: Callable[..., Any], fn: Callable[..., Any]) -> Callable[..., Any]:
    """`wrapper` with `fn`'s signature and a first parameter `request: gr.Request`, through which Gradio passes the
    request (it reads the type from the annotations, so they are a new dict: `fn`'s own stay as they are)."""
    signature = inspect.signature(fn)
    first = inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=gr.Request)
    wrapper.__signature__ = signature.replace(parameters=[first, *signature.parameters.values()])
    wrapper.__annotations__ = {"request": gr.Request, **getattr(fn, "__annotations__", {})}
    return wrapper
