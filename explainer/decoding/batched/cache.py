"""The batch's KV cache: every row's positions left-aligned, where a solo run's cache holds them, padding after them.

Each decode step writes every row's new key and value right after that row's own positions (`RaggedLayer`), so a row
keeps the key columns of its solo run and its padding (masked: probability exactly 0) comes after them. SDPA and the
capture's softmax then sum each row's keys in the solo run's order: in bfloat16 on a CPU the batched attention is
bit-identical to the solo one, which left padding (keys shifted by the padding) is not (tests/explainer/
decoding/test_batched.py). The cache is rebuilt when rows join or leave, which drops the padding no remaining row needs.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

# (cache, batch row, length): the first `length` positions of one row that go into the new batch cache
Source = tuple[DynamicCache, int, int]


class RaggedLayer(DynamicLayer):
    """One layer's keys and values of rows of different lengths, each left-aligned; a decode step (one new position
    per row) writes each row's at its own length. `keys` spans the longest row; no host read per step."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, lengths: list[int]) -> None:
        super().__init__()
        self.dtype, self.device = keys.dtype, keys.device
        self._keys, self._values = keys, values  # (B, KVH, capacity, D) each
        self._rows = torch.arange(len(lengths), device=keys.device)  # (B,)
        self._next = torch.tensor(lengths, dtype=torch.long, device=keys.device)  # (B,) each row's next position
        self._width = max(lengths)
        self.is_initialized = True
        self._view()

    def _view(self) -> None:
        self.keys = self._keys[:, :, : self._width]
        self.values = self._values[:, :, : self._width]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if key_states.shape[-2] != 1:
            raise ValueError("a ragged batch cache takes decode steps only (one new position per row)")
        if self._width + 1 > self._keys.shape[2]:  # out of room: grow by doubling
            grow = self._keys.shape[2]
            self._keys = torch.cat([self._keys, torch.zeros_like(self._keys[:, :, :grow])], 2)
            self._values = torch.cat([self._values, torch.zeros_like(self._values[:, :, :grow])], 2)
        self._keys[self._rows, :, self._next] = key_states[:, :, 0]  # (B, KVH, D) at each row's own next position
        self._values[self._rows, :, self._next] = value_states[:, :, 0]
        self._next += 1
        self._width += 1  # the longest row grew by one, like every row
        self._view()
        return self.keys, self.values

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("a ragged batch cache is not cropped")

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise NotImplementedError("a ragged batch cache is not repeated")

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        raise NotImplementedError("a ragged batch cache is rebuilt (cache.gather), not selected")


def gather(sources: list[Source], room: int) -> DynamicCache:
    """One batch cache from rows of other caches (a row's own prefill cache, or a row of the previous batch cache).

    Args:
        sources: one per output row, in order.
        room: positions to preallocate after the longest row for the decode steps to come.

    Returns:
        A cache of `RaggedLayer`s spanning the longest row; the shorter rows are padded with zeros after their own
        positions (to be masked).
    """
    lengths = [length for _, _, length in sources]
    out = DynamicCache()
    for idx in range(len(sources[0][0].layers)):
        model_layer = sources[0][0].layers[idx]
        _, kvh, _, d = model_layer.keys.shape
        keys = model_layer.keys.new_zeros(len(sources), kvh, max(lengths) + room, d)  # (B, KVH, width + room, D)
        values = model_layer.values.new_zeros(len(sources), kvh, max(lengths) + room, model_layer.values.shape[3])
        for i, (cache, row, length) in enumerate(sources):
            keys[i, :, :length] = cache.layers[idx].keys[row, :, :length]
            values[i, :, :length] = cache.layers[idx].values[row, :, :length]
        out.layers.append(RaggedLayer(keys, values, lengths))
    return out


def width(cache: DynamicCache) -> int:
    """The positions the batch cache spans: its longest row's."""
    return cache.layers[0].keys.shape[2]


def decode_inputs(lengths: list[int], cached: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The explicit inputs of one decode step over left-aligned rows.

    Args:
        lengths: each row's own cached positions (its prompt and the answer tokens fed so far).
        cached: the batch cache's width (the longest row's length).

    Returns:
        (attention_mask (B, cached + 1) int64: 1 on each row's own positions and on its new one, which `RaggedLayer`
        writes right after them, 0 on its padding; position_ids (B, 1): each row's next position, its own length).
    """
    own = torch.tensor(lengths, dtype=torch.long, device=device)  # (B,)
    columns = torch.arange(cached + 1, device=device)  # (cached + 1,)
    return (columns[None, :] <= own[:, None]).long(), own[:, None]
