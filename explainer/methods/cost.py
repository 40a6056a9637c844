"""What a method costs beyond the generation, counted in token positions; `explainer/estimate.py` turns it into
seconds. Each method class answers for itself through `AttributionMethod.cost` (see `estimate.py` for the model).

N prompt tokens, K answer tokens, T = N + K; the last answer token predicts nothing that is scored, so
teacher-forced passes cover T - 1 positions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .steps import chosen_steps


@dataclass(frozen=True)
class Cost:
    """Work of one method on one request.

    Attributes:
        forward_passes: model calls.
        forward_tokens: positions those calls compute, summed over each call's batch, through every layer.
        backward_passes: backward passes.
        backward_tokens: positions the backward passes cover, summed over the passes.
        backward_layers: decoder layers each backward pass goes through; None: all of them.
        known: False for a method that has no cost model (its time is not estimated; the others' still are).
    """

    forward_passes: int = 0
    forward_tokens: int = 0
    backward_passes: int = 0
    backward_tokens: int = 0
    backward_layers: int | None = None
    known: bool = True

    @property
    def free(self) -> bool:
        """Nothing beyond the generation itself."""
        return self.known and self.forward_passes == 0 and self.backward_passes == 0


UNKNOWN = Cost(known=False)


@dataclass(frozen=True)
class CostRequest:
    """The request a cost is computed for.

    Attributes:
        prompt_ids: the N prompt token ids (chat template included).
        num_new_tokens: K.
        num_layers: the model's decoder depth, if known.
        embeddings: (N, d) the prompt's input embeddings, given to methods with `needs_prompt_embeddings`; else None.
        batch_tokens: positions per batched pass on the model's device (`kv.batch_budget`).
        batch_rows: most rows per batched pass on the device; 0: each method's CPU figure.
    """

    prompt_ids: list[int]
    num_new_tokens: int
    num_layers: int | None = None
    embeddings: torch.Tensor | None = None  # (N, d)
    batch_tokens: int = 1024  # kv.TOKENS_PER_BATCH
    batch_rows: int = 0

    @property
    def n(self) -> int:
        return len(self.prompt_ids)

    @property
    def t(self) -> int:
        return self.n + self.num_new_tokens


def gradient_cost(request: CostRequest, backward_layers: int | None = None, steps: str = "") -> Cost:
    """The gradient methods' work (`methods/gradients.py`): one forward over T - 1 positions that keeps its graph,
    then K backward passes over those positions through the last `backward_layers` decoder layers (None: all); with
    a `steps` option, one backward pass per chosen step within K."""
    t, chosen = request.t, chosen_steps(steps, request.num_new_tokens)
    k = request.num_new_tokens if chosen is None else len(chosen)
    if k <= 0:
        return Cost()
    return Cost(
        forward_passes=1,
        forward_tokens=t - 1,
        backward_passes=k,
        backward_tokens=k * (t - 1),
        backward_layers=backward_layers,
    )
