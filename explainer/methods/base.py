"""The contract every attribution method follows.

Streaming methods see the attention rows of every generation step while the model generates and return one row of
scores per step. Post-hoc methods run once after generation on the finished sequence and return all K rows at once.
Both produce raw scores of shape (K steps, N prompt tokens); z-scores are added by the result type.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from ..runtime.memory import MemoryRequest
from .cost import UNKNOWN, Cost, CostRequest

# progress(fraction in [0, 1], message)
ProgressFn = Callable[[float, str], None]


@dataclass
class GenerationRun:
    """A finished generation, as post-hoc methods see it.

    Attributes:
        model: the causal LM (read-only).
        input_ids: (1, N + K) prompt followed by the generated tokens.
        num_prompt_tokens: N.
        progress: optional callback for long computations.
        extra_inputs: further keyword inputs of a forward over `input_ids` (a vision-language model's
            `pixel_values`, `image_grid_thw` and (3, 1, N + K) `position_ids`); None for text prompts. Post-hoc
            methods that pass them on set `explains_images = True`; the others are refused for image prompts.
        foils: contrastive steps, (K,) long with the foil's id at a contrasted step and -1 elsewhere, or None
            (`explainer/contrast.py`). Methods with `contrastive = True` explain l_A - l_B there.
        prompt_tokens: the N readable prompt tokens, for methods that work on words or sentences (Sources).
        user_positions: the positions of the user's own text (not the chat template); None: all.
        answer_logprobs: (K,) float64 log-probability of each answer token as the decode loop computed it
            (`answer_logprobs`), or None; a method that needs the unperturbed values may take them from here
            instead of running its own pass (Sources' surrogate does).
    """

    model: torch.nn.Module
    input_ids: torch.Tensor
    num_prompt_tokens: int
    progress: ProgressFn | None = None
    extra_inputs: dict[str, Any] | None = None
    foils: torch.Tensor | None = None
    prompt_tokens: list[str] | None = None
    user_positions: list[int] | None = None
    answer_logprobs: np.ndarray | None = None

    @property
    def num_steps(self) -> int:
        return self.input_ids.shape[1] - self.num_prompt_tokens


def answer_logprobs(probabilities: Sequence[float], k: int) -> np.ndarray | None:
    """(K,) float64 log-probabilities of the answer's tokens from the probabilities the decode loop gave them (float32
    softmax, `Step.probability`), or None where they are not K finite positive values (a probability that underflowed
    to 0): the caller then computes them itself."""
    p = np.asarray(list(probabilities), dtype=np.float64)
    if p.shape != (k,) or not np.all(np.isfinite(p) & (p > 0)):
        return None
    return np.log(p)


class AttributionMethod:
    """Base class. Subclasses set `name`, `streaming`, `Config`, and implement either the streaming pair
    `begin`/`step` or `explain`; the other facts below have defaults. Registering the class in `methods.METHODS` is
    all the rest of the code needs: the CLI, the app, the time estimates and `eval` read these facts from it."""

    name: ClassVar[str]  # registry key, used on the command line and in saved results
    streaming: ClassVar[bool]  # True: scores each step from the generation's attention rows; False: post-hoc
    Config: ClassVar[type]  # dataclass of the options (`methods.method_options` lists its fields)
    display_name: ClassVar[str]  # shown to people, e.g. "Attention Rollout"; defaults to `name`
    # Image prompts: streaming methods see their attention rows like any other; a post-hoc method explains them only
    # if it passes `GenerationRun.extra_inputs` on (or never runs the model).
    explains_images: ClassVar[bool] = False
    needs_prompt_embeddings: ClassVar[bool] = False  # its `cost` reads `CostRequest.embeddings`
    # Contrastive steps (`GenerationRun.foils`): the method explains l_A - l_B there. Attention methods cannot: their
    # maps do not depend on the target.
    contrastive: ClassVar[bool] = False
    # Streaming capabilities, read by the decode paths (`explainer/decoding/`) instead of testing a method's type:
    # needs_full_rows: it also reads every prompt query's attention rows in the prefill (`consume_full_rows`), not
    # only the predicting query's (Rollout);
    # has_device_step: its step also exists as fixed-shape device work (`device_step`, then `finish_step` on the
    # host), which the static decode path runs inside its step and a CUDA graph records (MACS, Rollout).
    needs_full_rows: ClassVar[bool] = False
    has_device_step: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "display_name" not in cls.__dict__ and "name" in cls.__dict__:
            cls.display_name = cls.name
        if "step" in cls.__dict__ and "has_device_step" not in cls.__dict__:
            cls.has_device_step = False  # a new `step` is not the device step it inherited: say so again to keep it

    @classmethod
    def cost(cls, request: CostRequest, config: Any) -> Cost:
        """Work this method adds to a request beyond the generation (`explainer/estimate.py` times it).

        The default: nothing for a streaming method (it reads the generation's own attention rows); unknown for a
        post-hoc one, whose time is then not estimated (the other methods' still are).
        """
        return Cost() if cls.streaming else UNKNOWN

    @classmethod
    def memory(cls, request: MemoryRequest, config: Any) -> int:
        """Bytes this method keeps beyond the generation's own memory at once (`explainer/memory.py` adds them up
        and refuses a request that will not fit before it runs). The default: nothing."""
        return 0

    def __init__(self, config: Any = None, **options: Any) -> None:
        if config is None:
            config = self.Config(**options)
        elif options:
            raise TypeError("pass either a config object or keyword options, not both")
        self.config = config

    def prepare(self, model: torch.nn.Module) -> None:
        """Called once per request where it meets the model, before any forward pass: read what the method needs of
        that model (its calibration weights, say) and raise an `InputError` a user can act on if it is missing. The
        default: nothing."""

    # Streaming methods -----------------------------------------------------------------------------------------
    def begin(self, num_prompt_tokens: int) -> None:
        """Reset state for a new generation over N prompt tokens."""
        raise NotImplementedError

    def step(self, rows: torch.Tensor) -> np.ndarray:
        """Scores for one generation step.

        Args:
            rows: (L, H, T) attention of the query that predicts this step's token, T = N + k.

        Returns:
            (N,) float raw scores.
        """
        raise NotImplementedError

    def consume_full_rows(self, layer_idx: int, q_start: int, probs: torch.Tensor) -> None:
        """With `needs_full_rows`: a chunk of one layer's prefill rows, (H, chunk, T) probabilities of the queries
        from `q_start` on."""
        raise NotImplementedError

    def device_step(self, rows: torch.Tensor, step: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """With `has_device_step`: this step's device work from its (L, H, T) rows over a static cache (keys after the
        query 0) and its (1,) long step index k on the device, no host read: ((N,) the row that `finish_step` turns
        into scores on the host, (L, N) float32 layer scores to keep or None). Step 0 (the prefill) runs eagerly
        before every other; the later calls are what a CUDA graph records."""
        raise NotImplementedError

    def reserve_layers(self, steps: int, num_layers: int, device: torch.device) -> torch.Tensor | None:
        """With `has_device_step`: the (steps, L, N) float32 buffer that the static path writes `device_step`'s layer
        scores into, allocated at once; None (the default) when it keeps none."""
        return None

    def finish_step(self, row: np.ndarray) -> np.ndarray:
        """With `has_device_step`: the (N,) raw scores of the next step from `device_step`'s row, read to the host."""
        raise NotImplementedError

    def layer_scores(self) -> np.ndarray | None:
        """Per-layer scores the method kept during generation, (K, L, N) float32, read from the device once when it
        ends (MACS's factors with `keep_layers`); None, the default, when it keeps none."""
        return None

    # Post-hoc methods ------------------------------------------------------------------------------------------
    def explain(self, run: GenerationRun) -> np.ndarray:
        """Scores for all steps of a finished generation: (K, N)."""
        raise NotImplementedError

    def raw_floor(self, num_steps: int, num_layers: int) -> np.ndarray:
        """(K,) the raw score each step gives a prompt token this method found no evidence for: what an image share
        counts from (`result/reliance.py`). 0, the default, for scores whose zero means "no effect"; NaN where a step's
        floor is unknown. `num_layers`: the language model's decoder layers."""
        return np.zeros(num_steps, dtype=np.float64)

    def options(self) -> dict[str, Any]:
        """The config as plain data."""
        return dict(vars(self.config))

    def meta(self) -> dict[str, Any]:
        """What the result's metadata keeps for this method: the options and anything learnt while running."""
        return self.options()
