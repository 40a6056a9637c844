"""Attention Rollout (Abnar & Zuidema, 2020, "Quantifying Attention Flow in Transformers", Eq. 1), streamed.

Per layer l the head-fused attention gets the residual connection and renormalised rows,
`Â_l = normalise((1 - r) * fuse_h(A_l) + r * I)`, and rollout is `R_L = Â_L · … · Â_1`. The step-k map is the row
of R_L for the query that predicts generated token k, restricted to the N prompt tokens (raw), z-scored by the
result type.

Streaming: under causal attention earlier rows of every Â_l never change, so each generation step appends one row per
layer (from the captured attention rows) and the prefill fills the prompt rows once, layer by layer, chunk by chunk
(`needs_full_rows`). The wanted row is then computed as a vector-matrix chain from the left,
`e_t · Â_L · Â_{L-1} · … · Â_1`: per step this costs O(L·T²), the same as the textbook row recursion
`R_l[t] = Â_l[t] · R_{l-1}`, but it avoids that recursion's O(L·T²·N) product over all prompt rows at prefill
(tens of seconds at 4k tokens on a CPU). Memory is about the L·(N²/2 + K·T) entries of Â's rows (the prompt rows are
kept in blocks only as wide as causal attention lets them see); nothing else is kept. The prefill hands the prompt
rows over in chunks (32 a layer on a GPU); when they are all there each layer's chunks are merged into at most
`prompt_blocks` blocks, so a step's chain costs about L·(1 + blocks) kernels, not L·33: on a GPU, whose decode step is
bound by its launches, one block a layer (L·N² kept instead of about half; a crowd's rows each run this chain in the
batch's graph). On a CPU, bound by arithmetic (which the zeros of merged blocks raise) and short of memory, the
chunks stay as they are.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ..runtime.host import to_numpy
from ..runtime.kv import full_row_chunk
from ..runtime.memory import MemoryRequest
from .base import AttributionMethod

_FUSION = {
    "mean": lambda a: a.mean(dim=-3),  # (..., H, q, T) -> (..., q, T)
    "max": lambda a: a.amax(dim=-3),
}


@dataclass
class RolloutConfig:
    residual: float = 0.5  # weight r of the identity (residual connection) in Â = (1 - r)·A + r·I
    head_fusion: str = field(default="mean", metadata={"choices": tuple(_FUSION)})  # how heads are combined per
    # layer: "mean" (Abnar & Zuidema) or "max"

    def __post_init__(self) -> None:
        if self.head_fusion not in _FUSION:
            raise ValueError(f"head_fusion must be one of {sorted(_FUSION)}, got {self.head_fusion!r}")
        if not 0.0 <= self.residual <= 1.0:
            raise ValueError(f"residual must lie in [0, 1], got {self.residual}")


# Blocks a layer's prompt rows are merged into at most (see the module docstring); None: the prefill's chunks as they
# are (a CPU's decode step is bound by its arithmetic, which merged blocks raise, and by its memory).
CPU_PROMPT_BLOCKS: int | None = None
ACCELERATOR_PROMPT_BLOCKS = 1


def prompt_blocks(device_type: str) -> int | None:
    """Blocks a layer's prompt rows are merged into at most on a device of this type; None: not merged."""
    return CPU_PROMPT_BLOCKS if device_type == "cpu" else ACCELERATOR_PROMPT_BLOCKS


def _merged(blocks: list[tuple[int, torch.Tensor]], most: int) -> list[tuple[int, torch.Tensor]]:
    """A layer's consecutive row blocks [(first row, (q, W))] merged into at most `most` blocks, each as wide as its
    widest part (the parts' missing columns are keys their rows cannot see: 0)."""
    per = -(-len(blocks) // most)
    merged = []
    for i in range(0, len(blocks), per):
        group = blocks[i : i + per]
        first = group[0][0]
        rows, width = sum(b.shape[0] for _, b in group), max(b.shape[1] for _, b in group)
        out = group[0][1].new_zeros((rows, width))
        for start, block in group:
            out[start - first : start - first + block.shape[0], : block.shape[1]] = block
        merged.append((first, out))
    return merged


def _prefill_chunk(request: MemoryRequest) -> int:
    """Query rows per chunk the prefill hands over for this request (`kv.full_row_chunk`, at most N)."""
    return min(request.n, full_row_chunk(request.n, request.device_type))


def _prompt_elements(request: MemoryRequest) -> int:
    """Floats one layer's prompt rows keep: its prefill chunks merged into at most `prompt_blocks` blocks of
    consecutive rows, each as wide as its last row."""
    n, chunk = request.n, _prefill_chunk(request)
    chunks = -(-n // chunk)  # the prefill's chunks of a layer
    most = prompt_blocks(request.device_type) or chunks
    per = -(-chunks // most) * chunk  # rows per (merged) block
    return sum(min(per, n - a) * min(n, a + per) for a in range(0, n, per))


class Rollout(AttributionMethod):
    name = "rollout"
    display_name = "Attention Rollout"
    streaming = True
    explains_images = True
    needs_full_rows = True
    has_device_step = True  # `device_step`: one decode step's row and chain over preallocated (L, K - 1, T) rows
    Config = RolloutConfig

    @classmethod
    def memory(cls, request: MemoryRequest, config: RolloutConfig) -> int:
        """`kept_bytes` and, while the prefill runs, one chunk's probabilities, scores and fused rows (float32), then
        one layer's merged blocks beside its chunks; on an accelerator, where the device step moves every layer's
        prompt rows into one (L, T, T) buffer (`_square_up`), all of them once more for that moment."""
        passing = max(3 * request.shape.heads * _prefill_chunk(request) * request.n, _prompt_elements(request))
        if prompt_blocks(request.device_type) == 1:
            passing = max(passing, request.shape.layers * _prompt_elements(request))
        return cls.kept_bytes(request) + 4 * passing

    @staticmethod
    def kept_bytes(request: MemoryRequest) -> int:
        """The head-fused rows it keeps, float32: each layer's prompt rows (a triangle, L x N^2 / 2, stored in blocks
        of `kv.full_row_chunk` rows, merged into `prompt_blocks` on an accelerator, each as wide as its last row) and
        the generated rows (L x K x T, in one buffer that doubles)."""
        n, k = request.n, request.k
        return 4 * request.shape.layers * (_prompt_elements(request) + 2 * k * (n + 2 * k))

    def begin(self, num_prompt_tokens: int) -> None:
        self.n = num_prompt_tokens
        # layer -> [(first_row, (rows, W))]: Â's prompt rows in the chunks the prefill hands over, each only as wide
        # as its rows can see (W <= last row + 1 under causal attention), so about half of N² is stored.
        self.prompt_blocks: dict[int, list[tuple[int, torch.Tensor]]] = {}
        # (L, capacity, N + capacity) Â rows of the generated positions, layers in order
        self.gen: torch.Tensor | None = None
        self.square: torch.Tensor | None = None  # (L, T, T) on the device-step path with one prompt block a layer

    def _hat(self, probs: torch.Tensor, first_row: int) -> torch.Tensor:
        """Head-fused attention rows with the residual added and rows renormalised.

        Args:
            probs: (..., H, q, T) attention probabilities of query positions first_row .. first_row + q - 1 (of one
                layer, or of every layer at once).

        Returns:
            (..., q, T) float32 rows of Â.
        """
        r = self.config.residual
        hat = _FUSION[self.config.head_fusion](probs.float())  # (..., q, T), a new tensor: changed in place below
        hat.mul_(1.0 - r)
        q = hat.shape[-2]
        idx = torch.arange(q, device=hat.device)
        hat[..., idx, first_row + idx] += r
        return hat.div_(hat.sum(dim=-1, keepdim=True))

    def consume_full_rows(self, layer_idx: int, q_start: int, probs: torch.Tensor) -> None:
        """Prefill rows (1, H, q, W) of one layer; only prompt positions (rows and keys) are stored."""
        n = self.n
        if q_start >= n:
            return
        hat = self._hat(probs[0], q_start)  # (q, W)
        stop = min(n, q_start + hat.shape[0])
        block = hat[: stop - q_start, :n].contiguous()
        self.prompt_blocks.setdefault(layer_idx, []).append((q_start, block))

    def _store_generated_rows(self, t: int, rows: torch.Tensor) -> None:
        """Row t (a generated position) of every layer's Â, (L, T), into `gen`, doubling it when full."""
        j = t - self.n  # index among generated positions
        buf = self.gen
        if buf is None or j >= buf.shape[1]:
            cap = max(16, 2 * (0 if buf is None else buf.shape[1]), j + 1)
            grown = rows.new_zeros(rows.shape[0], cap, self.n + cap)  # on the rows' device
            if buf is not None:
                grown[:, : buf.shape[1], : buf.shape[2]] = buf
            buf = self.gen = grown
        buf[:, j, : rows.shape[1]] = rows

    def _prompt_rows_ready(self, rows: torch.Tensor, merge: bool = True) -> None:
        """At the prefill step: the prompt's Â rows are all there (a 1-token prompt has no multi-query pass, so its
        row comes from the step's (L, H, T) rows); with `merge`, each layer's chunks merged into `prompt_blocks`."""
        n, num_layers = self.n, rows.shape[0]
        if n > 1 and len(self.prompt_blocks) != num_layers:
            raise RuntimeError("rollout needs the prefill's full attention rows (capture full_row_consumer)")
        most = prompt_blocks(rows.device.type) if merge else None
        for layer, blocks in self.prompt_blocks.items():
            if most is not None and len(blocks) > most:
                self.prompt_blocks[layer] = _merged(blocks, most)
        for layer in range(num_layers) if n == 1 else ():
            self.prompt_blocks[layer] = [(0, self._hat(rows[layer][:, None, :], n - 1)[:, :n])]

    def step(self, rows: torch.Tensor) -> np.ndarray:
        n = self.n
        total = rows.shape[-1]  # (L, H, T), T = N + k
        t = total - 1  # the query position of this step
        if t == n - 1:  # prefill step
            self._prompt_rows_ready(rows)
        else:  # decode step: append this query's row of every layer's Â, all layers at once
            self._store_generated_rows(t, self._hat(rows[:, :, None, :], t)[:, 0])  # (L, T)
        k = t - n + 1  # generated positions that have rows: n .. t
        gen = self.gen[:, :k, :total] if k > 0 else None  # (L, k, T)
        return to_numpy(self._chain(self._last_row(t, total), gen), np.float32)

    def _chain(self, v: torch.Tensor, gen: torch.Tensor | None) -> torch.Tensor:
        """(N,) prompt columns of `v` · Â_{L-1} · … · Â_1 for v (T,) = row t of Â_L; `gen`: (L, k, T) the generated
        positions' rows (a fixed-shape buffer whose rows after t are 0 on the static path), or None before any."""
        n, total = self.n, v.shape[0]
        layers = sorted(self.prompt_blocks)
        for pos in range(len(layers) - 2, -1, -1):
            # Two kernels a layer when the prompt rows are one block (a GPU's step is bound by its launches).
            nxt = v.new_zeros(total) if gen is None else v[n : n + gen.shape[1]] @ gen[pos]  # (k,) @ (k, T)
            for first, block in self.prompt_blocks[layers[pos]]:  # + v[:N] · (Â_l's prompt rows), block by block
                nxt[: block.shape[1]].addmv_(block.T, v[first : first + block.shape[0]])  # (W, q) @ (q,)
            v = nxt
        return v[:n]

    def device_step(self, rows: torch.Tensor, step: torch.Tensor) -> tuple[torch.Tensor, None]:
        """The step as fixed-shape device work (the static decode path), no host read: the (N,) float32 raw row.

        Args:
            rows: (L, H, T) attention of the predicting query over a static cache of T = N + K - 1 positions, keys
                after the query exactly 0.
            step: (1,) long, on the device: k, the step this pass explains (0: the prefill, run eagerly).

        The first call (the prefill) allocates the (L, K - 1, T) buffer of the generated positions' Â rows; each
        later call writes row k - 1 of it and runs the chain over the whole buffer, whose rows after k - 1 hold 0.
        """
        n, total = self.n, rows.shape[-1]
        if self.gen is None:  # the prefill (eager): step 0
            square = prompt_blocks(rows.device.type) == 1 and n > 1  # an accelerator's layout
            self._prompt_rows_ready(rows, merge=not square)
            self._keys = torch.arange(total, device=rows.device)  # (T,)
            if square:
                self._square_up(rows.shape[0], total)
            else:
                self.gen = rows.new_zeros((rows.shape[0], total - n, total), dtype=torch.float32)  # (L, K - 1, T)
            return self._chain(self._last_row(n - 1, total), None), None
        hat = self._hat_at(rows[:, :, None, :], step + (n - 1))  # (L, 1, T)
        self.gen.index_copy_(1, step - 1, hat)
        if self.square is not None:  # one kernel a layer: v · Â_l over all T positions at once
            v = hat[-1, 0]
            for pos in range(self.square.shape[0] - 2, -1, -1):
                v = v @ self.square[pos]  # (T,) @ (T, T)
            return v[:n], None
        return self._chain(hat[-1, 0], self.gen), None

    def _square_up(self, num_layers: int, total: int) -> None:
        """An accelerator's layout on the device-step path: every layer's Â rows, prompt and generated, in one
        (L, T, T) buffer, the prompt's chunks copied in (the layer's one block and `gen` are views of it), so a decode
        step's chain is one product a layer. Until the chunks are copied the prompt rows are held twice (`memory`
        counts it)."""
        n = self.n
        square = torch.zeros((num_layers, total, total), device=self._keys.device)  # (L, T, T) float32
        for pos, layer in enumerate(sorted(self.prompt_blocks)):
            for first, block in self.prompt_blocks[layer]:
                square[pos, first : first + block.shape[0], : block.shape[1]] = block
            self.prompt_blocks[layer] = [(0, square[pos, :n, :n])]
        self.gen = square[:, n:, :]  # (L, K - 1, T)
        self.square = square

    def _hat_at(self, probs: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """`_hat` of one query row whose position t is a (1,) device tensor: (L, H, 1, T) -> (L, 1, T)."""
        r = self.config.residual
        hat = _FUSION[self.config.head_fusion](probs.float()).mul_(1.0 - r)  # (L, 1, T)
        hat.add_((self._keys == t).to(hat.dtype) * r)  # + 0 leaves every other entry's bits as they are
        return hat.div_(hat.sum(dim=-1, keepdim=True))

    def finish_step(self, row: np.ndarray) -> np.ndarray:
        """The (N,) float32 raw row of a step, read from the device (`device_step` computed it whole)."""
        return np.asarray(row, dtype=np.float32)

    def _last_row(self, t: int, total: int) -> torch.Tensor:
        """(T,) row t of the last layer's Â, on the device of the stored rows."""
        if t >= self.n:
            return self.gen[-1, t - self.n, :total]
        first, block = next((f, b) for f, b in self.prompt_blocks[max(self.prompt_blocks)] if f <= t < f + b.shape[0])
        out = block.new_zeros(total)
        out[: block.shape[1]] = block[t - first]
        return out

    def stored_elements(self) -> int:
        """Number of floats held (for the memory contract test)."""
        prompt = sum(b.numel() for blocks in self.prompt_blocks.values() for _, b in blocks)
        return prompt + (0 if self.gen is None else self.gen.numel())
