"""The batcher: one thread per model that owns the decode steps of every text request on it.

Each loop holds the model (`session.hold`, urgent) for one round only: it admits the rows waiting to join (each
one's prefill runs alone, or once for rows with the same prompt; then its cache takes a free slot of the batch's,
`slots.Slots`), frees the slots of the rows that are done or whose visitor left, and runs one decode step of all the
others (`fixed.BatchStep`: row by row on a CPU, one CUDA graph replay on CUDA). Decode rounds are short work and go
first (`runtime/turns.py`): while the batcher has rows, long work (a request's post-hoc methods, an image request)
gives the model up between its passes and goes on when no visitor decodes. The thread ends when no row is left; the
next request starts a new one.
"""

from __future__ import annotations

import threading
import time
import weakref
from typing import Any

import torch

from ...runtime.devices import input_device
from ...runtime.host import to_numpy
from ...runtime.kv import batch_budget
from ...runtime.memory import MemoryLimitError, ModelShape, check_fits, language_config
from ...runtime.session import hold, model_lock
from ..fair import FairQueue, current_visitor
from .fixed import BatchStep
from .row import Row, same_prefill
from .slots import Layout, Slots, slot_count

CPU_ROWS = 16  # rows per decode step on a CPU: a step of 16 short rows still costs about what one row's does
MOST_ROWS = 64  # on an accelerator, at most this many (fewer when its free memory says so, `kv.batch_budget`)
ROOM = 64  # row by row, a slot's positions grow in steps of this many
GRAPH_POSITIONS = 256  # in the fixed shape, a slot holds a power of two positions, at least this many


class Batcher:
    """The rows decoding on one model: `submit` queues a row, the thread does the rest (see the module docstring)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.device = input_device(model)
        self._cond = threading.Condition()
        self._pending: FairQueue[Row] = FairQueue()  # the visitor served least recently joins first (`fair.py`)
        self._active: list[Row] = []
        self._admitting = 0  # rows taken from `_pending` whose prefill runs now (they decode from the next step)
        self._thread: threading.Thread | None = None
        self._runner: threading.Thread | None = None  # the last thread started, kept after it ends (`join`)
        self._slots: Slots | None = None  # the batch's slots while it has rows
        self._step: BatchStep | None = None  # in the form of the request that started the thread

    def submit(self, row: Row, form: str) -> None:
        """Queue `row`; `form`: its request's `DecodeChoice.form`, the batch's when no row decodes (a batch that
        decodes keeps its own form)."""
        with self._cond:
            if self._thread is None and (self._step is None or self._step.form != form):
                self._step = BatchStep(self.model, form)
            row.on_device = self._step.shape_fixed and row.device_capable  # its methods run inside the batch's step
            self._pending.push(current_visitor(), row)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="explainer-batcher", daemon=True)
                self._runner = self._thread
                self._thread.start()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the thread to end (it ends when no row is left); whether it has. A process should do this before
        it exits: a daemon thread still inside PyTorch when the interpreter shuts down aborts the process
        ("terminate called without an active exception", seen after every crowd on an H200)."""
        with self._cond:
            thread = self._runner
        if thread is not None:
            thread.join(timeout)
        return thread is None or not thread.is_alive()

    def counts(self) -> tuple[int, int]:
        """(rows decoding or having their prefill now, rows waiting to join)."""
        with self._cond:
            return len(self._active) + self._admitting, len(self._pending)

    def _loop(self) -> None:
        try:
            # Grad mode is per thread and on in a new one: without this every round recorded autograd's graph.
            with torch.inference_mode(), model_lock(self.model).prefer():  # nothing else takes the model between rounds
                while self._work_left():
                    with hold(self.model, urgent=True):
                        self._admit()
                        self._decode()
        except BaseException as e:  # every row hears of it; none waits forever
            with self._cond:
                rows, self._active, self._thread = self._active + list(self._pending), [], None
                self._pending = FairQueue()
                self._slots = None
            for row in rows:
                row.fail(e)

    def _work_left(self) -> bool:
        with self._cond:
            self._pending.drop(lambda r: r.left.is_set())
            if not self._active and not self._pending:
                self._thread, self._slots = None, None
                return False
            return True

    def _admit(self) -> None:
        """Prefill the waiting rows that fit (in the fair queue's order, `fair.py`; a row that does not fit waits
        for room), then give them slots.
        Waiting rows with the same prompt as the one admitted (`row.same_prefill`) join with it and share its prefill
        pass."""
        joining: list[Row] = []
        try:
            while True:
                with self._cond:
                    first = self._pending.peek()
                    if first is None or not self._room_for(first, joining):
                        break
                    group = [self._pending.pop()]
                    for other in list(self._pending):
                        if same_prefill(group[0], other) and self._room_for(other, joining + group):
                            group.append(self._pending.take(other))
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
                self._place(joining)
        finally:
            with self._cond:
                self._admitting = 0

    def _sizes(self, rows: list[Row]) -> tuple[int, int]:
        """(S, C) of slots that hold `rows`: S a power of two, C the longest row's positions rounded up (to a power
        of two in the fixed shape, whose graph is recorded per C)."""
        need = max(r.n + r.steps - 1 for r in rows)
        if self._step.shape_fixed:
            return slot_count(len(rows)), slot_count(max(need, GRAPH_POSITIONS))
        return slot_count(len(rows)), -(-need // ROOM) * ROOM

    def _room_for(self, row: Row, joining: list[Row]) -> bool:
        """Whether `row` may join now: the batch is empty, or it stays within the row cap and every row's need
        together, with the slots' unused positions, passes the memory check (`memory.check_fits`; rows already
        decoding count in full, so it errs on the side of waiting)."""
        rows = [*self._active, *joining]
        if not rows:
            return True
        t = max(r.n + r.steps for r in [*rows, row])
        most = min(MOST_ROWS, batch_budget(self.model, t, 1, 0, CPU_ROWS)[1])
        if len(rows) + 1 > most:
            return False
        parts = {f"row {i}": r.need for i, r in enumerate([*rows, row])}
        parts["the slots' unused positions"] = self._slack([*rows, row])
        try:
            check_fits(parts, self.device, "The batch", "")
        except MemoryLimitError:
            return False
        return True

    def _slack(self, rows: list[Row]) -> int:
        """Bytes the slots of `rows` hold beyond the rows' own needs: their unused cache positions."""
        try:
            shape = ModelShape.of(self.model)
        except (AttributeError, TypeError):
            return 0
        slots, capacity = self._sizes(rows)
        if self._slots is not None:
            slots, capacity = max(slots, self._slots.size), max(capacity, self._slots.capacity)
        return max(0, shape.kv_bytes(slots * capacity) - sum(shape.kv_bytes(r.n + r.steps) for r in rows))

    def _place(self, joining: list[Row]) -> None:
        """Free the slots of rows that are done or left, then give each joining row a slot (growing the slots when
        none is free or a row needs more positions)."""
        self._drop_finished()
        rows = self._active + joining
        slots, capacity = self._sizes(rows)
        text = language_config(self.model)
        keep_rows = self._step.shape_fixed and any(r.keeps_rows for r in rows)
        rows_shape = (text.num_hidden_layers, text.num_attention_heads) if keep_rows else None
        outputs = max((len(r.streaming) for r in rows if r.on_device), default=0)  # each one's methods' rows
        state = self._slots
        if state is None:
            state = Slots(Layout.of(joining[0].cache), slots, capacity, rows_shape, outputs)
        elif (
            state.size < slots
            or state.capacity < capacity
            or (keep_rows and state.rows is None)
            or state.outputs < outputs
        ):
            grown_rows = rows_shape or (None if state.rows is None else tuple(state.rows.shape[1:3]))
            size, capacity = max(slots, state.size), max(capacity, state.capacity)
            state = state.grown(size, capacity, grown_rows, max(outputs, state.outputs))
        for r in joining:
            r.slot = state.join(r.cache, r.length, r.next_input)
            r.cache = None
        self._slots = state
        with self._cond:
            self._active = rows

    def _drop_finished(self) -> None:
        """Free the slots of the rows that are done or whose visitor left."""
        keep = []
        for r in self._active:
            if r.done or r.left.is_set():
                self._slots.leave(r.slot)
            else:
                keep.append(r)
        with self._cond:
            self._active = keep

    def _decode(self) -> None:
        """Drop the rows that are done or left, then one decode step of all the others."""
        self._drop_finished()
        rows = self._active
        if not rows:
            return
        state = self._slots
        forced, lengths = [-1] * state.size, [None] * state.size
        for r in rows:
            forced[r.slot], lengths[r.slot] = r.forced_next, r.length + 1
        state.forced.copy_(torch.tensor(forced))
        t0 = time.perf_counter()
        on_device = [r for r in rows if r.on_device]
        attention = self._step.run(state, lengths, any(r.keeps_rows for r in rows), on_device)
        stats = to_numpy(state.stats)  # (S, 3 + 2A): the step's one read, and one more where rows work on the device
        outs = to_numpy(state.outs[:, :, : max(r.n for r in on_device)]) if on_device else None  # (S, M, N_max)
        for row in rows:
            if row.done:  # its device work failed in this step
                continue
            try:
                given = outs[row.slot] if row.on_device else attention.get(row.slot)
                row.decoded(stats[row.slot], given, t0, len(rows))
            except Exception as e:  # a method that fails fails its row alone
                row.fail(e)


_batchers: weakref.WeakKeyDictionary[Any, Batcher] = weakref.WeakKeyDictionary()
_guard = threading.Lock()


def batcher_for(model: torch.nn.Module) -> Batcher:
    """The process-wide batcher of one loaded model (created on first use)."""
    with _guard:
        batcher = _batchers.get(model)
        if batcher is None:
            batcher = _batchers[model] = Batcher(model)
        return batcher


def finish(model: torch.nn.Module, timeout: float | None = None) -> bool:
    """Wait until `model`'s batcher thread has ended (`Batcher.join`); True where none was started."""
    with _guard:
        batcher = _batchers.get(model)
    return True if batcher is None else batcher.join(timeout)


def counts(model: torch.nn.Module) -> tuple[int, int]:
    """(rows decoding, rows waiting to join) on `model`; (0, 0) where no text request has used it."""
    with _guard:
        batcher = _batchers.get(model)
    return (0, 0) if batcher is None else batcher.counts()
