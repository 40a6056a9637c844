"""The batch's decode step over its slots (`slots.Slots`): one forward pass of every slot, its tokens and their
statistics, written once and run in one of three ways.

- **Eager, row by row** (the CPU's default): attention per active slot on its own keys (`attention.rows_apart`),
  token statistics for the active slots; what the batch did before it had slots, at the same cost.
- **Eager, fixed shape**: every slot's attention in one masked call over the slot's C positions
  (`attention.fixed_shape`), token statistics for every slot: the work a graph records, run eagerly (on CUDA after a
  failed capture; on a CPU for the tests).
- **CUDA graph** (CUDA's default): that fixed-shape step recorded once per slot state (S, C, and whether attention
  rows are kept) and replayed; the host writes the forced ids before a replay and reads the statistics after it.

In the fixed shape (and so in its graph) the rows whose methods run on the device (`row.Row.on_device`) do that
work inside the step (`Row.device_work`): the graph is then recorded per slot state and set of such rows, and a row
whose work fails in the step's eager run fails alone.

In every form the matrix products run at a fixed row count (`products.fixed_rows`), so a row's numbers do not depend
on how many others decode beside it: row by row, not on S or C; in the fixed shape, on C alone.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import torch

from ...runtime.devices import input_device
from ..choice import remember_graph_failure
from .attention import fixed_shape, rows_apart
from .products import fixed_rows, linear_layers, product_rows
from .row import Row
from .slots import Slots


class BatchStep:
    """How one model's batch runs its decode step (see the module docstring)."""

    def __init__(self, model: torch.nn.Module, shape_fixed: bool, graphs: bool) -> None:
        self.model = model
        self.shape_fixed = shape_fixed or graphs
        self.graphs = graphs
        self._linears = linear_layers(model)  # patched for each step (`products.fixed_rows`), found once
        self._product_rows = product_rows(input_device(model))
        self._graph: torch.cuda.CUDAGraph | None = None
        self._graph_of: tuple | None = None  # (`Slots.serial`, rows kept, `Row.serial`s on the device) it records

    def run(
        self, slots: Slots, lengths: list[int | None], record: bool, on_device: Sequence[Row] = ()
    ) -> dict[int, torch.Tensor]:
        """One decode step of every active slot: `slots.stats` and `slots.token_in` hold each slot's result, the active
        slots' positions advance.

        Args:
            lengths: per slot, its positions after this step (None: a free slot), as the host counts them.
            record: whether a row keeps attention rows.
            on_device: the rows whose methods run inside the step (fixed shape only; `Row.device_work`), their
                outputs in `slots.outs`; one whose work fails in an eager run is failed (`Row.fail`).

        Returns:
            slot -> its (L, H, length) float32 attention rows when `record` (views of `slots.rows` in the fixed shape:
            read them before the next step), else empty.
        """
        if not self.shape_fixed:
            return self._rows_apart(slots, lengths, record)
        keep = record and slots.rows is not None
        on_device = list(on_device) if keep else []
        if self.graphs and self._graph_of == (slots.serial, keep, tuple(r.serial for r in on_device)):
            self._graph.replay()
        elif self.graphs:
            self._capture(slots, keep, on_device)  # runs this step, then records the next
        else:
            self._fixed(slots, keep, on_device)
        if not keep:
            return {}
        return {s: slots.rows[s, :, :, :n] for s, n in enumerate(lengths) if n is not None}

    def _forward(self, slots: Slots, mask: torch.Tensor | None = None) -> torch.Tensor:
        """(S, V) next-token logits of every slot, products at the fixed row count; `mask`: `slots.mask()` where the
        caller has it."""
        mask = slots.mask() if mask is None else mask
        call = dict(input_ids=slots.token_in, attention_mask=mask, position_ids=slots.positions[:, None])
        with fixed_rows(self._linears, self._product_rows):
            return self.model(**call, past_key_values=slots.cache, use_cache=True, logits_to_keep=1).logits[:, -1]

    def _rows_apart(self, slots: Slots, lengths: list[int | None], record: bool) -> dict[int, torch.Tensor]:
        with rows_apart(self.model, lengths, record) as recorded:
            logits = self._forward(slots)
        slots.record_tokens(logits, [s for s, n in enumerate(lengths) if n is not None])
        if not record:
            return {}
        layers = sorted(recorded)
        return {s: torch.stack([recorded[la][s][0] for la in layers]) for s, n in enumerate(lengths) if n is not None}

    def _fixed(self, slots: Slots, keep: bool, on_device: list[Row], recording: bool = False) -> None:
        """The fixed-shape step, eagerly: what the graph records. Eagerly a row whose device work fails is failed
        and left out of `on_device` (the list changes); while `recording` its error ends the recording."""
        mask = slots.mask()  # (S, 1, 1, C)
        with fixed_shape(self.model, slots if keep else None):
            logits = self._forward(slots, mask)
        if keep:
            slots.write_rows(mask[:, 0, 0])  # (S, C)
        slots.record_tokens(logits, None)
        for row in list(on_device):
            try:
                row.device_work(slots.rows[row.slot], slots.outs[row.slot])
            except Exception as e:
                if recording:
                    raise
                row.fail(e)
                on_device.remove(row)

    def _capture(self, slots: Slots, keep: bool, on_device: list[Row]) -> None:
        """One real step on a side stream (it loads every kernel), then the next recorded, not run; where the capture
        fails the model is remembered (`choice.graph_failure`) and the step runs eagerly from now on."""
        self._graph = self._graph_of = None
        device = slots.positions.device
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            self._fixed(slots, keep, on_device)  # rows whose work fails leave the list: the graph records the others
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):  # other models may run meanwhile
                self._fixed(slots, keep, on_device, recording=True)
        except torch.cuda.OutOfMemoryError:
            raise  # not the graph's fault: the batch does not fit
        except RuntimeError as e:  # an op that cannot be captured: the same step, eagerly
            remember_graph_failure(self.model, f"{type(e).__name__}: {e}")
            warnings.warn(f"CUDA graph capture failed, the batch decodes without graphs: {e}", RuntimeWarning, 2)
            self.graphs = False
            return
        self._graph, self._graph_of = graph, (slots.serial, keep, tuple(r.serial for r in on_device))
