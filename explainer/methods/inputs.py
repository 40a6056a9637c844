"""What the language model of a vision-language model receives: the decoder's input embeddings, with the vision
tower's merged patch features in place of the image tokens. AtMan suppresses and compares them; the gradient methods
take them as their input layer (the vision tower is not explained through). `SequenceInputs` slices a teacher-forced
sequence into the inputs of forward passes over parts of it (AtMan's passes, the image-reliance knockout)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import UnsupportedModelError


class _StopForward(Exception):
    """Raised by a hook to end a forward pass once the decoder's input embeddings are known."""


def decoder_input_embeddings(model: torch.nn.Module, input_ids: torch.Tensor, extra_inputs: dict) -> torch.Tensor:
    """(1, T, d) the embeddings the language model's decoder receives for a multimodal input (image features merged
    in by the model itself); the decoder layers are not run."""
    decoder = model.get_decoder()
    seen: dict[str, torch.Tensor] = {}

    def grab(module, args, kwargs):
        embeds = kwargs.get("inputs_embeds")
        if embeds is None:
            raise UnsupportedModelError(
                f"{type(model).__name__} does not pass merged input embeddings to its decoder, so image tokens "
                "cannot be explained by this method."
            )
        seen["embeds"] = embeds
        raise _StopForward

    handle = decoder.register_forward_pre_hook(grab, with_kwargs=True)
    try:
        model(input_ids=input_ids, **extra_inputs)
    except _StopForward:
        pass
    finally:
        handle.remove()
    if "embeds" not in seen:
        raise UnsupportedModelError(
            f"{type(model).__name__} never called its decoder; image tokens cannot be explained."
        )
    return seen["embeds"]


@dataclass
class SequenceInputs:
    """The teacher-forced sequence as forward inputs: token ids (text) or the decoder's input embeddings plus
    explicit positions (multimodal: the image features are computed once and reused by every pass, and Qwen's 3D
    mRoPE positions are sliced with the sequence instead of being derived from state cached on the model).

    Attributes:
        input_ids: (1, T).
        embeds: (1, T, d) or None.
        position_ids: (..., 1, T) or None.
    """

    input_ids: torch.Tensor
    embeds: torch.Tensor | None = None
    position_ids: torch.Tensor | None = None

    @classmethod
    def of(cls, model: torch.nn.Module, input_ids: torch.Tensor, extra_inputs: dict | None) -> SequenceInputs:
        """The ids alone for a text prompt; with a multimodal prompt's `extra_inputs` (over all T positions) the
        decoder's input embeddings (`decoder_input_embeddings`, the vision tower run once) and their positions."""
        if not extra_inputs:
            return cls(input_ids)
        embeds = decoder_input_embeddings(model, input_ids, extra_inputs)  # (1, T, d)
        return cls(input_ids, embeds, extra_inputs.get("position_ids"))

    def inputs(self, start: int, stop: int, batch: int) -> dict[str, torch.Tensor]:
        """Keyword inputs of a forward over positions [start, stop), repeated `batch` times (no copies)."""
        if self.embeds is None:
            out = {"input_ids": self.input_ids[:, start:stop].expand(batch, -1)}  # (B, L)
        else:
            out = {"inputs_embeds": self.embeds[:, start:stop].expand(batch, -1, -1)}  # (B, L, d)
        if self.position_ids is not None:
            pos = self.position_ids[..., start:stop]  # (..., 1, L)
            out["position_ids"] = pos.expand(*pos.shape[:-2], batch, pos.shape[-1])  # (..., B, L)
        return out
