"""One visitor's row of the batched decode: its prefill (alone, at batch size 1, as the solo loop runs it) and what
it makes of each decode step's logits and attention rows (its own methods, sink tracker, forced ids or argmax, eos,
number of steps).

Where the batch's step has the fixed shape (a CUDA graph) and every streaming method of the row has a device step
(MACS, calibrated MACS, Rollout: `has_device_step`), the row runs them on the device inside that step (`on_device`,
`device_work`): each method's row goes to its slot's part of the step's output buffer (`Slots.outs`), which the
batcher reads with the token statistics, and the sink shares are summed in place, handed to the tracker when the row
ends. So a decode step costs a row no eager launches and no read of its own: the graph records its work once
(the batch records a new graph when its rows change). Otherwise each step's methods run eagerly on the rows the
step hands over, as the solo loop runs them.

Rows with the same prompt that join together (`same_prefill`: a crowd pressing the same example) share that prefill:
one pass at batch size 1, whose logits, attention rows and cache each of them takes as its own. It is the pass each
would run alone, so their numbers are those of a lone prefill, bit for bit; each row's own methods, sink tracker and
answer (a given one or the argmax) read it.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Callable, Sequence

import numpy as np
import torch
from transformers import DynamicCache

from ...methods import AttributionMethod
from ...result.sinks import SinkTracker
from ...runtime.host import to_numpy
from ...runtime.memory import MemoryRequest, request_bytes
from ..choice import BATCHED
from ..job import DecodeJob
from ..state import DeviceWork
from ..step import ends, forward_pass, full_row_consumer, make_step, method_scores, token_stats


class Row:
    """A request's decode state; the batcher thread alone changes it, the request's thread reads `out` and sets
    `left`.

    Attributes:
        out: ("step", Step), then ("done", None) or ("error", exception), in order.
        left: set by the request's thread when it stops reading (cancelled, closed, failed): the batcher drops the row
            before its next step.
        length: the row's own cached positions (prompt and fed answer tokens).
        slot: its slot in the batch (`slots.Slots`), None before it joins.
        largest_batch: the most rows any of its steps shared a forward pass with (itself included).
        on_device: whether its methods run inside the batch's step (set by the batcher before the prefill; see the
            module docstring).
        serial: unique per row (a batch's graph that records a row's work is replayed with that very row alone).
    """

    _serials = itertools.count()

    def __init__(
        self,
        model: torch.nn.Module,
        job: DecodeJob,
        method_seconds: dict[str, float] | None,
        sinks: SinkTracker | None,
    ) -> None:
        self.job = job
        self.steps = job.num_steps
        self.input_ids = input_ids = job.input_ids  # (1, N)
        self.n = input_ids.shape[1]
        self.streaming = [m for m in job.methods if m.streaming]
        self.method_seconds = method_seconds
        self.sinks = sinks
        self.out: queue.Queue = queue.Queue()
        self.left = threading.Event()
        self.k = 0  # steps delivered
        self.length = 0
        self.next_input = -1
        self.done = False
        self.slot: int | None = None
        self.cache: DynamicCache | None = None  # its own cache between the prefill and taking a slot
        self.largest_batch = 0
        self.prefill_rows = 0  # rows that took their step 0 from its prefill pass, itself included
        self.need = _row_bytes(model, self.n, self.steps, self.streaming)
        self.serial = next(Row._serials)
        self.on_device = False
        self.work: DeviceWork | None = None  # where its methods run on the device: their state, made at the prefill
        self._order = {id(m): i for i, m in enumerate(self.streaming)}  # a method's place in the rows of its outputs

    @property
    def device_capable(self) -> bool:
        """Whether every streaming method of the row has a device step (there is at least one)."""
        return bool(self.streaming) and all(m.has_device_step for m in self.streaming)

    @property
    def keeps_rows(self) -> bool:
        """Whether the row keeps each step's attention rows (it has a streaming method)."""
        return bool(self.streaming)

    def prefill(self, model: torch.nn.Module, others: Sequence[Row] = ()) -> None:
        """Step 0 exactly as the solo loop runs it: the prompt alone, at batch size 1, with capture (and the full
        rows for methods such as Rollout, and the hidden-state norms for the sink tracker).

        Args:
            others: rows with the same prompt (`same_prefill`) that take their step 0 from this very pass: their
                methods get its full rows and attention rows, their sink trackers its record, and they join the batch
                from its cache (each slot copies it, `Slots.join`).
        """
        rows = [row for row in (self, *others) if row._begin()]
        if not rows:
            return
        lead = rows[0]  # the pass runs on its ids, cache and sink tracker
        full_rows = full_row_consumer([m for r in rows for m in r.streaming])
        lead.cache = DynamicCache(config=model.config)
        t0 = time.perf_counter()
        logits, attention = forward_pass(
            model, lead.input_ids, lead.cache, {}, lead.n, keep_rows=lead.keeps_rows, full_rows=full_rows,
            sinks=lead.sinks, prefill=True,
        )  # fmt: skip
        for row in rows:
            if row is not lead:
                row.cache = lead.cache
                if row.sinks is not None:
                    row.sinks.take_prefill(lead.sinks)
            row.length = row.n
            row.largest_batch = max(row.largest_batch, 1)
            row.prefill_rows = len(rows)
            try:
                given = row.forced_next  # step 0's given token, -1 for the argmax
                forced = None if given < 0 else torch.tensor([given], device=row.input_ids.device)  # (1,)
                stats = token_stats(logits, forced)[1].tolist()  # the step's one read
                if row.on_device:
                    row.emit(stats, row._start_on_device(attention), t0)
                else:
                    row.emit(stats, lambda m: m.step(attention), t0)
            except Exception as e:  # a method that fails fails its row alone
                row.fail(e)

    def _begin(self) -> bool:
        """Start the row's streaming methods on its prompt; a method that fails fails the row alone (False)."""
        try:
            for m in self.streaming:
                m.begin(self.n)
        except Exception as e:
            self.fail(e)
            return False
        return True

    def _start_on_device(self, attention: torch.Tensor) -> Callable[[AttributionMethod], np.ndarray]:
        """Step 0 of a row whose methods run on the device: their device steps on the prefill's (L, H, N) rows,
        widened to the N + K - 1 positions of every later step (zeros after the prompt, as a static cache's); the
        buffers they keep are made here. Returns each method's scoring of the step (read on the host)."""
        layers, device = attention.shape[0], attention.device
        rows = torch.nn.functional.pad(attention, (0, self.n + self.steps - 1 - attention.shape[-1]))  # (L, H, T)
        self.work = DeviceWork(self.streaming, self.n, self.steps, layers, device, self.sinks)
        outs = [to_numpy(row) for row in self.work.scores(rows)]
        self.work.advance()
        return lambda m: m.finish_step(outs[self._order[id(m)]])

    def device_work(self, rows: torch.Tensor, outs: torch.Tensor) -> None:
        """A decode step's work of a row whose methods run on the device, inside the batch's step (a graph records
        it): each method's row into `outs` (M, C) float64, its slot's part of `Slots.outs`, and the sink shares
        summed in place; no host read.

        Args:
            rows: (L, H, C) its slot's attention rows of the step (`Slots.rows`), keys after its query exactly 0.
        """
        rows = rows[..., : self.n + self.steps - 1]  # (L, H, T): the positions its buffers were made for
        for i, row in enumerate(self.work.scores(rows)):
            outs[i, : row.shape[0]].copy_(row)
        self.work.gather_sinks(rows)
        self.work.advance()

    def decoded(self, stats: Sequence[float], rows: torch.Tensor | np.ndarray | None, t0: float, batch: int) -> None:
        """A decode step's `token_stats` row (read on the host) and either the row's (L, H, length + 1) attention rows
        (its slot's unused positions cut off) or None, or, on the device, its slot's (M, C) part of `Slots.outs`, read
        on the host."""
        self.length += 1
        self.largest_batch = max(self.largest_batch, batch)
        if self.on_device:
            self.emit(stats, lambda m: m.finish_step(rows[self._order[id(m)], : self.n]), t0)
            return
        if rows is not None and self.sinks is not None:
            self.sinks.add(rows)
        self.emit(stats, lambda m: m.step(rows), t0)

    def emit(self, stats: Sequence[float], score: Callable[[AttributionMethod], np.ndarray], t0: float) -> None:
        """Step k from its statistics and each method's `score`: the methods' rows, the step handed to the request,
        the next input and the stop rule."""
        seconds = time.perf_counter() - t0
        scores = method_scores(self.streaming, score, self.method_seconds)
        step = make_step(self.k, stats, scores, seconds, BATCHED)
        self.k += 1
        self.next_input = step.token_id
        self.done = ends(self.k, step.token_id, self.steps, self.job.stop_ids)
        if self.done and self.on_device:
            self.work.finish(self.k)  # the decode steps gathered in place
        self.out.put(("step", step))
        if self.done:
            self.out.put(("done", None))

    @property
    def forced_next(self) -> int:
        """The given answer's token for the next step, or -1 (the argmax)."""
        return self.job.forced_at(self.k)

    def fail(self, error: BaseException) -> None:
        self.done = True
        self.out.put(("error", error))

    @property
    def remaining(self) -> int:
        return self.steps - self.k


def same_prefill(a: Row, b: Row) -> bool:
    """Whether `b` may take its step 0 from `a`'s prefill pass: the same prompt ids, and the same pass (both capture
    attention or neither, both track sinks or neither)."""
    return (
        a.n == b.n
        and a.keeps_rows == b.keeps_rows
        and (a.sinks is None) == (b.sinks is None)
        and torch.equal(a.input_ids, b.input_ids)
    )


def _row_bytes(model: torch.nn.Module, n: int, k: int, streaming: list[AttributionMethod]) -> int:
    """What the row's decode needs (`memory.request_bytes` of its streaming methods); 0 for a model whose shape the
    estimates cannot read."""
    try:
        request = MemoryRequest.of(model, n, k)
    except (AttributeError, TypeError):
        return 0
    return sum(request_bytes(request, list(streaming)).values())
