"""The batch's static state: S row slots of C cache positions each, preallocated, and the device buffers of the step.

A row takes a free slot when it joins (its prefill cache is copied to the slot's first positions) and frees it when
it leaves; the other rows do not move. Every decode step writes each slot's new key and value at that slot's own next
position (`SlotLayer`), so a row's keys lie where a solo run's cache holds them, left-aligned, and the slot's unused
positions come after them (masked, or never read). The step's inputs and outputs live in fixed buffers
(`token_in`, `positions`, `forced`, `active`, `stats`, `rows`): the same shapes and addresses at every step, which is
what a CUDA graph records (`fixed.py`).

Sizes: S is a power of two (1, 2, 4, ...) and grows by reallocation when a row finds no free slot; C grows the same
way when a joining row needs more positions (`grown`). Both only grow while the batch has rows; the batcher drops the
state when the last row leaves.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from ...capture import QueryStash, stacked_last_rows
from ...runtime.scores import float32_products
from ..step import token_stats


class SlotLayer(DynamicLayer):
    """One layer's keys and values for S slots of C positions; a decode step (one new position per slot) writes each
    slot's at its own next position (`positions`, shared by every layer and advanced once per step by the batch)."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor) -> None:
        super().__init__()
        self.dtype, self.device = keys.dtype, keys.device
        self.keys, self.values = keys, values  # (S, KVH, C, D) each
        self._positions = positions  # (S,) long
        self._slots = torch.arange(keys.shape[0], device=keys.device)  # (S,)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if key_states.shape[-2] != 1:
            raise ValueError("a slot cache takes decode steps only (one new position per slot)")
        self.keys[self._slots, :, self._positions] = key_states[:, :, 0]  # (S, KVH, D) at each slot's own position
        self.values[self._slots, :, self._positions] = value_states[:, :, 0]
        return self.keys, self.values

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("a slot cache is not cropped")

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise NotImplementedError("a slot cache is not repeated")

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        raise NotImplementedError("a slot cache keeps its slots (rows join and leave, `Slots.join` / `Slots.leave`)")


def slot_count(rows: int) -> int:
    """S for `rows` rows: the next power of two."""
    return 1 << max(rows - 1, 0).bit_length()


@dataclass(frozen=True)
class Layout:
    """What a slot cache's layers hold: per layer (KVH, D) of keys and values, their dtype and device."""

    shapes: tuple[tuple[int, int, int], ...]  # (KVH, D of keys, D of values) per layer
    dtype: torch.dtype
    device: torch.device

    @classmethod
    def of(cls, cache: DynamicCache) -> Layout:
        layers = cache.layers
        shapes = tuple((la.keys.shape[1], la.keys.shape[3], la.values.shape[3]) for la in layers)
        return cls(shapes, layers[0].keys.dtype, layers[0].keys.device)


class Slots:
    """S slots of C positions and the step's buffers (see the module docstring).

    Attributes:
        cache: the `DynamicCache` of `SlotLayer`s the model decodes on.
        token_in: (S, 1) long, each slot's next input id; the step writes the token it chose.
        positions: (S,) long, each slot's next position (its own cached length); the step advances active slots.
        forced: (S,) long, each slot's given token for the step (-1: the argmax), written by the host before a step.
        active: (S,) bool, which slots hold a row.
        stats: (S, 3 + 2A) float64, the step's `token_stats` row per slot.
        rows: (S, L, H, C) float32, the step's attention rows of each slot's query (fixed-shape attention only, when
            a row captures; the row-by-row attention hands each row its own).
        outs: (S, M, C) float64, in the fixed shape, the step's row of each of a slot's M streaming methods where its
            row runs them on the device (`row.Row.on_device`: written in the step, read with the statistics); None
            when no row does.
        serial: unique per state (a graph recorded on one is replayed on it alone).
    """

    _serials = itertools.count()

    def __init__(
        self,
        layout: Layout,
        slots: int,
        capacity: int,
        rows_shape: tuple[int, int] | None = None,
        outputs: int = 0,
    ) -> None:
        device = layout.device
        self.serial = next(Slots._serials)
        self.layout, self.size, self.capacity, self.outputs = layout, slots, capacity, outputs
        self.positions = torch.zeros(slots, dtype=torch.long, device=device)
        self.cache = DynamicCache()
        # Where rows are kept and the layers' keys share a shape, all layers' keys lie in one buffer (`write_rows`).
        self.stacked = None
        if rows_shape is not None and len(set(layout.shapes)) == 1:
            kvh, dk, _ = layout.shapes[0]
            stacked = (slots, len(layout.shapes), kvh, capacity, dk)  # (S, L, KVH, C, D): a slot's keys in one piece
            self.stacked = torch.zeros(stacked, dtype=layout.dtype, device=device)
        for i, (kvh, dk, dv) in enumerate(layout.shapes):
            if self.stacked is not None:
                keys = self.stacked[:, i]  # (S, KVH, C, D), a view
            else:
                keys = torch.zeros((slots, kvh, capacity, dk), dtype=layout.dtype, device=device)
            values = torch.zeros((slots, kvh, capacity, dv), dtype=layout.dtype, device=device)
            self.cache.layers.append(SlotLayer(keys, values, self.positions))
        self.token_in = torch.zeros((slots, 1), dtype=torch.long, device=device)
        self.forced = torch.full((slots,), -1, dtype=torch.long, device=device)
        self.active = torch.zeros(slots, dtype=torch.bool, device=device)
        self.columns = torch.arange(capacity, device=device)  # (C,)
        self.stats: torch.Tensor | None = None  # made by the first step (A from the vocabulary)
        self.rows = None if rows_shape is None else torch.zeros((slots, *rows_shape, capacity), device=device)
        self.queries = None if rows_shape is None else QueryStash(rows_shape[0])  # each layer's (S, H, D) queries
        self.float32_out = rows_shape is not None and float32_products(device, layout.dtype)
        self.outs = None
        if outputs:
            self.outs = torch.zeros((slots, outputs, capacity), dtype=torch.float64, device=device)  # (S, M, C)
        self.free = list(range(slots))

    def join(self, cache: DynamicCache, length: int, token: int) -> int:
        """Copy a row's prefill cache (its first `length` positions, batch row 0) into a free slot, whose next input
        is `token`; returns the slot."""
        slot = self.free.pop(0)
        for layer, source in zip(self.cache.layers, cache.layers):
            layer.keys[slot, :, :length] = source.keys[0, :, :length]
            layer.values[slot, :, :length] = source.values[0, :, :length]
        self._set(slot, length, token, True)
        return slot

    def leave(self, slot: int) -> None:
        """Free a slot: it is inactive (its position stays 0 and its writes go to its own position 0)."""
        self._set(slot, 0, 0, False)
        self.free.append(slot)
        self.free.sort()

    def _set(self, slot: int, length: int, token: int, active: bool) -> None:
        self.positions[slot] = length
        self.token_in[slot, 0] = token
        self.forced[slot] = -1
        self.active[slot] = active

    def grown(self, slots: int, capacity: int, rows_shape: tuple[int, int] | None, outputs: int = 0) -> Slots:
        """A larger state with every slot's cache, position, input and activity copied (slot numbers kept); `outs`
        is a step's and is not."""
        out = Slots(self.layout, slots, capacity, rows_shape, outputs)
        for new, old in zip(out.cache.layers, self.cache.layers):
            new.keys[: self.size, :, : self.capacity] = old.keys
            new.values[: self.size, :, : self.capacity] = old.values
        for name in ("positions", "forced", "active"):
            getattr(out, name)[: self.size] = getattr(self, name)
        out.token_in[: self.size] = self.token_in
        taken = set(range(self.size)) - set(self.free)
        out.free = [s for s in range(slots) if s not in taken]
        return out

    def write_rows(self, visible: torch.Tensor) -> None:
        """`rows` from the queries each layer stashed in `queries` (`capture.QueryStash`): every slot's and layer's
        float32 softmax row over its C positions, the keys it does not see (`visible`, (S, C) bool: `mask` of the
        step) exactly 0; no host read.

        Where the layers' keys lie in one buffer, one product a slot over all its layers: the very call a row decoding
        alone makes, so its rows do not depend on how many others decode beside it (a product library picks its
        kernel by the whole call's shape, batch count included). Otherwise one product a layer over all slots."""
        stash = self.queries
        if self.stacked is None or not stash.one_product:
            keys = [la.keys for la in self.cache.layers]
            stash.write_rows(self.rows.transpose(0, 1), keys, None, visible, self.float32_out)  # (L, S, H, C)
            return
        for s in range(self.size):
            one = stacked_last_rows(
                stash.buffer[:, s : s + 1], self.stacked[s][:, None], visible[s : s + 1], stash.scales[0],
                self.float32_out,
            )  # (L, 1, H, C)  # fmt: skip
            self.rows[s].copy_(one[:, 0])

    def mask(self) -> torch.Tensor:
        """(S, 1, 1, C) bool: each slot's own positions and its new one (attend), on the device; no host read."""
        return (self.columns[None, :] <= self.positions[:, None])[:, None, None, :]

    def record_tokens(self, logits: torch.Tensor, slots: list[int] | None) -> None:
        """Each slot's `token_stats` (one slot at a time, so a row's numbers do not depend on S) into `stats`, its
        token into `token_in`; then the active slots advance. `slots`: the slots to score (None: all, as a graph
        records them); no host read."""
        for s in range(self.size) if slots is None else slots:
            token, stats = token_stats(logits[s], self.forced[s : s + 1])  # (1,), (3 + 2A,)
            if self.stats is None:
                self.stats = torch.zeros((self.size, stats.shape[0]), dtype=torch.float64, device=stats.device)
            self.stats[s].copy_(stats)
            self.token_in[s].copy_(token)
        self.positions.add_(self.active.long())
