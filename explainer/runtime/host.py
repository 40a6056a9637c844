"""The one way tensors leave the device: `to_numpy`.

Every conversion of a tensor to numpy in `explainer/` goes through `to_numpy`, which detaches the tensor and moves it
to the host first, so code written and tested on a CPU also runs with the model on a GPU (where `.numpy()` on a
device tensor raises). Tests check that no other `.numpy()` call exists in the package.
"""

from __future__ import annotations

import numpy as np
import torch


def to_numpy(tensor: torch.Tensor, dtype: np.dtype | type | None = None) -> np.ndarray:
    """A host numpy copy (or view, for a CPU tensor) of `tensor`, optionally converted to `dtype`.

    bfloat16 and float16 tensors are widened to float32 on the device first (numpy has no bfloat16).
    """
    t = tensor.detach()
    if t.dtype in (torch.bfloat16, torch.float16):
        t = t.float()
    array = t.cpu().numpy()
    return array if dtype is None else array.astype(dtype, copy=False)
