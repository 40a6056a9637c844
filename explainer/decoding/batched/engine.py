"""The batcher: one thread per model that owns the decode steps of every text request on it.

Each loop holds the model (`session.hold`, urgent) for one round only: it admits the rows waiting to join (each
one's prefill runs alone, or once for rows with the same prompt; then its cache joins the batch's), drops the rows
that are done or whose visitor left, and runs one decode step for all the others in one forward pass. Decode rounds
are short work and go first (`runtime/turns.py`): while the batcher has rows, long work (a request's post-hoc
methods, an image request) gives the model up between its passes and goes on when no visitor decodes. The thread
ends when no row is left; the next request starts a new one.
"""

from __future__ import annotations

import threading
import time
import weakref
from typing import Any

import torch

from ...runtime.devices import input_device
from ...runtime.kv import batch_budget
from ...runtime.memory import MemoryLimitError, check_fits
from ...runtime.session import hold, model_lock
from ..step import forward_pass
from . import cache as batch_cache
from .attention import rows_apart
from .products import fixed_rows, linear_layers, product_rows
from .row import Row, same_prefill

CPU_ROWS = 16  # rows per decode step on a CPU: a step of 16 short rows still costs about what one row's does
MOST_ROWS = 64  # on an accelerator, at most this many (fewer when its free memory says so, `kv.batch_budget`)
ROOM = 64  # decode positions preallocated in the batch cache at each rebuild (it doubles when full)


class Batcher:
    """The rows decoding on one model: `submit` queues a row, the thread does the rest (see the module docstring)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.device = input_device(model)
        self._cond = threading.Condition()
        self._pending: list[Row] = []
        self._active: list[Row] = []
        self._admitting = 0  # rows taken from `_pending` whose prefill runs now (they decode from the next step)
        self._thread: threading.Thread | None = None
        self._cache = None  # the batch's cache (`cache.gather`), or a lone row's own
        self._linears = linear_layers(model)  # patched for each decode step (`products.fixed_rows`), found once
        self._product_rows = product_rows(self.device)  # rows per product call

    def submit(self, row: Row) -> None:
        with self._cond:
            self._pending.append(row)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="explainer-batcher", daemon=True)
                self._thread.start()

    def counts(self) -> tuple[int, int]:
        """(rows decoding or having their prefill now, rows waiting to join)."""
        with self._cond:
            return len(self._active) + self._admitting, len(self._pending)

    def _loop(self) -> None:
        try:
            with model_lock(self.model).prefer():  # nothing else takes the model between rounds
                while self._work_left():
                    with hold(self.model, urgent=True):
                        self._admit()
                        self._step()
        except BaseException as e:  # every row hears of it; none waits forever
            with self._cond:
                rows, self._active, self._pending, self._thread = self._active + self._pending, [], [], None
                self._cache = None
            for row in rows:
                row.fail(e)

    def _work_left(self) -> bool:
        with self._cond:
            self._pending = [r for r in self._pending if not r.left.is_set()]
            if not self._active and not self._pending:
                self._thread, self._cache = None, None
                return False
            return True

    def _admit(self) -> None:
        """Prefill the waiting rows that fit (in order; a row that does not fit waits for room), then rebuild the
        batch cache with them. Waiting rows with the same prompt as the one admitted (`row.same_prefill`) join with
        it and share its prefill pass."""
        joining: list[Row] = []
        try:
            while True:
                with self._cond:
                    if not self._pending or not self._room_for(self._pending[0], joining):
                        break
                    group = [self._pending.pop(0)]
                    for other in list(self._pending):
                        if same_prefill(group[0], other) and self._room_for(other, joining + group):
                            self._pending.remove(other)
                            group.append(other)
                    self._admitting = len(joining) + len(group)
                group = [r for r in group if not r.left.is_set()]
                if not group:
                    continue
                try:
                    group[0].prefill(self.model, group[1:])
                except Exception as e:  # these rows fail alone
                    for row in group:
                        row.fail(e)
                    continue
                joining += [r for r in group if not r.done]
            if joining:
                self._rebuild(self._active + joining)
        finally:
            with self._cond:
                self._admitting = 0

    def _room_for(self, row: Row, joining: list[Row]) -> bool:
        """Whether `row` may join now: the batch is empty, or it stays within the row cap and every row's need
        together passes the memory check (`memory.check_fits`; rows already decoding count in full, so it errs on the
        side of waiting)."""
        rows = [*self._active, *joining]
        if not rows:
            return True
        t = max(r.n + r.steps for r in [*rows, row])
        most = min(MOST_ROWS, batch_budget(self.model, t, 1, 0, CPU_ROWS)[1])
        if len(rows) + 1 > most:
            return False
        try:
            check_fits({f"row {i}": r.need for i, r in enumerate([*rows, row])}, self.device, "The batch", "")
        except MemoryLimitError:
            return False
        return True

    def _rebuild(self, rows: list[Row]) -> None:
        """The batch cache of `rows` (those already in it and those joining), as wide as the longest of them."""
        rows = [r for r in rows if not r.done and not r.left.is_set()]
        old = self._cache
        if len(rows) == 1 and rows[0].slot is None:
            self._cache, rows[0].cache = rows[0].cache, None  # a lone new row decodes on its own cache, as solo
        elif rows:
            sources = [(r.cache, 0, r.length) if r.slot is None else (old, r.slot, r.length) for r in rows]
            self._cache = batch_cache.gather(sources, min(ROOM, max(r.remaining for r in rows)))
        else:
            self._cache = None
        for i, r in enumerate(rows):
            r.slot, r.cache = i, None
        with self._cond:
            self._active = rows

    def _step(self) -> None:
        """Drop the rows that are done or left, then one decode step of all the others."""
        if any(r.done or r.left.is_set() for r in self._active):
            self._rebuild(self._active)
        rows = self._active
        if not rows:
            return
        t0 = time.perf_counter()
        logits, attention = self._forward(rows)
        for i, row in enumerate(rows):
            try:
                row.decoded(logits[i], None if attention is None else attention[i], t0, len(rows))
            except Exception as e:  # a method that fails fails its row alone
                row.fail(e)

    def _forward(self, rows: list[Row]) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
        """One decode pass of all rows: ((B, V) logits, each row's (L, H, length + 1) attention rows or None), with
        the matrix products at the device's fixed row count (`products.fixed_rows`)."""
        cached = batch_cache.width(self._cache)
        ids = torch.tensor([[r.next_input] for r in rows], dtype=torch.long, device=self.device)  # (B, 1)
        record = any(r.captures for r in rows)
        with fixed_rows(self._linears, self._product_rows):
            return self._forward_fixed(rows, ids, cached, record)

    def _forward_fixed(
        self, rows: list[Row], ids: torch.Tensor, cached: int, record: bool
    ) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
        """A lone row on its own cache runs the solo loop's call (`decoding.step.forward_pass`); otherwise attention
        runs row by row (`attention.rows_apart`)."""
        if len(rows) == 1 and rows[0].length == cached:
            consumer = None if record else False  # False: no capture
            logits, attention = forward_pass(self.model, ids, self._cache, {}, consumer, cached + 1)
            return logits[None], None if attention is None else [attention]
        mask, positions = batch_cache.decode_inputs([r.length for r in rows], cached, self.device)
        call = dict(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=self._cache)
        with rows_apart(self.model, [r.length + 1 for r in rows], record) as recorded:
            logits = self.model(**call, use_cache=True, logits_to_keep=1).logits[:, -1]  # (B, V)
        if not record:
            return logits, None
        layers = sorted(recorded)
        return logits, [torch.stack([recorded[layer][i][0] for layer in layers]) for i in range(len(rows))]


_batchers: weakref.WeakKeyDictionary[Any, Batcher] = weakref.WeakKeyDictionary()
_guard = threading.Lock()


def batcher_for(model: torch.nn.Module) -> Batcher:
    """The process-wide batcher of one loaded model (created on first use)."""
    with _guard:
        batcher = _batchers.get(model)
        if batcher is None:
            batcher = _batchers[model] = Batcher(model)
        return batcher


def counts(model: torch.nn.Module) -> tuple[int, int]:
    """(rows decoding, rows waiting to join) on `model`; (0, 0) where no text request has used it."""
    with _guard:
        batcher = _batchers.get(model)
    return (0, 0) if batcher is None else batcher.counts()
