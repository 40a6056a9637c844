"""Whose turn it is on a model: its lock, with short work first.

Every use of a model waits for its `ModelLock` (`session.hold`). Who gets it when it frees:

1. the batched decode (`urgent`): a round of decode steps of every visitor's text request, a fraction of a second.
   While the batcher has rows (`prefer`), nothing else takes the model between its rounds;
2. then the waiting request with the smallest estimated time (`seconds`: a batched request's post-hoc methods,
   `explainer.estimate`), those without an estimate last, each group in order of arrival.

Long work gives the model up between its forward passes when something goes before it (`session.between_passes`:
AtMan's and Sources' passes, the gradient methods' backward passes, the faithfulness curves' passes, a solo decode's
steps, the image-reliance passes) and queues again with its remaining estimate. So a text visitor is never stuck
behind someone's minute of AtMan: the decode rounds run between AtMan's passes, and AtMan goes on when no visitor
is decoding.

Each waiting request can read its place (`place`): its position among the waiting ones and the estimated seconds of
the work ahead of it (the holder's remaining estimate and the estimates of those before it; None when some of it has
no estimate).
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any

POLL_SECONDS = 0.05  # how often a waiting request looks at its cancel token
_arrivals = itertools.count()


@dataclass(eq=False)
class Ticket:
    """One request's claim on the model: its cancel token, its estimate, when it started holding."""

    token: Any
    seconds: float | None = None
    order: int = field(default_factory=lambda: next(_arrivals))
    started: float | None = None

    def rank(self) -> tuple[float, int]:
        return (math.inf if self.seconds is None else self.seconds, self.order)

    def remaining(self) -> float | None:
        if self.seconds is None or self.started is None:
            return self.seconds
        return max(0.0, self.seconds - (time.monotonic() - self.started))


class ModelLock:
    """A model's lock: not re-entrant (`session.hold` handles re-entry), granted short work first (module docstring)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._busy = False
        self._urgent = 0  # urgent requests waiting now
        self._preferred = 0  # `prefer` blocks open: the batcher has rows
        self._queue: list[Ticket] = []  # requests waiting, not urgent
        self.holder: Ticket | None = None

    @property
    def waiting(self) -> int:
        """Requests waiting for the model now."""
        with self._cond:
            return self._urgent + len(self._queue)

    def locked(self) -> bool:
        return self._busy

    def acquire(self, cancel: Any = None, urgent: bool = False, seconds: float | None = None) -> Ticket:
        """Wait for the model's turn (see the module docstring) and take it; `cancel` (a `CancelToken`) stops the
        wait with its error."""
        ticket = Ticket(cancel, seconds)
        with self._cond:
            if urgent:
                self._urgent += 1
            else:
                self._queue.append(ticket)
            try:
                while not self._my_turn(ticket, urgent):
                    self._cond.wait(POLL_SECONDS)
                    if cancel is not None:
                        cancel.raise_if_cancelled()
                self._busy, self.holder = True, ticket
                ticket.started = time.monotonic()
            finally:
                if urgent:
                    self._urgent -= 1
                else:
                    self._queue.remove(ticket)
                self._cond.notify_all()
        return ticket

    def _my_turn(self, ticket: Ticket, urgent: bool) -> bool:
        if self._busy:
            return False
        if urgent:
            return True
        return not self._urgent and not self._preferred and min(self._queue, key=Ticket.rank) is ticket

    def release(self) -> None:
        with self._cond:
            self._busy, self.holder = False, None
            self._cond.notify_all()

    def should_yield(self) -> bool:
        """Whether the holder should give the model up now: urgent work waits for it, or will (the batcher has rows)."""
        return bool(self._urgent or self._preferred)

    def prefer(self) -> _Preference:
        """A block during which urgent work (the batcher's rounds) keeps the model between its turns."""
        return _Preference(self)

    def place(self, token: Any) -> tuple[int, float | None] | None:
        """(1-based position among the waiting requests, estimated seconds of the work ahead) of the request with
        this cancel token, or None when it is not waiting."""
        with self._cond:
            mine = next((t for t in self._queue if t.token is token and token is not None), None)
            if mine is None:
                return None
            ahead = [t for t in self._queue if t.rank() < mine.rank()]
            parts = [t.seconds for t in ahead] + ([self.holder.remaining()] if self.holder is not None else [])
            seconds = None if any(p is None for p in parts) else float(sum(parts))
            return len(ahead) + 1, seconds


class _Preference:
    def __init__(self, lock: ModelLock) -> None:
        self.lock = lock

    def __enter__(self) -> None:
        with self.lock._cond:
            self.lock._preferred += 1

    def __exit__(self, *exc: object) -> None:
        with self.lock._cond:
            self.lock._preferred -= 1
            self.lock._cond.notify_all()
