"""A batched decode step's attention, row by row: each row's query against its own keys only, by the very call a solo
run makes, so the batch changes nothing in attention.

One SDPA call over the padded batch would need a mask, and on a CPU a masked SDPA (or transformers' repeat of the
key-value heads that comes with a mask) rounds differently from the unmasked call of a solo decode step, and
differently again for another padded width: in bfloat16 that moved the embedded model's probabilities in the third
digit. Even rows of one length may not share a call: in float32 the CPU's SDPA gives a row other bits beside 3
others than alone (it splits its work by the batch). A row's attention rows for the streaming methods come from
`capture.last_query_probs` on the same unpadded keys, as the capture computes them in a solo step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from ...capture import attention_function_selected, check_attention_kwargs, last_query_probs


@contextlib.contextmanager
def rows_apart(model: torch.nn.Module, lengths: list[int], record: bool) -> Iterator[dict[int, list[torch.Tensor]]]:
    """Within the block, every attention layer of `model` runs each batch row on its own keys.

    Args:
        lengths: each row's own positions after this step (its cached ones and the new one), left-aligned in the
            batch cache (`cache.RaggedLayer`).
        record: whether to record each row's attention probabilities of its query.

    Yields:
        layer index -> one (1, H, length) float32 tensor per row, filled by the forward pass when `record`.
    """
    recorded: dict[int, list[torch.Tensor]] = {}

    def attention(
        module: torch.nn.Module,
        query: torch.Tensor,  # (B, H, 1, D)
        key: torch.Tensor,  # (B, KVH, width, D)
        value: torch.Tensor,  # (B, KVH, width, D)
        attention_mask: torch.Tensor | None,
        dropout: float = 0.0,
        scaling: float | None = None,
        **kwargs,
    ) -> tuple[torch.Tensor, None]:
        check_attention_kwargs(module, kwargs, "the batched decode")
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        outs, rows = [], []
        for i, n in enumerate(lengths):
            q, k, v = query[i : i + 1], key[i : i + 1, :, :n].contiguous(), value[i : i + 1, :, :n].contiguous()
            out, _ = sdpa_attention_forward(module, q, k, v, None, dropout=dropout, scaling=scaling, **kwargs)
            outs.append(out)  # (1, 1, H, D)
            if record:
                rows.append(last_query_probs(q, k, scale))  # (1, H, n)
        if record:
            recorded[module.layer_idx] = rows
        return torch.cat(outs), None

    with attention_function_selected(model, "explainer_batch_", attention):
        yield recorded
