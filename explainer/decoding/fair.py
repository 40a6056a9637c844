"""Fair admission: the next request to run comes from the visitor served least recently, not the oldest request.

A visitor is an opaque key (the app's is the Gradio session or, behind a trusted proxy, the client's address:
`ui/guards/visitors.py`; a script's threads may use any hashable). The rule, round robin in effect: each visitor carries
the stamp of the last time one of its requests was taken; `FairQueue.pop` takes the oldest waiting request of the
visitor with the lowest stamp (one never served first; ties go to the visitor whose oldest request came first). A flood
of requests from one visitor is then served one at a time between everyone else's.

The code that makes a request names its visitor for everything it runs (`as_visitor`); the library's worker threads
copy the context (`runtime.session.run_in_worker`), so the batched decode reads it where it queues a row
(`batched/engine.py`), and the app's admission gate (`ui/guards/admission.py`) orders its waiting requests with the same
queue.
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
from collections.abc import Callable, Hashable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")

REMEMBERED = 10_000  # visitors whose last service a queue remembers (a long-running app meets many)
ANYONE = "anyone"  # the visitor of code that names none (a script, a notebook): all its requests are one visitor's
_visitor: contextvars.ContextVar[Hashable] = contextvars.ContextVar("explainer_visitor", default=ANYONE)


@contextlib.contextmanager
def as_visitor(key: Hashable) -> Iterator[None]:
    """Run the block (and the library work it starts) on behalf of visitor `key`."""
    token = _visitor.set(key)
    try:
        yield
    finally:
        _visitor.reset(token)


def current_visitor() -> Hashable:
    """The visitor the current context works for (`ANYONE` where none was named)."""
    return _visitor.get()


class FairQueue(Generic[T]):
    """Waiting items by visitor, taken in the order of the module docstring's rule. Not thread-safe: its owner
    holds its own lock around every call."""

    def __init__(self) -> None:
        self._waiting: dict[Hashable, list[tuple[int, T]]] = {}  # each visitor's items, oldest first, with arrival
        self._served: dict[Hashable, int] = {}  # the stamp of each visitor's last item taken
        self._clock = itertools.count(1)

    def __len__(self) -> int:
        return sum(len(items) for items in self._waiting.values())

    def __contains__(self, item: object) -> bool:
        return any(other is item for items in self._waiting.values() for _, other in items)

    def __iter__(self) -> Iterator[T]:
        """Every waiting item, in the order `pop` would take them."""
        return iter(self.order())

    def push(self, key: Hashable, item: T) -> None:
        if len(self._served) > REMEMBERED:  # forget the older half of the visitors with nothing waiting
            idle = sorted((stamp, k) for k, stamp in self._served.items() if k not in self._waiting)
            for _, k in idle[: len(idle) // 2]:
                del self._served[k]  # a forgotten visitor counts as never served
        self._waiting.setdefault(key, []).append((next(self._clock), item))

    def waiting(self, key: Hashable) -> int:
        """How many items of visitor `key` wait."""
        return len(self._waiting.get(key, ()))

    def remove(self, item: T) -> bool:
        """Take `item` out without serving its visitor (it was cancelled); whether it was waiting."""
        for key, items in self._waiting.items():
            for i, (_, other) in enumerate(items):
                if other is item:
                    del items[i]
                    if not items:
                        del self._waiting[key]
                    return True
        return False

    def drop(self, gone: Callable[[T], bool]) -> list[T]:
        """Remove (unserved) and return every item for which `gone(item)`."""
        out = [item for items in self._waiting.values() for _, item in items if gone(item)]
        for item in out:
            self.remove(item)
        return out

    def order(self, eligible: Callable[[Hashable], bool] | None = None) -> list[T]:
        """The waiting items in the order `pop` would take them if nothing else arrived (the queue position a visitor
        is shown), only those of visitors for which `eligible(key)` (default: all)."""
        served = dict(self._served)
        clock = itertools.count(max(served.values(), default=0) + 1)
        heads = {k: list(items) for k, items in self._waiting.items() if eligible is None or eligible(k)}
        out = []
        while heads:
            key = min(heads, key=lambda k: (served.get(k, 0), heads[k][0][0]))
            out.append(heads[key].pop(0)[1])
            served[key] = next(clock)
            if not heads[key]:
                del heads[key]
        return out

    def peek(self, eligible: Callable[[Hashable], bool] | None = None) -> T | None:
        """The item `pop` would take, left in place (None when none waits)."""
        key = self._next_key(eligible)
        return None if key is None else self._waiting[key][0][1]

    def pop(self, eligible: Callable[[Hashable], bool] | None = None) -> T | None:
        """Take the next item (see the module docstring) of a visitor for which `eligible(key)`; None when none
        waits. Its visitor counts as served now."""
        key = self._next_key(eligible)
        if key is None:
            return None
        return self.take(self._waiting[key][0][1])

    def take(self, item: T) -> T:
        """Take `item` out of the queue and count its visitor as served now (a row joining another's prefill)."""
        for key, items in self._waiting.items():
            if any(other is item for _, other in items):
                self.remove(item)
                self._served[key] = next(self._clock)
                return item
        raise KeyError("the item is not waiting")

    def _next_key(self, eligible: Callable[[Hashable], bool] | None) -> Hashable | None:
        keys = [k for k in self._waiting if eligible is None or eligible(k)]
        if not keys:
            return None
        return min(keys, key=lambda k: (self._served.get(k, 0), self._waiting[k][0][0]))
