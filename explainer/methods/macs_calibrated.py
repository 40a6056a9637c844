"""Calibrated MACS: MACS's per-layer evidence weighted by weights learnt against ablations of the context.

MACS (MACS paper, section 3.2, Eqs. 4-8) multiplies one floored factor per layer (Eq. 7): log c = sum_l log f_l. This
method gives each layer its own exponent, fitted per model:

    log c_w = sum_l w_l log f_l        (L weights; all w_l = 1 is MACS itself, to the bit)

and z-scores as MACS does (Eq. 8). It reads the same attention rows in the same pass, so its cost is MACS's: one
(L, N) product more per step.

The weights are fitted as AT2 fits its per-head weights ("Learning to Attribute with Attention", Cohen-Wang et al.,
MadryLab 2025, section 3): on training prompts, random ablations of the context's sources (sentences, 32 per prompt,
each kept with probability 1/2); a source's score is the sum of its tokens' scores over the answer's steps, a mask's
prediction the sum of its kept sources' scores, and the loss is minus the Pearson correlation, over each prompt's
masks, of prediction and the answer's measured log-probability (`explainer/eval/calibrate.py`; the `calibrate`
command). AT2 weights attention linearly; here the weights sit in MACS's product, so a weight of 0 switches a layer
off and a weight above 1 sharpens it. The model's weights are found by its config fingerprint
(`methods/calibration.py`); the embedded model's ship with the package.

It does not beat MACS: chosen on training questions and scored once on held-out ones, paired against MACS, neither
the shipped weights (-0.000 +- 0.030 LDS, 31 questions) nor any other calibration tried (a global temperature, signed
scores with a length term, a blend with Sources; `explainer/eval/forms.py`) is ahead by an interval that excludes 0
(docs/methods.md, "Calibrated MACS"). On the embedded model, read it as MACS.

Image prompts: image regions are sources too. A vision-language model's weights are fitted on image questions whose
sources are the image's regions and the question's sentences, hidden from the answer's queries as the reliance
knockout hides the image (`calibrate.collect_image_row`); they are keyed by the fingerprint of its language model's
configuration like a text model's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..errors import InputError
from ..runtime.host import to_numpy
from .calibration import CalibrationWeights, find_weights
from .macs import MACS, MACSConfig, log_factors


@dataclass
class MACSCalibratedConfig(MACSConfig):
    """MACS's options; the weights are not one: they belong to the model and are found by its config fingerprint
    (shipped, or in the user's calibration folder), so no request names a file on the server. The weights were fitted
    with MACS's defaults (alpha 0.8, max pooling, redistribution); other values run, uncalibrated for them. On held-out
    questions the shipped weights are level with MACS on LDS, not better (the module's docstring)."""


def weighted_log_factors(
    rows: torch.Tensor, n: int, config: MACSConfig, weights: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """MACS's Eqs. 4-6 with each layer's factor raised to its weight: ((L, N) float64 weighted factors f_l^w_l, (N,)
    float64 log of their product).

    Args:
        rows: (L, H, T) attention probabilities of the predicting query (as `macs.log_factors`).
        weights: (L,) float64 on the rows' device.
    """
    floored, _ = log_factors(rows, n, config)  # (L, N)
    weighted = weights[:, None] * torch.log(floored)  # (L, N)
    return torch.exp(weighted), weighted.sum(dim=0)


class MACSCalibrated(MACS):
    name = "macs_calibrated"
    display_name = "MACS (calibrated)"
    streaming = True
    has_device_step = True  # `device_step`: MACS's as fixed-shape device work, with the weights; graphs record it
    explains_images = True  # a VLM's weights are fitted on image regions (`calibrate.collect_image_row`)
    Config = MACSCalibratedConfig

    def prepare(self, model: torch.nn.Module) -> None:
        """Find the loaded model's weights (shipped, else in the user's calibration folder), or say how to make them
        (`InputError`)."""
        self.calibration: CalibrationWeights = find_weights(model)
        self.weights: torch.Tensor | None = None  # (L,) float64 on the rows' device, made at the first step

    def meta(self) -> dict:
        calibration = getattr(self, "calibration", None)
        extra = {} if calibration is None else {"fingerprint": calibration.fingerprint, "fit": calibration.fit}
        return {**super().meta(), "calibration": extra}

    def raw_floor(self, num_steps: int, num_layers: int) -> np.ndarray:
        """prod_l (1 - alpha)^w_l, the raw score of a token no layer attends to; NaN at the rescaled steps."""
        w = np.asarray(self.calibration.layer_weights, dtype=np.float64)
        floor = np.full(num_steps, float(np.exp(w.sum() * np.log(1.0 - self.config.alpha))), dtype=np.float64)
        floor[[s for s in self.rescaled_steps if s < num_steps]] = np.nan
        return floor

    def _weights_on(self, device: torch.device) -> torch.Tensor:
        """The (L,) float64 layer weights on `device`, made on the first step (eager on every path: a CUDA graph
        records only later steps, which reuse this tensor)."""
        if getattr(self, "calibration", None) is None:
            raise InputError("macs_calibrated needs the model's weights: run it through explain (it calls prepare).")
        if self.weights is None or self.weights.device != device:
            self.weights = torch.tensor(self.calibration.layer_weights, dtype=torch.float64, device=device)  # (L,)
        return self.weights

    def _weighted(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        weights = self._weights_on(rows.device)
        if weights.shape[0] != rows.shape[0]:
            raise InputError(f"{weights.shape[0]} calibration weights, {rows.shape[0]} layers.")
        return weighted_log_factors(rows, self.n, self.config, weights)

    def step(self, rows: torch.Tensor) -> np.ndarray:
        weighted, log_c = self._weighted(rows)
        if self.config.keep_layers:
            self._keep(weighted)
        return self.finish_step(to_numpy(log_c))

    def device_step(self, rows: torch.Tensor, step: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """MACS's device step with the weights: (N,) float64 log of the weighted product and, with `keep_layers`, the
        (L, N) float32 weighted factors, left on the device."""
        weighted, log_c = self._weighted(rows)
        return log_c, weighted.float() if self.config.keep_layers else None
