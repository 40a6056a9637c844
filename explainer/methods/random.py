"""Random baseline: uniform scores with a seed, the sanity row of every table in the MACS paper (section 4)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .base import AttributionMethod, GenerationRun
from .cost import Cost, CostRequest


@dataclass
class RandomConfig:
    seed: int = 0  # same seed, same shapes -> same scores

    def __post_init__(self) -> None:
        if self.seed < 0:
            raise ValueError(f"seed must be 0 or more, got {self.seed}")


class RandomBaseline(AttributionMethod):
    name = "random"
    display_name = "Random"
    streaming = False
    Config = RandomConfig
    explains_images = True  # never runs the model

    @classmethod
    def cost(cls, request: CostRequest, config: RandomConfig) -> Cost:
        return Cost()  # no model call

    def explain(self, run: GenerationRun) -> np.ndarray:
        rng = np.random.default_rng(self.config.seed)
        return rng.random((run.num_steps, run.num_prompt_tokens), dtype=np.float64).astype(np.float32)  # (K, N)
