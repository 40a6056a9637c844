"""Input x Gradient (Shrikumar et al., 2017; Simonyan et al., 2014), the simplest gradient baseline of the Grad-ELLM
paper's tables (Grad-ELLM paper, section 4, "classical gradient-based methods").

For generated token k, predicted at position p = N + k - 1 of the teacher-forced sequence, the score of prompt token i
is the gradient of that token's logit l_k with respect to token i's input embedding e_i, times e_i, reduced over the
hidden dimension:

    score[k, i] = sum_d e_i[d] * dl_k/de_i[d]            (reduction "sum", signed)
    score[k, i] = || e_i * dl_k/de_i ||_2                 (reduction "l2", unsigned)

One teacher-forced forward keeps its graph and one backward pass per generated token gives one row
(`gradients.per_target_gradients`). AttnLRP (`attnlrp.py`) is the same product computed while LRP rules reshape the
backward pass, so it reuses `gradient_x_input`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ..runtime.host import to_numpy
from ..runtime.memory import MemoryRequest, graph_bytes
from ..runtime.session import hold
from .base import AttributionMethod, GenerationRun
from .cost import Cost, CostRequest, gradient_cost
from .gradients import forward_inputs, gradients_enabled, input_embeddings, per_target_gradients, target_logits
from .steps import chosen_steps, parse_steps, steps_option

_REDUCTIONS = ("sum", "l2")


@dataclass
class InputXGradientConfig:
    reduction: str = field(default="sum", metadata={"choices": _REDUCTIONS})  # over the hidden dimension: "sum"
    # (signed, the textbook definition) or "l2" (the norm of e_i * grad, unsigned)
    steps: str = steps_option()  # the answer steps explained (`steps.py`); the other steps' rows stay 0

    def __post_init__(self) -> None:
        if self.reduction not in _REDUCTIONS:
            raise ValueError(f"reduction must be one of {', '.join(_REDUCTIONS)}, got {self.reduction!r}")
        parse_steps(self.steps)


def gradient_x_input(
    run: GenerationRun, label: str, reduction: str = "sum", steps: str = ""
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradient x input at the input embeddings for every generated token, under whatever backward is in place.

    Must run inside `gradients_enabled(run.model)`.

    Args:
        run: the finished generation; for an image prompt the input layer is the decoder's input embeddings (the
            vision tower's merged patch features at the image positions, `gradients.input_embeddings`).
        label: progress message prefix.
        reduction: "sum" or "l2" over the hidden dimension.
        steps: the answer steps explained (`steps.parse_steps`); the other rows stay 0. "": every step.

    Returns:
        (K, N + K - 1) float32 reduced products e * dl_k/de at every position of the teacher-forced sequence (zero
        after p_k, which l_k does not see), and (K,) float32 the explained logits l_k.
    """
    model, k_total = run.model, run.num_steps
    embeds = input_embeddings(run)  # (1, T - 1, d); an image prompt's merged patch features at its image positions
    out = model(**forward_inputs(run, embeds), use_cache=False, logits_to_keep=k_total)  # logits (1, K, V)
    logits = target_logits(out.logits, run)  # (K,)
    del out
    scores = torch.zeros(k_total, embeds.shape[1], dtype=torch.float32, device=embeds.device)  # (K, T - 1)
    for k, (grad,) in per_target_gradients(logits, [embeds], run.progress, label, chosen_steps(steps, k_total)):
        product = embeds[0].detach().float() * grad[0].float()  # (T - 1, d), in float32 whatever the model's dtype
        scores[k] = product.sum(-1) if reduction == "sum" else product.norm(dim=-1)
    return scores, logits.detach().float()


class InputXGradient(AttributionMethod):
    name = "input_x_gradient"
    display_name = "Input × Gradient"
    streaming = False
    contrastive = True  # explains l_A - l_B at contrasted steps (`gradients.target_logits`)
    explains_images = True  # image tokens: the merged patch features the language model receives
    Config = InputXGradientConfig

    @classmethod
    def cost(cls, request: CostRequest, config: InputXGradientConfig) -> Cost:
        return gradient_cost(request, steps=config.steps)

    @classmethod
    def memory(cls, request: MemoryRequest, config: InputXGradientConfig) -> int:
        return graph_bytes(request)  # one forward graph over T - 1 positions

    def explain(self, run: GenerationRun) -> np.ndarray:
        n = run.num_prompt_tokens
        if run.num_steps <= 0:
            return np.zeros((0, n), dtype=np.float32)
        with hold(run.model), gradients_enabled(run.model):
            scores, _ = gradient_x_input(run, "Input x Gradient", self.config.reduction, self.config.steps)  # (K, T-1)
        return to_numpy(scores[:, :n])  # (K, N)
