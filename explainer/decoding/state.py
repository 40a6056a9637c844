"""One request's device state for the methods that run on the device (`has_device_step`: MACS, calibrated MACS,
Rollout), shared by the two fixed-shape schedulers: the single request's static step (`static.StaticDecoder`) and a
batched row whose methods run inside the batch's step (`batched.row.Row`).

It holds the step index k on the device (a graph reads it, never the host), each method's layer buffer
(`reserve_layers`) and the decode steps' sink shares summed in place; `scores` runs every method's device step on
one step's attention rows, `gather_sinks` adds the step's shares, `finish` hands them to the sink tracker. The
request's other per-step facts come from its `DecodeJob` (`forced_at`, `step_positions`) the same way on every path.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..methods import AttributionMethod
from ..result.sinks import SinkTracker
from .step import device_scores


class DeviceWork:
    """A request's methods' device state over its K steps (see the module docstring).

    Attributes:
        k: (1,) long on the device, the step the next pass explains; `advance` adds 1 on the device.
        layers: per method, its (K, L, N) layer factors buffer or None (`AttributionMethod.reserve_layers`).
        share_sum, share_min: (N,) the decode steps' sink shares, summed and smallest (None without a tracker).
    """

    def __init__(
        self,
        methods: Sequence[AttributionMethod],
        n: int,
        steps: int,
        num_layers: int,
        device: torch.device,
        sinks: SinkTracker | None = None,
    ) -> None:
        self.methods, self.sinks = list(methods), sinks
        self.k = torch.zeros(1, dtype=torch.long, device=device)  # (1,)
        self.layers = [m.reserve_layers(steps, num_layers, device) for m in self.methods]
        self.share_sum = self.share_min = None
        if sinks is not None:
            self.share_sum = torch.zeros(n, device=device)  # (N,)
            self.share_min = torch.full((n,), float("inf"), device=device)  # (N,)

    def scores(self, rows: torch.Tensor) -> list[torch.Tensor]:
        """Each method's (N,) row of step k from the step's (L, H, T) attention rows (`step.device_scores`), its
        layer factors written into row k of its buffer; no host read."""
        return device_scores(self.methods, self.layers, rows, self.k)

    def gather_sinks(self, rows: torch.Tensor, alive: torch.Tensor | None = None) -> None:
        """A decode step's sink shares from its (L, H, T) rows, summed in place (`SinkTracker.gather`; `alive`: (1,)
        bool, none after an end-of-sequence token)."""
        if self.sinks is not None:
            self.sinks.gather(rows, self.share_sum, self.share_min, alive)

    def advance(self) -> None:
        self.k.add_(1)

    def finish(self, steps_taken: int) -> None:
        """Hand the decode steps' sink shares to the tracker (`steps_taken` counts the prefill's step 0 too)."""
        if self.sinks is not None:
            self.sinks.add_totals(self.share_sum, self.share_min, max(steps_taken - 1, 0))
