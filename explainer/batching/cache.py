"""The batch's KV cache: every row's positions right-aligned (left padding), rebuilt when rows join or leave.

Right alignment keeps each row's keys contiguous and in order, so a decode step sees, for every row, the keys of its
own sequence after a masked run of padding; the padding columns get probability exactly 0 (the additive mask is
float32's minimum), and cutting them off gives the row's own attention row. Rebuilding on every change of membership
copies the cache once and drops the left padding no remaining row needs.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from ..runtime.kv import PreallocatedLayer

# (cache, batch row, first position, end position): the positions of one row that go into the new batch cache
Source = tuple[DynamicCache, int, int, int]


def gather(sources: list[Source], room: int) -> DynamicCache:
    """One batch cache from rows of other caches, each row's positions placed at the right end.

    Args:
        sources: one per output row, in order.
        room: positions to preallocate after the widest row for the decode steps to come (`PreallocatedLayer`).

    Returns:
        A cache of width max(end - first) whose rows are left-padded with zeros (to be masked).
    """
    width = max(end - first for _, _, first, end in sources)
    out = DynamicCache()
    for idx in range(len(sources[0][0].layers)):
        model_layer = sources[0][0].layers[idx]
        _, kvh, _, d = model_layer.keys.shape
        keys = model_layer.keys.new_zeros(len(sources), kvh, width + room, d)  # (B, KVH, width + room, D)
        values = model_layer.values.new_zeros(len(sources), kvh, width + room, model_layer.values.shape[3])
        for i, (cache, row, first, end) in enumerate(sources):
            layer = cache.layers[idx]
            keys[i, :, width - (end - first) : width] = layer.keys[row, :, first:end]
            values[i, :, width - (end - first) : width] = layer.values[row, :, first:end]
        out.layers.append(PreallocatedLayer(keys, values, width))
    return out


def width(cache: DynamicCache) -> int:
    """The positions every row of the batch cache spans (its own and its padding)."""
    return cache.layers[0].keys.shape[2]


def decode_inputs(lengths: list[int], cached: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The explicit inputs of one decode step over right-aligned rows.

    Args:
        lengths: each row's own cached positions (its prompt and the answer tokens fed so far).
        cached: the batch cache's width (>= every length).

    Returns:
        (attention_mask (B, cached + 1) int64: 1 on each row's own positions and the new one, 0 on its padding;
        position_ids (B, 1): each row's next position, its own length).
    """
    own = torch.tensor(lengths, dtype=torch.long, device=device)  # (B,)
    columns = torch.arange(cached + 1, device=device)  # (cached + 1,)
    mask = (columns[None, :] >= (cached - own)[:, None]).long()  # (B, cached + 1)
    return mask, own[:, None]
