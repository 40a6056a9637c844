"""Whose turn it is on a model (explainer/runtime/turns.py): the batched decode first, then the shortest estimated
work, a waiting request's place in line, cancelling a wait."""

from __future__ import annotations

import threading
import time

import pytest

from explainer.errors import Cancelled
from explainer.runtime.session import CancelToken
from explainer.runtime.turns import ModelLock


def _queue(lock: ModelLock, order: list, name: str, **kwargs) -> threading.Thread:
    def take() -> None:
        lock.acquire(**kwargs)
        order.append(name)
        lock.release()

    thread = threading.Thread(target=take)
    thread.start()
    return thread


def _until(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.002)


def test_the_decode_goes_first_then_the_shortest_work_then_work_without_an_estimate():
    lock, order = ModelLock(), []
    lock.acquire()
    threads = []
    for name, kwargs in [("unknown", {}), ("long", {"seconds": 30.0}), ("short", {"seconds": 5.0}),
                         ("unknown later", {}), ("decode", {"urgent": True})]:  # fmt: skip
        threads.append(_queue(lock, order, name, **kwargs))
        _until(lambda queued=len(threads): lock.waiting == queued)  # noqa: B008 - queued in this order
    lock.release()
    for t in threads:
        t.join(10)
    assert order == ["decode", "short", "long", "unknown", "unknown later"]
    assert not lock.locked() and lock.waiting == 0


def test_while_the_batcher_has_rows_nothing_else_takes_the_model_between_its_rounds():
    lock, order = ModelLock(), []
    with lock.prefer():
        assert lock.should_yield()  # a holder gives the model up between its passes
        waiter = _queue(lock, order, "post-hoc", seconds=1.0)
        _until(lambda: lock.waiting == 1)
        time.sleep(0.2)
        assert order == [] and not lock.locked()  # free, but not its turn
        urgent = _queue(lock, order, "round", urgent=True)
        urgent.join(10)
        assert order == ["round"]
    waiter.join(10)
    assert order == ["round", "post-hoc"] and not lock.should_yield()


def test_a_waiting_request_knows_its_place_and_the_work_ahead():
    lock = ModelLock()
    lock.acquire(seconds=20.0)  # the holder: about 20 s of work
    short, long, unknown = CancelToken(), CancelToken(), CancelToken()
    def wait(token: CancelToken, seconds: float | None) -> None:
        with pytest.raises(Cancelled):  # each one stops waiting when its visitor leaves
            lock.acquire(token, seconds=seconds)

    threads = [threading.Thread(target=wait, args=a) for a in [(long, 40.0), (short, 10.0), (unknown, None)]]
    for t in threads:
        t.start()
    _until(lambda: lock.waiting == 3)
    position, seconds = lock.place(short)
    assert position == 1 and 19.0 < seconds <= 20.0  # the holder's remaining work
    position, seconds = lock.place(long)
    assert position == 2 and 29.0 < seconds <= 30.0  # and the short request's
    assert lock.place(unknown)[0] == 3 and lock.place(unknown)[1] > 69.0
    assert lock.place(CancelToken()) is None  # not waiting
    for token in (short, long, unknown):
        token.cancel()
    for t in threads:
        t.join(10)
    assert lock.waiting == 0 and lock.place(short) is None


def test_a_cancelled_wait_raises_and_leaves_the_line():
    lock, token = ModelLock(), CancelToken()
    lock.acquire()
    errors = []

    def wait() -> None:
        try:
            lock.acquire(token, seconds=3.0)
        except Cancelled as e:
            errors.append(e)

    thread = threading.Thread(target=wait)
    thread.start()
    _until(lambda: lock.waiting == 1)
    token.cancel()
    thread.join(10)
    assert len(errors) == 1 and lock.waiting == 0 and lock.locked()  # the holder still holds it
    lock.release()
    assert not lock.locked()


def test_long_work_gives_the_model_up_between_passes_and_a_cancel_while_it_waits_leaves_the_lock_sound():
    from explainer.runtime.session import between_passes, hold, model_lock

    class Model:
        pass

    model, token = Model(), CancelToken()
    lock = model_lock(model)
    passes, paused, errors = [], threading.Event(), []

    def long_work() -> None:
        try:
            with hold(model, token, seconds=60.0):
                for i in range(1000):
                    passes.append(i)
                    if lock.should_yield():
                        paused.set()
                    between_passes()  # gives the model up while the batcher has rows
                    time.sleep(0.001)
        except Cancelled as e:
            errors.append(e)

    worker = threading.Thread(target=long_work)
    worker.start()
    _until(lambda: len(passes) > 3)
    with lock.prefer():  # the batcher has rows: the work stops at its next pass
        assert paused.wait(10)
        _until(lambda: lock.waiting == 1 and not lock.locked())
        done = len(passes)
        with hold(model, urgent=True):  # a decode round runs meanwhile
            time.sleep(0.05)
            assert len(passes) == done
        token.cancel()  # the visitor leaves while the work waits for its turn
        worker.join(10)
    assert len(errors) == 1 and not worker.is_alive()
    assert not lock.locked() and lock.waiting == 0  # released once, not twice, and nobody left in line
    with hold(model):
        assert lock.locked()
