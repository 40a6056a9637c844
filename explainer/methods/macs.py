"""MACS: Multi-Layer Attention Consistency Score.

Implements "Less is More: MACS" (MACS paper, section 3.2, Eqs. 4-8) as a streaming method: at generation step k the
attention row of the query that predicts token k (the last prompt token at k = 0, the previously generated token
after) is redistributed (Eq. 4), max-pooled over heads (Eq. 5), floored (Eq. 6), multiplied over layers (Eq. 7) and
z-scored over the N prompt tokens (Eq. 8, done by the result type).

With `keep_layers` the per-layer factors of Eq. 6, (L, N) per step over the input tokens after redistribution, are
kept on the device in a float32 buffer of (steps, L, N) that doubles when full (one device-side copy per step, no
host read) and read once when generation ends (`layer_scores`): the layer drill-down of the app and of the JSON
(`--macs-layers`). Their product over layers is the step's raw score, except on a rescaled step (see below), whose
raw row is that product divided by a constant.

The layer product is computed as a sum of logs so deep models do not underflow. The stored raw score is c_L itself
whenever it fits float32's normal range (with alpha = 0.8 that holds up to ~50 layers). Otherwise that step's row is
divided by the geometric mean of its largest and smallest entry, which leaves z-scores and rankings exactly those of
c_L, and the step index is listed in the metadata under `rescaled_steps`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ..runtime.host import to_numpy
from ..runtime.memory import MemoryRequest
from .base import AttributionMethod

_LOG_FLOAT32_TINY = float(np.log(np.finfo(np.float32).tiny))
_FIRST_CAPACITY = 64  # steps of the first layer-factor buffer; it doubles when full

_POOLING = {
    "max": lambda a: a.amax(dim=1),
    "mean": lambda a: a.mean(dim=1),
    "min": lambda a: a.amin(dim=1),
}


@dataclass
class MACSConfig:
    alpha: float = 0.8  # Eq. 6 floor weight: every layer factor is at least 1 - alpha
    pooling: str = field(default="max", metadata={"choices": tuple(_POOLING)})  # head pooling of Eq. 5; "mean" and
    # "min" are the Table 4 ablations
    redistribute: bool = True  # Eq. 4; False is the "w/o Redistribution" ablation
    keep_layers: bool = False  # keep every step's per-layer factors (Eq. 6), L x N x K x 4 bytes: the app's layer
    # drill-down; the CLI's --macs-layers

    def __post_init__(self) -> None:
        if self.pooling not in _POOLING:
            raise ValueError(f"pooling must be one of {sorted(_POOLING)}, got {self.pooling!r}")
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"alpha must lie in [0, 1], got {self.alpha}")


def log_factors(rows: torch.Tensor, n: int, config: MACSConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Eqs. 4-7 on the rows' device, no host read: ((L, N) float64 layer factors of Eq. 6, (N,) float64 log of c_L).

    Args:
        rows: (L, H, T) attention probabilities of the predicting query, T >= N; keys after the query (a static
            cache's unused positions) must hold 0, which leaves the redistribution of Eq. 4 unchanged.
    """
    a = rows.to(torch.float64)  # (L, H, T), T = N + k (or a static cache's length)
    a_in = a[..., :n]  # (L, H, N)
    if config.redistribute and a.shape[-1] > n:
        a_in = a_in + a[..., n:].sum(dim=-1, keepdim=True) / n  # Eq. 4
    pooled = _POOLING[config.pooling](a_in)  # (L, N), Eq. 5
    floored = config.alpha * pooled + (1.0 - config.alpha)  # (L, N), Eq. 6
    return floored, torch.log(floored).sum(dim=0)  # (N,), the log of Eq. 7


class MACS(AttributionMethod):
    name = "macs"
    display_name = "MACS"
    streaming = True
    explains_images = True
    has_device_step = True  # `device_step`: Eqs. 4-7 as fixed-shape device work
    Config = MACSConfig

    @classmethod
    def memory(cls, request: MemoryRequest, config: MACSConfig) -> int:
        """With `keep_layers`, the float32 layer factors: at most 1.5 x the last buffer while it doubles."""
        if not config.keep_layers:
            return 0
        capacity = _FIRST_CAPACITY
        while capacity < request.k:
            capacity *= 2
        grown = capacity if capacity == _FIRST_CAPACITY else capacity + capacity // 2
        return 4 * request.shape.layers * request.n * grown

    def begin(self, num_prompt_tokens: int) -> None:
        self.n = num_prompt_tokens
        self.steps_done = 0
        self.rescaled_steps: list[int] = []
        self.layers: torch.Tensor | None = None  # (capacity, L, N) float32 on the rows' device, with keep_layers

    def meta(self) -> dict:
        return {**self.options(), "rescaled_steps": list(self.rescaled_steps)}

    def raw_floor(self, num_steps: int, num_layers: int) -> np.ndarray:
        """(1 - alpha)^L, the raw score of a token no layer attends to (Eq. 6 floored, Eq. 7 multiplied), at every
        step but the rescaled ones, whose row was divided by a constant that is not kept (NaN there)."""
        floor = np.full(num_steps, (1.0 - self.config.alpha) ** num_layers, dtype=np.float64)
        floor[[s for s in getattr(self, "rescaled_steps", []) if s < num_steps]] = np.nan
        return floor

    def step(self, rows: torch.Tensor) -> np.ndarray:
        floored, log_c = log_factors(rows, self.n, self.config)
        if self.config.keep_layers:
            self._keep(floored)
        return self.finish_step(to_numpy(log_c))  # the step's one device sync

    def device_step(self, rows: torch.Tensor, step: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(N,) float64 log of Eq. 7 and, with `keep_layers`, the (L, N) float32 layer factors, left on the device
        (the step index is not needed: Eqs. 4-7 read only this step's rows)."""
        floored, log_c = log_factors(rows, self.n, self.config)
        return log_c, floored.float() if self.config.keep_layers else None

    def finish_step(self, log_c: np.ndarray) -> np.ndarray:
        """The (N,) float32 raw row of the next step from its (N,) float64 log of Eq. 7, read from the device: c_L,
        or c_L divided by a constant when it leaves float32's normal range (the step is then in `rescaled_steps`)."""
        step, self.steps_done = self.steps_done, self.steps_done + 1
        finite = log_c[np.isfinite(log_c)]
        if finite.size and finite.min() < _LOG_FLOAT32_TINY:
            self.rescaled_steps.append(step)
            log_c = log_c - (finite.max() + finite.min()) / 2
        return np.exp(log_c).astype(np.float32)

    def reserve_layers(self, steps: int, num_layers: int, device: torch.device) -> torch.Tensor | None:
        """With `keep_layers`, the (steps, L, N) float32 layer-factor buffer allocated at once, for a decode path that
        writes step k's factors at row k on the device (`explainer/decoding/static.py`); None without."""
        if not self.config.keep_layers:
            return None
        self.layers = torch.empty((steps, num_layers, self.n), dtype=torch.float32, device=device)  # (K, L, N)
        return self.layers

    def _keep(self, floored: torch.Tensor) -> None:
        """Copy this step's (L, N) factors into the device buffer, doubling it when full; no host read."""
        if self.layers is None:
            self.layers = torch.empty(
                (_FIRST_CAPACITY, *floored.shape), dtype=torch.float32, device=floored.device
            )  # (capacity, L, N)
        elif self.steps_done == self.layers.shape[0]:
            self.layers = torch.cat([self.layers, torch.empty_like(self.layers)])
        self.layers[self.steps_done].copy_(floored)

    def layer_scores(self) -> np.ndarray | None:
        """(K, L, N) float32 per-layer factors (Eq. 6) of the steps so far, read from the device at once; None
        without `keep_layers`."""
        if self.layers is None:
            return None
        return to_numpy(self.layers[: self.steps_done])
