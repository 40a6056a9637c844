"""What the gradient methods (Input x Gradient, Grad-ELLM, AttnLRP) share: autograd switched on inside the library's
inference-mode code, parameters frozen for the call, one teacher-forced forward over the finished sequence and one
backward pass per explained token, with progress and cancellation between passes.

The forward runs once over all but the last token (whose logit explains nothing) and keeps its graph; the K target
logits are differentiated one at a time with `retain_graph`, so a request costs one forward and K backward passes and
holds one forward's activations, never K. A method's `steps` option (`steps.py`) explains only some answer steps: one
backward pass each, the other steps' rows left 0.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch

from ..contrast import foil_values
from ..runtime.session import between_passes
from .base import GenerationRun, ProgressFn
from .inputs import decoder_input_embeddings


@contextlib.contextmanager
def gradients_enabled(model: torch.nn.Module) -> Iterator[None]:
    """Autograd on (also inside an outer `torch.inference_mode()`), with the model's parameters frozen.

    Frozen parameters keep the graph small: no layer saves its input for a weight gradient, and layers below the
    first tensor that requires grad record nothing. Every parameter's `requires_grad` is restored on exit, also
    after an exception.

    Parameters are found again by name on exit: accelerate's offload hooks (a model loaded with a device map)
    replace an offloaded module's parameters at every forward, copying `requires_grad`, and those made under
    inference mode are inference tensors, whose flag can only be set back inside inference mode.
    """
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    try:
        for p in model.parameters():
            p.requires_grad_(False)
        with torch.inference_mode(False), torch.enable_grad():
            yield
    finally:
        with torch.inference_mode():
            for name, p in model.named_parameters():
                if name in trainable:
                    p.requires_grad_(True)


def teacher_forced_ids(run: GenerationRun) -> torch.Tensor:
    """(1, N + K - 1) the finished sequence without its last token, as an ordinary tensor (not an inference one)."""
    with torch.inference_mode(False):
        return run.input_ids[:, :-1].clone()


def input_embeddings(run: GenerationRun, requires_grad: bool = True) -> torch.Tensor:
    """(1, N + K - 1, d) the gradient methods' input layer for the teacher-forced sequence, as a leaf tensor.

    Text: the token embeddings. An image prompt: the decoder's input embeddings, i.e. the token embeddings with the
    vision tower's merged patch features at the image positions, so image tokens are explained by the features the
    language model receives and the vision tower is not explained through. Must run inside `gradients_enabled`.
    """
    with torch.no_grad():
        if run.extra_inputs:
            embeds = decoder_input_embeddings(run.model, run.input_ids, dict(run.extra_inputs))[:, :-1]  # (1, T-1, d)
        else:
            embeds = run.model.get_input_embeddings()(teacher_forced_ids(run))  # (1, T - 1, d)
        embeds = embeds.clone()  # an ordinary tensor, whatever the inputs were made under
    return embeds.requires_grad_(requires_grad)


def forward_inputs(run: GenerationRun, embeds: torch.Tensor) -> dict[str, torch.Tensor]:
    """Keyword inputs of the teacher-forced forward from `embeds` (1, T - 1, d): for an image prompt also its
    explicit (3, 1, T) mRoPE position ids cut to T - 1 (Qwen-VL's positions are not those of the token index)."""
    out = {"inputs_embeds": embeds}
    positions = (run.extra_inputs or {}).get("position_ids")
    if positions is not None:
        with torch.inference_mode(False):
            out["position_ids"] = positions[..., : embeds.shape[1]].clone()  # (3, 1, T - 1)
    return out


def target_logits(logits: torch.Tensor, run: GenerationRun) -> torch.Tensor:
    """(K,) the logit of every generated token at the position that predicts it, from (1, K, V) kept logits; at a
    contrasted step (`run.foils`) the logit difference l_A - l_B."""
    targets = run.input_ids[0, run.num_prompt_tokens :].clone()  # (K,)
    values = logits[0].gather(-1, targets[:, None].to(logits.device))[:, 0]  # (K,)
    foil = foil_values(logits[0], run.foils)  # (K,) or None
    return values if foil is None else values - foil


def per_target_gradients(
    targets: torch.Tensor,
    inputs: Sequence[torch.Tensor],
    progress: ProgressFn | None,
    label: str,
    steps: Sequence[int] | None = None,
) -> Iterator[tuple[int, tuple[torch.Tensor, ...]]]:
    """One backward pass per target logit: yields (k, gradients of targets[k] w.r.t. `inputs`) for each k of `steps`
    (0-based; None: every target, in order).

    Between passes the request's cancel token is checked and progress is reported as `label: i/n backward passes`.
    The graph is released after the last pass.
    """
    order = list(range(targets.shape[0])) if steps is None else list(steps)
    for i, k in enumerate(order):
        between_passes()
        grads = torch.autograd.grad(targets[k], list(inputs), retain_graph=i < len(order) - 1)
        yield k, grads
        if progress is not None:
            progress((i + 1) / len(order), f"{label}: {i + 1}/{len(order)} backward passes")
