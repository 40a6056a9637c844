"""Attention scores in float32 from a model in bfloat16 or float16, the way MACS's decode step takes them for every
layer at once (`capture.stacked_last_rows`): whether the device's batched product can give float32 from the model's
dtype directly (`float32_products`), and the product itself in that form or, where it cannot, one layer's operands
upcast at a time (`stacked_scores`). `bench/products.py` times the same product's other forms against this one.
"""

from __future__ import annotations

import threading

import torch

_FLOAT32_PRODUCTS: dict[tuple[str, int | None, torch.dtype], bool] = {}
_products_lock = threading.Lock()


def float32_products(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether `torch.bmm(a, b, out_dtype=torch.float32)` multiplies `dtype` tensors on `device` into float32 scores
    (CUDA's products of bfloat16 or float16 accumulate in float32 and can keep it): asked once per device and dtype
    with a small product checked against the upcast one, never inside a CUDA graph's recording."""
    key = (device.type, device.index, dtype)
    with _products_lock:
        known = _FLOAT32_PRODUCTS.get(key)
    if known is not None:
        return known
    ok = False
    if dtype != torch.float32:
        a = torch.linspace(-2, 2, 2 * 3 * 8, device=device).view(2, 3, 8).to(dtype)
        b = torch.linspace(1, -1, 2 * 5 * 8, device=device).view(2, 5, 8).to(dtype).transpose(1, 2)  # keys' layout
        try:
            got = torch.bmm(a, b, out_dtype=torch.float32)
            ok = got.dtype == torch.float32 and torch.allclose(got, torch.bmm(a.float(), b.float()), atol=1e-5)
        except (RuntimeError, NotImplementedError, TypeError):  # not on this device, dtype or PyTorch
            ok = False
    with _products_lock:
        _FLOAT32_PRODUCTS[key] = ok
    return ok


def stacked_scores(q: torch.Tensor, k: torch.Tensor, step: int, float32_out: bool) -> torch.Tensor:
    """(N, G, T) float32 scores of (N, G, D) queries against (N, D, T) keys: float32 keys as they are; otherwise one
    product with float32 out (`float32_out`, from `float32_products`), or `step` batches (one layer's) upcast at a
    time, never every layer's float32 keys at once."""
    if k.dtype == torch.float32:
        return torch.bmm(q.float(), k)
    if float32_out:
        return torch.bmm(q, k, out_dtype=torch.float32)
    scores = torch.empty((q.shape[0], q.shape[1], k.shape[2]), device=k.device)  # (N, G, T)
    for first in range(0, q.shape[0], step):  # one layer at a time
        layer = slice(first, first + step)
        torch.bmm(q[layer].float(), k[layer].float(), out=scores[layer])
    return scores
