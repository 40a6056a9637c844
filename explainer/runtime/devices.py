"""Models spread over several devices by accelerate's big-model dispatch (`models.load_model(device_map=...)`).

With a device map every decoder layer runs on its own device (several GPUs, or a GPU with some layers offloaded to
CPU memory or disk). accelerate's hooks move each module's inputs to its execution device, and offloaded modules keep
their weights on the `meta` device outside their own forward. The library follows three rules for such models:

- inputs go to the device of the input embeddings (`input_device`); the model's outputs come back there too, since
  accelerate's top-level hook returns them to the device the inputs came from;
- tensors recorded per layer (attention rows) are gathered onto one device before they are combined
  (`capture.AttentionRecorder.stacked`);
- a tensor combined with a layer's activations is moved to the activations' device, and a weight read outside its
  module's forward is read with `parameter_value`, which finds an offloaded weight where accelerate keeps it.

On a model without a device map all three are no-ops.
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import UnsupportedModelError


def _hooks(module: torch.nn.Module) -> list[Any]:
    """accelerate's hooks on `module` (a `SequentialHook` is unpacked); empty when it has none."""
    hook = getattr(module, "_hf_hook", None)
    if hook is None:
        return []
    return list(getattr(hook, "hooks", None) or [hook])


def _as_device(device: Any) -> torch.device:
    """accelerate writes execution devices as torch devices, strings or bare CUDA indices."""
    if isinstance(device, int):
        return torch.device("cuda", device)
    return torch.device(device)


def spread_over_devices(model: torch.nn.Module) -> bool:
    """Whether accelerate's device map places `model`'s modules on more than one device."""
    return len({str(d) for d in (getattr(model, "hf_device_map", None) or {}).values()}) > 1


def execution_device(module: torch.nn.Module) -> torch.device | None:
    """The device accelerate runs `module` on, or None when no hook of it names one."""
    for hook in _hooks(module):
        device = getattr(hook, "execution_device", None)
        if device is not None:
            return _as_device(device)
    return None


def input_device(model: torch.nn.Module) -> torch.device:
    """Where input ids go: the input embeddings' execution device under a device map (an offloaded embedding's
    weight sits on `meta`), else the device of its weight, else of the model's first parameter."""
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if embeddings is not None:
        device = execution_device(embeddings)
        if device is not None:
            return device
        weight = getattr(embeddings, "weight", None)
        if weight is not None and weight.device.type != "meta":
            return weight.device
    device = execution_device(model)
    if device is not None:
        return device
    return next(model.parameters()).device


def parameter_value(module: torch.nn.Module, name: str) -> torch.Tensor:
    """The value of `module`'s parameter `name`, also outside the module's forward when accelerate has offloaded it
    (its parameter is then on `meta`; the value lives in the hook's weights map, in CPU memory or on disk).

    The returned tensor has the parameter's dtype but may lie on another device than the module's inputs.

    Raises:
        UnsupportedModelError: the parameter is on `meta` and no hook holds its value.
    """
    param = getattr(module, name)
    if param.device.type != "meta":
        return param
    for hook in _hooks(module):
        weights = getattr(hook, "weights_map", None)
        if weights is not None and name in weights:
            return weights[name].to(dtype=param.dtype)
    raise UnsupportedModelError(
        f"{type(module).__name__}.{name} is on the meta device and no offload hook holds its value; load the model "
        "without offloading to use this method."
    )
