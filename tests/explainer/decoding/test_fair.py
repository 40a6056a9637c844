"""Fair admission (decoding/fair.py): the next request comes from the visitor served least recently, in the queue
itself and in the batched decode's admission of waiting rows."""

from __future__ import annotations

import threading

import pytest
import torch

from explainer.decoding.batched import batched_steps, counts, engine
from explainer.decoding.batched.row import Row
from explainer.decoding.fair import ANYONE, FairQueue, as_visitor, current_visitor
from explainer.decoding.solo import DecodeJob
from explainer.methods import get_method
from explainer.runtime import memory

from ...conftest import build_model
from .test_batched import _paused, _wait


def test_a_visitor_with_many_requests_is_served_in_turn_with_the_others():
    q: FairQueue[str] = FairQueue()
    for i in range(4):
        q.push("flood", f"f{i}")
    q.push("b", "b0")
    q.push("c", "c0")
    q.push("b", "b1")
    assert q.order() == ["f0", "b0", "c0", "f1", "b1", "f2", "f3"]  # what `pop` will do, shown before it does
    taken = [q.pop() for _ in range(len(q))]
    assert taken == ["f0", "b0", "c0", "f1", "b1", "f2", "f3"]
    assert q.pop() is None and len(q) == 0


def test_a_visitor_served_a_moment_ago_goes_after_one_who_just_came():
    q: FairQueue[str] = FairQueue()
    q.push("flood", "f0")
    q.push("flood", "f1")
    assert q.pop() == "f0"
    q.push("late", "l0")  # came after f1, but its visitor has not been served yet
    assert q.order() == ["l0", "f1"] and q.pop() == "l0"


def test_removal_eligibility_and_counts():
    q: FairQueue[str] = FairQueue()
    for item in ("a0", "a1"):
        q.push("a", item)
    q.push("b", "b0")
    assert q.waiting("a") == 2 and q.waiting("z") == 0
    assert q.remove("a0") and not q.remove("a0")  # a cancelled item leaves without its visitor counting as served
    assert q.peek(lambda key: key != "a") == "b0"  # "a" may not run now (its limit): the next eligible visitor
    assert q.pop(lambda key: key == "nobody") is None
    assert q.drop(lambda item: item.startswith("b")) == ["b0"] and list(q) == ["a1"]


def test_the_visitor_is_carried_by_the_context():
    assert current_visitor() == ANYONE
    with as_visitor("v1"):
        assert current_visitor() == "v1"
    assert current_visitor() == ANYONE


def test_a_long_running_queue_forgets_old_visitors(monkeypatch):
    from explainer.decoding import fair

    monkeypatch.setattr(fair, "REMEMBERED", 4)
    q: FairQueue[int] = FairQueue()
    for i in range(12):
        q.push(i, i)
        q.pop()
    assert len(q._served) <= 5


@pytest.fixture(scope="module")
def model():
    return build_model("llama")


def test_the_batcher_admits_the_visitor_served_least_recently(model, monkeypatch):
    """One row fits at a time (the memory budget); three rows of one visitor wait before one of another: the other's
    row decodes second, not last."""
    engine._batchers.clear()
    ids = {key: DecodeJob(_prompt(seed), [get_method("macs")], 4) for seed, key in enumerate(["a0", "a1", "a2", "b0"])}
    need = max(Row(model, job, None, None).need for job in ids.values())
    monkeypatch.setenv(memory.BUDGET_ENV, str(int(1.5 * need / memory.USABLE)))  # one row fits, two do not
    order: list[str] = []
    prefill = Row.prefill

    def recorded(self, model, others=()):
        order.extend(key for key, job in ids.items() if job is self.job or any(job is o.job for o in others))
        return prefill(self, model, others)

    monkeypatch.setattr(Row, "prefill", recorded)
    errors: list[BaseException] = []

    def visit(key: str) -> None:
        try:
            with as_visitor(key[0]):
                list(batched_steps(model, ids[key]))
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = []
    with _paused(model):
        for i, key in enumerate(ids):
            threads.append(threading.Thread(target=visit, args=(key,)))
            threads[-1].start()
            _wait(lambda i=i: counts(model)[1] == i + 1)  # queued in this order
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert order == ["a0", "b0", "a1", "a2"]  # first come first served would be a0, a1, a2, b0
    engine._batchers.clear()


def _prompt(seed: int) -> torch.Tensor:
    return torch.randint(3, 300, (1, 9 + seed), generator=torch.Generator().manual_seed(seed))  # (1, N)
