"""A batched decode step's attention, in one of two forms, each giving a row the numbers of its lone run in the batch.

- **Row by row** (`rows_apart`, the eager step on a CPU): each active slot's query against its own keys only, by the
  very call a solo decode step makes. One SDPA call over the padded batch would need a mask, and on a CPU a masked SDPA
  (or transformers' repeat of the key-value heads that comes with a mask) rounds differently from the unmasked call of
  a solo step, and differently again for another padded width: in bfloat16 that moved the embedded model's
  probabilities in the third digit. Even rows of one length may not share a call: in float32 the CPU's SDPA gives a row
  other bits beside 3 others than alone (it splits its work by the batch). A row's attention rows for the streaming
  methods come from `capture.last_query_probs` on the same unpadded keys, as the capture computes them in a solo step.
- **Fixed shape** (`fixed_shape`, what a CUDA graph records): every slot's query against all C positions of its slot,
  the positions after its own masked (`Slots.mask`), in one call of fixed shape; each layer stashes its slots' queries,
  and after the pass the attention rows of every slot and layer come from one product over the slots' keys
  (`Slots.write_rows`) into the `(S, L, H, C)` buffer, masked keys exactly 0. A row's numbers then depend on C, not
  on the other rows.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from ...capture import attention_function_selected, check_attention_kwargs, last_query_probs
from ..step import query_stashing_attention
from .slots import Slots


def _no_mask(*args, **kwargs) -> None:
    """The mask function of both forms: the step passes its own 4-D mask (transformers returns it as it is) or
    none is read."""
    return None


@contextlib.contextmanager
def rows_apart(
    model: torch.nn.Module, lengths: list[int | None], keep_rows: bool
) -> Iterator[dict[int, dict[int, torch.Tensor]]]:
    """Within the block, every attention layer of `model` runs each active slot on its own keys.

    Args:
        lengths: per slot, its own positions after this step (its cached ones and the new one), left-aligned in the
            slot (`slots.SlotLayer`); None for a free slot (its output is zeros).
        keep_rows: whether to keep each active slot's attention probabilities of its query.

    Yields:
        layer index -> slot -> one (1, H, length) float32 tensor, filled by the forward pass when `keep_rows`.
    """
    recorded: dict[int, dict[int, torch.Tensor]] = {}

    def attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        # query (S, H, 1, D); key and value (S, KVH, C, D)
        check_attention_kwargs(module, kwargs, "the batched decode")
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        out = query.new_zeros(query.shape[0], query.shape[2], query.shape[1], value.shape[3])  # (S, 1, H, D)
        rows = {}
        for i, n in enumerate(lengths):
            if n is None:
                continue
            q, k, v = query[i : i + 1], key[i : i + 1, :, :n].contiguous(), value[i : i + 1, :, :n].contiguous()
            one, _ = sdpa_attention_forward(module, q, k, v, None, dropout=dropout, scaling=scaling, **kwargs)
            out[i : i + 1] = one  # (1, 1, H, D)
            if keep_rows:
                rows[i] = last_query_probs(q, k, scale)  # (1, H, n)
        if keep_rows:
            recorded[module.layer_idx] = rows
        return out, None

    with attention_function_selected(model, "explainer_batch_", attention, _no_mask):
        yield recorded


@contextlib.contextmanager
def fixed_shape(model: torch.nn.Module, slots: Slots | None) -> Iterator[None]:
    """Within the block, every attention layer of `model` runs all slots in one masked call over all C positions
    (the mask is the step's, (S, 1, 1, C) bool), and stashes its slots' queries and temperature in `slots` when given
    (`Slots.write_rows` makes the rows after the pass); no host read."""

    attention = query_stashing_attention("the batched decode", None if slots is None else slots.queries)
    with attention_function_selected(model, "explainer_batch_", attention, _no_mask):
        yield
