"""KV-cache helpers shared by the perturbation methods (AtMan, removal curves, pi-Soft).

They all run an unperturbed pass once and reuse its cache for every position before the first perturbed one, since
queries there cannot see the perturbation.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from . import devices, memory  # modules, not names: tests pretend a GPU by patching them

TOKENS_PER_BATCH = 1024  # perturbed positions per forward on a CPU: throughput peaks between ~500 and ~2,000, and a
# pass of ~1,000 positions takes a couple of seconds on 2 cores, which bounds how long a cancelled request keeps running
MAX_TOKENS_PER_BATCH = 1 << 16  # on an accelerator: a pass of at most this many positions (a few ms to a second)
MAX_ROWS_PER_BATCH = 1024
FULL_ROW_CHUNK = 128  # prefill query rows per chunk of full attention rows on a CPU: a chunk's (H, 128, T)
# probabilities stay in the L3 cache at 4k tokens
MAX_FULL_ROW_CHUNK = 2048
BATCH_SHARE = 0.25  # share of the device's free memory one batched pass may take


def _accelerator_spend(model: torch.nn.Module):
    """(the model's shape, the bytes one batched pass may take: `BATCH_SHARE` of the free memory) on an
    accelerator; None on a CPU, where the passes take fixed sizes."""
    device = devices.input_device(model)
    if device.type == "cpu":
        return None
    return memory.ModelShape.of(model), BATCH_SHARE * (memory.available_bytes(device) or 0)


def full_row_chunk(n: int, device_type: str) -> int:
    """Query rows per chunk in which an N-token prefill hands its full attention rows to consumers such as Rollout:
    `FULL_ROW_CHUNK` on a CPU; on an accelerator N / 32 (from `FULL_ROW_CHUNK` to `MAX_FULL_ROW_CHUNK`), so a layer
    comes in about 32 chunks whatever N: fewer, larger kernels, and Rollout's blocks (each as wide as its last row)
    hold at most ~1/64 more than the N^2 / 2 triangle."""
    if device_type == "cpu":
        return FULL_ROW_CHUNK
    return int(min(MAX_FULL_ROW_CHUNK, max(FULL_ROW_CHUNK, n // 32)))


def batch_budget(model: torch.nn.Module, t: int, k: int, rows: int, cpu_rows: int) -> tuple[int, int]:
    """How big the perturbation methods' batched passes over a T-position sequence scoring K positions may be:
    (positions per pass, most rows per pass).

    On a CPU: `TOKENS_PER_BATCH` positions and `rows` (or `cpu_rows` when `rows` is 0) rows, sizes where throughput
    is already at its peak. On an accelerator both come from its free memory: a pass may take `BATCH_SHARE` of it, at
    `ModelShape.position_bytes` per position and, per row, a KV cache of T positions and K float32 logits rows (twice,
    for the log-softmax); `rows` > 0 caps the rows.
    """
    spending = _accelerator_spend(model)
    if spending is None:
        return TOKENS_PER_BATCH, rows or cpu_rows
    shape, spend = spending
    tokens = int(min(MAX_TOKENS_PER_BATCH, max(TOKENS_PER_BATCH, spend // shape.position_bytes())))
    most = int(min(MAX_ROWS_PER_BATCH, max(1, spend // (shape.kv_bytes(t) + 8 * max(1, k) * shape.vocab))))
    return tokens, min(rows, most) if rows else most


def packed_positions(model: torch.nn.Module, t: int) -> int:
    """How many new positions one packed pass (`methods/answer_passes.py`) may compute after a cache of up to T
    positions: `TOKENS_PER_BATCH` on a CPU; on an accelerator what `BATCH_SHARE` of its free memory holds, at a
    position's activations and cache, its float32 logits row (twice, for the log-softmax) and its rows of the mask
    and of one layer's attention scores over all T + new keys (float32, every head)."""
    spending = _accelerator_spend(model)
    if spending is None:
        return TOKENS_PER_BATCH
    shape, spend = spending
    keys = t + MAX_TOKENS_PER_BATCH  # the most keys a query of such a pass can see
    per_position = shape.position_bytes() + 8 * shape.vocab + 4 * (3 + shape.heads) * keys
    return int(min(MAX_TOKENS_PER_BATCH, max(TOKENS_PER_BATCH, spend // per_position)))


def rows_per_batch(length: int, tokens: int, most: int) -> int:
    """How many sequences of `length` new positions go into one forward: about `tokens` positions, 1..`most` rows."""
    return max(1, min(most, tokens // max(1, length)))


def batches_by_first(first: list[int], end: int, most: int, tokens: int = TOKENS_PER_BATCH) -> list[list[int]]:
    """Perturbed rows in forward batches: indices of `first` ordered by their first perturbed position (stable),
    cut so that each batch's smallest first position, which sets the suffix `end - first` all its rows recompute,
    fits about `tokens` positions (1..`most` rows per batch)."""
    order = sorted(range(len(first)), key=first.__getitem__)
    groups, s = [], 0
    while s < len(order):
        size = rows_per_batch(end - first[order[s]], tokens, most)
        groups.append(order[s : s + size])
        s += size
    return groups


def prefix_cache(cache: DynamicCache, length: int, batch: int) -> DynamicCache:
    """A new cache holding the first `length` positions of a batch-1 cache, repeated `batch` times (no copy until
    the new cache grows)."""
    out = DynamicCache()
    if length == 0:
        return out
    for idx, layer in enumerate(cache.layers):
        keys = layer.keys[:, :, :length].expand(batch, -1, -1, -1)  # (B, KVH, length, D)
        values = layer.values[:, :, :length].expand(batch, -1, -1, -1)  # (B, KVH, length, D)
        out.update(keys, values, idx)
    return out


def reusable(cache: DynamicCache, length: int) -> bool:
    """Whether every layer of the cache holds plain keys and values of all `length` positions."""
    return len(cache.layers) > 0 and all(
        getattr(layer, "keys", None) is not None and layer.keys.ndim == 4 and layer.keys.shape[-2] == length
        for layer in cache.layers
    )


class PreallocatedLayer(DynamicLayer):
    """A dynamic cache layer that writes new positions into spare room instead of concatenating: a decode step
    then costs no copy of the whole cache (which, at a batch of 24 and 200 positions, is most of its time on CPU)."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, length: int) -> None:
        super().__init__()
        self.dtype, self.device = keys.dtype, keys.device
        self._keys, self._values, self._length = keys, values, length  # (B, KVH, capacity, D) each
        self._view()
        self.is_initialized = True

    def _view(self) -> None:
        self.keys = self._keys[:, :, : self._length]
        self.values = self._values[:, :, : self._length]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        new = key_states.shape[-2]
        if self._length + new > self._keys.shape[2]:  # out of room: grow by doubling
            grow = max(new, self._keys.shape[2])
            self._keys = torch.cat(
                [self._keys, self._keys.new_zeros(*self._keys.shape[:2], grow, self._keys.shape[3])], 2
            )
            self._values = torch.cat(
                [self._values, self._values.new_zeros(*self._values.shape[:2], grow, self._values.shape[3])], 2
            )
        self._keys[:, :, self._length : self._length + new] = key_states
        self._values[:, :, self._length : self._length + new] = value_states
        self._length += new
        self._view()
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        indices = indices.to(self._keys.device)  # under a device map each layer's cache is on its layer's device
        self._keys, self._values = self._keys[indices], self._values[indices]
        self._view()

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("a preallocated cache layer is not cropped")

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise NotImplementedError("a preallocated cache layer is not repeated")


def right_aligned(caches: list[tuple[DynamicCache, int, int]], width: int, room: int = 0) -> DynamicCache:
    """One batch cache from rows of other caches, each row's first `length` positions placed at the right end.

    Args:
        caches: (cache, row, length) per output row.
        width: the output's number of positions (>= every length); the left padding is zeros, to be masked.
        room: positions to preallocate after them for decoding (see `PreallocatedLayer`).

    Keeping every row's positions contiguous and right-aligned keeps the distance between a new query and each
    cached key equal to their distance in the row's own sequence, which sliding-window masks rely on.
    """
    out = DynamicCache()
    for idx in range(len(caches[0][0].layers)):
        first = caches[0][0].layers[idx]
        b, kvh = len(caches), first.keys.shape[1]
        keys = first.keys.new_zeros(b, kvh, width + room, first.keys.shape[3])
        values = first.values.new_zeros(b, kvh, width + room, first.values.shape[3])
        for i, (cache, row, length) in enumerate(caches):
            layer = cache.layers[idx]
            keys[i, :, width - length : width] = layer.keys[row, :, :length]
            values[i, :, width - length : width] = layer.values[row, :, :length]
        out.layers.append(PreallocatedLayer(keys, values, width))
    return out
