"""Sources' answer-scope passes: every unit's answer positions packed into one sequence over the prompt's cache.

With scope "answer" (`sources.py`) a unit is hidden only from the queries at positions `start` .. T - 2 (start =
N - 1: the positions that predict the answer). Everything before `start` is the unperturbed prompt, the same for every
unit, so instead of one batch row per unit (each row a copy of the prompt's cache, and of its keys once more per
head group), one forward of batch 1 runs S segments after that cache: segment s repeats the inputs of positions
[start, T - 1) with their own position ids and attends to the shared prefix and to the earlier positions of its own
segment only, with its unit's keys masked. The block-diagonal mask is built from the model's own mask function on the
true positions, so sliding windows hold. Segment 0 hides nothing: the baseline, in the same pass and layout as the
segments it is subtracted from. A unit then costs L = T - 1 - start new positions and the prompt's cache is read,
never copied. The reference is one full forward per unit (`atman.naive_scores` with `from_query`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from transformers import DynamicCache
from transformers.masking_utils import causal_mask_function

from ..errors import UnsupportedModelError
from ..runtime.host import to_numpy
from ..runtime.kv import packed_positions, prefix_cache, reusable
from .atman.method import attention_suppression, check_manipulated, cross_entropy, naive_scores, report_progress
from .base import ProgressFn


def _packed_mask(rows: torch.Tensor, start: int, length: int) -> Callable:
    """The mask interface function of one packed pass: S = len(rows) segments of `length` positions after a shared
    prefix of `start` positions; segment s adds rows[s] (pre-softmax bias per prefix key) to its queries' scores."""
    s, dev = rows.shape[0], rows.device
    j = torch.arange(length, device=dev).repeat(s)  # (S·L,) offset of each packed position in its segment
    seg = torch.arange(s, device=dev).repeat_interleave(length)  # (S·L,)
    kv_pos = torch.cat([torch.arange(start, device=dev), start + j])  # (start + S·L,) true positions of the keys
    kv_seg = torch.cat([torch.full((start,), -1, device=dev), seg])  # -1: the shared prefix
    # Segment s's bias on every key: the prefix's, then its own positions' (the other segments' keys are masked).
    bias = torch.cat([rows[:, :start], rows[:, start : start + length].repeat(1, s)], dim=1)  # (S, start + S·L)
    zero = torch.zeros((), dtype=torch.long, device=dev)

    def packed_mask(*, kv_length: int, kv_offset: int = 0, mask_function: Callable = causal_mask_function,
                    dtype: torch.dtype = torch.float32, **kwargs) -> torch.Tensor:  # fmt: skip
        if kv_offset or kv_length != kv_pos.numel() or int(kwargs.get("q_length", j.numel())) != j.numel():
            raise UnsupportedModelError(
                f"This model asked for an attention mask over {kv_length} keys from {kv_offset}; Sources' packed "
                f"passes lay out {kv_pos.numel()} keys. Run Sources with scope=all or fast=false."
            )
        allowed = mask_function(zero, zero, (start + j)[:, None], kv_pos[None, :])  # (S·L, Tk) causal / sliding
        allowed = allowed & ((kv_seg[None, :] < 0) | (kv_seg[None, :] == seg[:, None]))  # own segment or prefix
        out = torch.where(allowed, bias[seg].to(dtype), torch.finfo(dtype).min)  # (S·L, Tk)
        return out[None, None].to(kwargs.get("device", dev))  # (1, 1, S·L, Tk)

    return packed_mask


class PackedPasses:
    """The packed passes of one sequence: the prefix cache is computed on first use and shared by every call (each
    level of Sources' hierarchy); `positions` counts the positions computed so far. The caller holds the model and
    runs it in inference mode.

    Args:
        input_ids: (1, T) prompt and answer (text).
        n: N, the prompt's length; the answer's tokens are scored.
        start: the first query position that sees a bias, 1 <= start <= N - 1.
    """

    def __init__(self, model: torch.nn.Module, input_ids: torch.Tensor, n: int, start: int) -> None:
        if not 0 < start <= n - 1:
            raise ValueError(f"packed passes start within the prompt (1 to {n - 1}), got {start}")
        self.model, self.input_ids, self.n, self.start = model, input_ids, n, start
        self.cache: DynamicCache | None = None
        self.positions = 0

    def _prefix(self) -> DynamicCache | None:
        """The unperturbed cache of positions [0, start), by the model's own kernels; None if it cannot be sliced."""
        if self.cache is None:
            self.cache = DynamicCache()  # no config: every layer keeps all positions, sliding ones included
            self.model(input_ids=self.input_ids[:, : self.start], past_key_values=self.cache, use_cache=True,
                       logits_to_keep=1)  # fmt: skip
            self.positions += self.start
        return self.cache if reusable(self.cache, self.start) else None

    def scores(self, log_bias: torch.Tensor, segments: int = 0, progress: ProgressFn | None = None,
               label: str = "Sources") -> np.ndarray:  # fmt: skip
        """CE_k(row r's bias on the queries from `start` on) - CE_k(original) for every row.

        Args:
            log_bias: (R, T) pre-softmax bias per key position.
            segments: rows per pass besides the baseline; 0: from the device (`kv.packed_positions`).

        Returns:
            (K, R) float32.
        """
        ids, n, start = self.input_ids, self.n, self.start
        t, r = ids.shape[1], log_bias.shape[0]
        k, length = t - n, t - 1 - start
        columns = torch.zeros(k, r, dtype=torch.float32, device=ids.device)  # (K, R)
        if k <= 0 or r == 0:
            return to_numpy(columns)
        cache = self._prefix()
        if cache is None:  # a cache layout we cannot slice (e.g. recurrent layers): one full forward per row
            self.positions += (r + 1) * t
            return naive_scores(self.model, ids, n, log_bias, progress, {}, None, label, start)
        per_pass = segments or max(1, packed_positions(self.model, t) // length - 1)
        chunks = [list(range(i, min(r, i + per_pass))) for i in range(0, r, per_pass)]
        targets = ids[0, n:]  # (K,)
        with attention_suppression(self.model) as state:
            for done, chunk in enumerate(chunks, start=1):
                rows = torch.cat([torch.zeros_like(log_bias[:1]), log_bias[chunk]])  # (S, T): row 0 hides nothing
                s = rows.shape[0]
                state.mask = _packed_mask(rows, start, length)
                out = self.model(
                    input_ids=ids[:, start : t - 1].repeat(1, s),  # (1, S·L)
                    position_ids=torch.arange(start, t - 1, device=ids.device).repeat(s)[None],  # (1, S·L)
                    past_key_values=prefix_cache(cache, start, 1),
                    use_cache=True,
                    logits_to_keep=s * length,
                )
                check_manipulated(state)
                ce = cross_entropy(out.logits.view(s, length, -1)[:, length - k :], targets)  # (S, K)
                columns[:, chunk] = (ce[1:] - ce[:1]).T.to(columns.device)  # (K, S - 1)
                self.positions += s * length
                report_progress(progress, done, len(chunks), label)
        return to_numpy(columns)
