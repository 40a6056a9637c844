"""What the language model of a vision-language model receives: the decoder's input embeddings, with the vision
tower's merged patch features in place of the image tokens. AtMan suppresses and compares them; the gradient methods
take them as their input layer (the vision tower is not explained through)."""

from __future__ import annotations

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
