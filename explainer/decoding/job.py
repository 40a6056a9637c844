"""The decode job: what every decode path runs, passed whole from the request to the scheduler that runs it (the
solo loop, the static step, a batched row), with its step count (`num_steps`) and its stop ids (`stop_ids`; the
rule itself is `step.ends`)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import InputError
from ..methods import AttributionMethod


@dataclass(frozen=True, eq=False)
class DecodeJob:
    """What the decode loop runs: a prompt's ids, the methods, and the answer's bound or the given answer.

    `explain.py` makes one from an `ExplainRequest` once it has met the model (its ids encoded, a given answer
    tokenised and checked); tests and benchmarks make one from raw ids, e.g. `DecodeJob(ids, [get_method("macs")], 4)`.

    Attributes:
        input_ids: (1, N) the prompt.
        methods: the request's methods; the streaming ones score each step, the post-hoc ones are left out here.
        max_new_tokens: generation stops after this many tokens, or after an end-of-sequence token.
        forced_ids: a given answer: step k yields `forced_ids[k]` instead of the argmax and feeds it to the next pass
            (the forward passes are those of generation); all K = len(forced_ids) steps run, an end-of-sequence id
            inside the answer included, and `max_new_tokens` does not apply (the request checked that it fits).
        eos_token_ids: generation stops after producing one of these (it is yielded as the last step).
        extra_inputs: keyword inputs of the prefill forward only (e.g. a vision-language model's `pixel_values`,
            `image_grid_thw`). When they hold explicit `position_ids` (..., N), decode steps continue from the last
            prompt position in every axis (Qwen's 3D mRoPE), so no position state is read from or left in the model.
    """

    input_ids: torch.Tensor
    methods: Sequence[AttributionMethod]
    max_new_tokens: int
    forced_ids: Sequence[int] | None = None
    eos_token_ids: Iterable[int] = ()
    extra_inputs: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.input_ids.ndim != 2 or self.input_ids.shape[0] != 1:
            raise InputError(f"expected input_ids of shape (1, N), got {tuple(self.input_ids.shape)}")
        object.__setattr__(self, "methods", tuple(self.methods))
        object.__setattr__(self, "eos_token_ids", frozenset(self.eos_token_ids))
        if self.forced_ids is not None:
            object.__setattr__(self, "forced_ids", tuple(int(t) for t in self.forced_ids))

    @property
    def num_steps(self) -> int:
        """K: the given answer's length, else the bound `max_new_tokens` (generation may stop earlier)."""
        return self.max_new_tokens if self.forced_ids is None else len(self.forced_ids)

    def step_positions(self, k: int | torch.Tensor) -> dict[str, torch.Tensor]:
        """Decode step k's keyword inputs: where the prefill has explicit positions (..., N) (Qwen's 3-D mRoPE), the
        prompt's last position + k in every axis, (..., 1); else none (the cache counts the positions). `k`: an int,
        or a (1,) long tensor on the device (the static step reads no host value)."""
        positions = (self.extra_inputs or {}).get("position_ids")
        return {} if positions is None else {"position_ids": positions[..., -1:] + k}

    def forced_at(self, k: int) -> int:
        """The given answer's token for step k, or -1 (the argmax): past its end, or when no answer is given."""
        forced = self.forced_ids
        return -1 if forced is None or k >= len(forced) else forced[k]

    @property
    def stop_ids(self) -> frozenset[int]:
        """The ids after which generation stops: the end-of-sequence ids, none for a given answer (all K run)."""
        return frozenset() if self.forced_ids is not None else self.eos_token_ids
