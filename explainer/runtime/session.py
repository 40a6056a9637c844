"""One request at a time per model, and cancellation that really stops the work.

A loaded model is shared by every caller of the process (the app's visitors, threads of a script). Two forward
passes on one model at once would corrupt each other: the attention functions that capture rows or suppress tokens
are selected on the model's config, which every thread reads. So every use of a model runs inside `hold(model)`,
which takes that model's lock for the whole request (generation with capture, AtMan, faithfulness, eval, bench) and
publishes the request's `CancelToken` to the code running in this context. Long loops call `between_passes()`
(or `check_cancelled()`) between forward passes and batches, so a cancelled request raises `Cancelled` within one
pass and frees the lock, and a long one hands the model to visitors' decoding meanwhile.

`hold` is re-entrant within one context (an evaluation that explains and then measures faithfulness holds the lock
once); other threads wait, short work first (`turns.py`), and a waiting request that is cancelled stops waiting.

`run_in_worker` turns a generator of results into a `WorkerStream`: the work runs in its own thread that holds the
lock from its first to its last forward pass, whatever the consumer does. A consumer that stops reading, closes the
stream or disappears cancels the work; the lock is released when the work has actually stopped, never before.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import queue
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from ..errors import Cancelled
from .turns import ModelLock

T = TypeVar("T")
logger = logging.getLogger(__name__)



class CancelToken:
    """Set once by whoever wants the work to stop (a Cancel button, a closed tab, Ctrl-C); read by the work."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.reason = "The request was cancelled."

    def cancel(self, reason: str | None = None) -> None:
        if reason:
            self.reason = reason
        self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def raise_if_cancelled(self) -> None:
        if self._event.is_set():
            raise Cancelled(self.reason)


_locks: weakref.WeakKeyDictionary[Any, ModelLock] = weakref.WeakKeyDictionary()
_locks_guard = threading.Lock()
_held: contextvars.ContextVar[frozenset[int]] = contextvars.ContextVar("explainer_held_models", default=frozenset())
# each lock this context holds, with a box of the ticket it holds it by (None after a failed `between_passes` wait)
_held_locks: contextvars.ContextVar[tuple[tuple[ModelLock, list, int], ...]] = contextvars.ContextVar(
    "explainer_held_locks", default=()
)
_token: contextvars.ContextVar[CancelToken | None] = contextvars.ContextVar("explainer_cancel_token", default=None)


def model_lock(model: Any) -> ModelLock:
    """The process-wide lock of one loaded model (created on first use)."""
    with _locks_guard:
        lock = _locks.get(model)
        if lock is None:
            lock = _locks[model] = ModelLock()
        return lock


def holds(model: Any) -> bool:
    """Whether the current context holds `model`'s lock."""
    return id(model) in _held.get()


@contextlib.contextmanager
def hold(
    model: Any, cancel: CancelToken | None = None, *, urgent: bool = False, seconds: float | None = None
) -> Iterator[CancelToken | None]:
    """Run the block as the only user of `model`, with `cancel` visible to `check_cancelled()`.

    Re-entrant within one context: a nested `hold` of the same model neither waits nor releases; it may add a
    token when the outer block had none. Who gets a model that several wait for: `turns.py` (the batched decode
    first, `urgent`; then the shortest estimated work, `seconds`).

    Raises:
        Cancelled: the token fired while waiting for the lock.
    """
    outer = _token.get()
    active = cancel or outer
    if holds(model):
        reset = _token.set(active)
        try:
            yield active
        finally:
            _token.reset(reset)
        return
    lock = model_lock(model)
    box = [lock.acquire(active, urgent, seconds)]
    held = _held.set(_held.get() | {id(model)})
    held_locks = _held_locks.set((*_held_locks.get(), (lock, box, id(model))))
    reset = _token.set(active)
    logger.debug("model %x acquired at %.6f", id(model), time.time())
    try:
        yield active
    finally:
        _token.reset(reset)
        _held_locks.reset(held_locks)
        _held.reset(held)
        logger.debug("model %x released at %.6f", id(model), time.time())
        if box[0] is not None:  # None: it was given up between passes and not taken back (cancelled meanwhile)
            lock.release()


@contextlib.contextmanager
def cancellable(cancel: CancelToken | None) -> Iterator[CancelToken | None]:
    """Run the block with `cancel` visible to `check_cancelled()`, without taking any model's lock (a batched
    request, whose decode steps the batcher runs, holds the model only for its post-hoc methods)."""
    active = cancel or _token.get()
    reset = _token.set(active)
    try:
        yield active
    finally:
        _token.reset(reset)


def check_cancelled() -> None:
    """Raise `Cancelled` if the current request's token fired; called between forward passes and batches."""
    token = _token.get()
    if token is not None:
        token.raise_if_cancelled()


def between_passes() -> None:
    """Between two forward (or backward) passes of long work: raise `Cancelled` if the request's token fired, and
    give each model this context holds to the work that goes first (`turns.py`: the batched decode of visitors'
    text requests) while it wants it, then wait for the model's turn again with the remaining estimate.

    Call it only where the work leaves nothing of its own on the model that another request's pass could meet:
    attention functions selected by `capture.attention_function_selected` are per context and may stay.
    """
    check_cancelled()
    token = _token.get()
    for lock, box, model_id in _held_locks.get():
        if lock.should_yield():
            remaining = box[0].remaining()
            logger.debug("model %x released at %.6f (between passes)", model_id, time.time())
            box[0] = None
            lock.release()
            box[0] = lock.acquire(token, False, remaining)
            logger.debug("model %x acquired at %.6f (between passes)", model_id, time.time())
    check_cancelled()


def place(model: Any, cancel: CancelToken | None) -> tuple[int, float | None] | None:
    """Where the request with this cancel token waits for `model`: (position, estimated seconds ahead or None), or
    None when it does not wait (see `turns.ModelLock.place`)."""
    return model_lock(model).place(cancel)


class WorkerStream(Generic[T]):
    """Iterator over what a worker thread produces; see `run_in_worker`.

    Iterating yields every item in order. `latest()` skips to the newest item available (for a UI that renders
    fewer updates than the work produces). `cancel()` asks the work to stop and returns at once; `close()` cancels
    and waits until the work has stopped (bounded by `timeout`). A stream that is garbage-collected cancels its work.
    """

    def __init__(
        self, work: Callable[[], Iterator[T]], model: Any, cancel: CancelToken | None, hold_model: bool = True
    ) -> None:
        self.token = cancel or CancelToken()
        self._queue: queue.Queue = queue.Queue()
        self._pending: tuple[str, Any] | None = None
        self._finished = False
        context = contextvars.copy_context()
        # the thread gets the queue and token, not `self`: a consumer that drops the stream lets it be collected
        self._thread = threading.Thread(
            target=context.run, args=(_work_loop, work, model, self.token, self._queue, hold_model),
            name="explainer-worker",
            daemon=True,
        )  # fmt: skip
        self._thread.start()

    def __iter__(self) -> WorkerStream[T]:
        return self

    def _get(self, timeout: float | None) -> tuple[str, Any] | None:
        if self._pending is not None:
            entry, self._pending = self._pending, None
            return entry
        try:
            return self._queue.get(timeout=timeout) if timeout is not None else self._queue.get()
        except queue.Empty:
            return None

    def _take(self, entry: tuple[str, Any]) -> T:
        kind, value = entry
        if kind == "item":
            return value
        self._finished = True
        if kind == "error":
            raise value
        raise StopIteration

    def __next__(self) -> T:
        if self._finished:
            raise StopIteration
        return self._take(self._get(None))

    def next_or_none(self, timeout: float) -> T | None:
        """The next item, or None if none arrives within `timeout` seconds (StopIteration at the end)."""
        if self._finished:
            raise StopIteration
        entry = self._get(timeout)
        return None if entry is None else self._take(entry)

    def latest(self, timeout: float) -> T | None:
        """The newest item available, dropping older ones; None if nothing arrives within `timeout` seconds.

        The end of the stream (or an error of the work) is reported by the call after the last item.
        """
        item = self.next_or_none(timeout)
        if item is None:
            return None
        while True:
            entry = self._get(0.0)
            if entry is None:
                return item
            if entry[0] != "item":
                self._pending = entry
                return item
            item = entry[1]

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def cancel(self, reason: str | None = None) -> None:
        self.token.cancel(reason)

    def close(self, timeout: float = 60.0) -> None:
        """Cancel the work and wait until it has stopped (and released the model)."""
        if self._thread.is_alive():
            self.token.cancel()
            self._thread.join(timeout)
        self._finished = True

    def __del__(self) -> None:
        if self._thread.is_alive():
            self.token.cancel()


def _work_loop(
    work: Callable[[], Iterator[Any]], model: Any, token: CancelToken, out: queue.Queue, hold_model: bool = True
) -> None:
    try:
        with hold(model, token) if hold_model else cancellable(token):
            for item in work():
                out.put(("item", item))
                check_cancelled()
        out.put(("done", None))
    except BaseException as e:  # handed to the consumer, never lost in the thread
        out.put(("error", e))


def run_in_worker(
    work: Callable[[], Iterator[T]], model: Any, cancel: CancelToken | None = None, hold_model: bool = True
) -> WorkerStream[T]:
    """Start `work()` in a thread that holds `model`'s lock for its whole run; return a stream of its items.

    Items must not be changed by the work after they are produced (produce snapshots). With `hold_model` False the
    thread takes no lock (the work holds the model where it needs it, e.g. a batched request's post-hoc methods);
    the cancel token is published all the same.
    """
    return WorkerStream(work, model, cancel, hold_model)
