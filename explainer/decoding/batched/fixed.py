"""The batch's decode step over its slots (`slots.Slots`): one forward pass of every slot, its tokens and their
statistics, written once and run in one of three ways.

- **Eager, row by row** (form `dynamic`, the CPU's default): attention per active slot on its own keys
  (`attention.rows_apart`), token statistics for the active slots; what the batch did before it had slots, at the
  same cost.
- **Eager, fixed shape** (`fixed-shape`): every slot's attention in one masked call over the slot's C positions
  (`attention.fixed_shape`), token statistics for every slot: the work a graph records, run eagerly (on CUDA after a
  failed capture; on a CPU for the tests).
- **CUDA graph** (`graph`, CUDA's default): that fixed-shape step recorded (`graphs.StepGraph`) once per slot state
  (S, C, and whether attention rows are kept) and replayed; the host writes the forced ids before a replay and reads
  the statistics after it.

In the fixed shape (and so in its graph) the rows whose methods run on the device (`row.Row.on_device`) do that
work inside the step (`Row.device_work`): the graph is then recorded per slot state and set of such rows, and a row
whose work fails in the step's eager run fails alone.

In every form the matrix products run at a fixed row count (`products.fixed_rows`), so a row's numbers do not depend
on how many others decode beside it: row by row, not on S or C; in the fixed shape, on C alone.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ...runtime.devices import input_device
from ..choice import DYNAMIC, GRAPH
from ..graphs import StepGraph
from .attention import fixed_shape, rows_apart
from .products import fixed_rows, linear_layers, product_rows
from .row import Row
from .slots import Slots


class BatchStep:
    """How one model's batch runs its decode step (see the module docstring)."""

    def __init__(self, model: torch.nn.Module, form: str) -> None:
        """`form`: one of `choice.FORMS` (`dynamic`: row by row), the request's `DecodeChoice.form`."""
        self.model, self.form = model, form
        self.shape_fixed = form != DYNAMIC
        self._linears = linear_layers(model)  # patched for each step (`products.fixed_rows`), found once
        self._product_rows = product_rows(input_device(model))
        # recorded per (`Slots.serial`, rows kept, `Row.serial`s on the device)
        self._graph = StepGraph(model, form == GRAPH, "the batch decodes without graphs")

    def run(
        self, slots: Slots, lengths: list[int | None], keep_rows: bool, on_device: Sequence[Row] = ()
    ) -> dict[int, torch.Tensor]:
        """One decode step of every active slot: `slots.stats` and `slots.token_in` hold each slot's result, the active
        slots' positions advance.

        Args:
            lengths: per slot, its positions after this step (None: a free slot), as the host counts them.
            keep_rows: whether a row keeps attention rows (`Row.keeps_rows`).
            on_device: the rows whose methods run inside the step (fixed shape only; `Row.device_work`), their
                outputs in `slots.outs`; one whose work fails in an eager run is failed (`Row.fail`).

        Returns:
            slot -> its (L, H, length) float32 attention rows when `keep_rows` (views of `slots.rows` in the fixed
            shape: read them before the next step), else empty.
        """
        if not self.shape_fixed:
            return self._rows_apart(slots, lengths, keep_rows)
        keep_rows = keep_rows and slots.rows is not None
        on_device = list(on_device) if keep_rows else []
        graph = self._graph

        def key() -> tuple:
            return slots.serial, keep_rows, tuple(r.serial for r in on_device)

        if graph.enabled and not graph.replay(key()):
            # This step runs (rows whose work fails leave the list: the graph records the others), the next is recorded.
            run = lambda recording=False: self._fixed(slots, keep_rows, on_device, recording)  # noqa: E731
            graph.record(slots.positions.device, run, lambda: run(True), key)
        elif not graph.enabled:
            self._fixed(slots, keep_rows, on_device)
        if not keep_rows:
            return {}
        return {s: slots.rows[s, :, :, :n] for s, n in enumerate(lengths) if n is not None}

    def _forward(self, slots: Slots, mask: torch.Tensor | None = None) -> torch.Tensor:
        """(S, V) next-token logits of every slot, products at the fixed row count; `mask`: `slots.mask()` where the
        caller has it."""
        mask = slots.mask() if mask is None else mask
        call = dict(input_ids=slots.token_in, attention_mask=mask, position_ids=slots.positions[:, None])
        with fixed_rows(self._linears, self._product_rows):
            return self.model(**call, past_key_values=slots.cache, use_cache=True, logits_to_keep=1).logits[:, -1]

    def _rows_apart(self, slots: Slots, lengths: list[int | None], keep_rows: bool) -> dict[int, torch.Tensor]:
        with rows_apart(self.model, lengths, keep_rows) as recorded:
            logits = self._forward(slots)
        slots.record_tokens(logits, [s for s, n in enumerate(lengths) if n is not None])
        if not keep_rows:
            return {}
        layers = sorted(recorded)
        return {s: torch.stack([recorded[la][s][0] for la in layers]) for s, n in enumerate(lengths) if n is not None}

    def _fixed(self, slots: Slots, keep_rows: bool, on_device: list[Row], recording: bool = False) -> None:
        """The fixed-shape step, eagerly: what the graph records. Eagerly a row whose device work fails is failed
        and left out of `on_device` (the list changes); while `recording` its error ends the recording."""
        mask = slots.mask()  # (S, 1, 1, C)
        with fixed_shape(self.model, slots if keep_rows else None):
            logits = self._forward(slots, mask)
        if keep_rows:
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
