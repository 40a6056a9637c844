"""The per-token work of every decode path, written once: the solo loop (`solo.py`), the static step and its CUDA
graph (`static.py`) and the batched rows (`batched/row.py`) only schedule it.

For one generated (or forced) token:

- `token_stats`: from the (V,) logits, on the device, the token (the argmax or a given answer's token), its
  probability, the entropy of the distribution and the most probable alternatives, as one (3 + 2A,) float64 row that
  the host reads once (`read_token`) whenever its scheduler reads;
- `forward_pass`: the generation pass with attention capture (the solo loop's passes, a batched row's prefill);
- `method_scores`: each streaming method's row of the step, its time summed per method;
- the sink tracker's share of a step's attention rows is `SinkTracker.share` (`SinkTracker.add` sums it; the static
  step sums it in place);
- `ends`: the stop rule, after a step's token: the job's step count, or an end-of-sequence id unless the answer is
  given;
- `query_stashing_attention`: the attention function of both fixed-shape steps (the static step's and the batch's),
  which stashes each layer's last query for the rows computed after the pass.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from transformers import DynamicCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from ..capture import QueryStash, capture_attention, check_attention_kwargs
from ..contrast import TOP_ALTERNATIVES
from ..methods import AttributionMethod
from ..result.sinks import SinkTracker
from ..runtime.kv import full_row_chunk
from .choice import SOLO


@dataclass
class Step:
    """One generated (or forced) token and the raw score row of every streaming method: name -> (N,)."""

    index: int
    token_id: int
    scores: dict[str, np.ndarray]
    seconds: float  # wall time of this step's forward pass (and of its probability and entropy)
    probability: float = float("nan")  # softmax probability of `token_id` at this step
    entropy: float = float("nan")  # entropy of this step's next-token distribution, in nats
    alternatives: list[tuple[int, float]] = field(default_factory=list)  # the most probable tokens: (id, probability)
    decode_path: str = SOLO  # the path that computed it (`decoding.PATHS`): meta["decode"]["path"] of its result


def token_stats(logits: torch.Tensor, forced: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(V,) next-token logits -> ((1,) long token, (3 + 2A,) float64 [token, its probability, entropy in nats,
    A = `TOP_ALTERNATIVES` ids, their probabilities]), in float32 whatever the model's dtype; no host read.

    `forced`: (1,) long, a given answer's token, or -1 (or None) for the argmax."""
    probs = torch.softmax(logits.float(), dim=-1)  # (V,)
    # The probabilities' argmax is the logits' (softmax keeps their order, ties included) and is found faster on the
    # CPU in float32 than in the logits' bfloat16.
    token = probs.argmax().view(1)  # (1,)
    if forced is not None:
        forced = forced.to(token.device)  # a device map may put the logits elsewhere; a no-op otherwise
        token = torch.where(forced >= 0, forced, token)  # (1,)
    top = probs.topk(min(TOP_ALTERNATIVES, probs.shape[0]))  # (A,) values and indices
    entropy = torch.special.entr(probs).sum()  # entr(0) = 0: masked logits are fine
    head = torch.stack([token[0].double(), probs.gather(0, token)[0].double(), entropy.double()])  # (3,)
    return token, torch.cat([head, top.indices.double(), top.values.double()])  # (3 + 2A,)


def read_token(stats: Sequence[float]) -> tuple[int, float, float, list[tuple[int, float]]]:
    """A `token_stats` row read on the host -> (token, probability, entropy, alternatives as (id, probability));
    float64 holds any token id exactly."""
    t, p, h = stats[0], stats[1], stats[2]
    a = (len(stats) - 3) // 2
    alternatives = [(int(i), float(q)) for i, q in zip(stats[3 : 3 + a], stats[3 + a :])]
    return int(t), min(max(float(p), 0.0), 1.0), max(float(h), 0.0), alternatives


def make_step(
    index: int, stats: Sequence[float], scores: dict[str, np.ndarray], seconds: float, path: str = SOLO
) -> Step:
    """The `Step` of a read `token_stats` row and the methods' scores."""
    token, probability, entropy, alternatives = read_token(stats)
    return Step(
        index=index, token_id=token, scores=scores, seconds=seconds, probability=probability, entropy=entropy,
        alternatives=alternatives, decode_path=path,
    )  # fmt: skip


def method_scores(
    methods: Sequence[AttributionMethod],
    score: Callable[[AttributionMethod], np.ndarray],
    method_seconds: dict[str, float] | None,
) -> dict[str, np.ndarray]:
    """Each method's (N,) raw row of this step, `score(method)`, its time added to `method_seconds` when given."""
    scores = {}
    for m in methods:
        t1 = time.perf_counter()
        scores[m.name] = score(m)
        if method_seconds is not None:
            method_seconds[m.name] = method_seconds.get(m.name, 0.0) + time.perf_counter() - t1
    return scores


def device_scores(
    methods: Sequence[AttributionMethod],
    layers: Sequence[torch.Tensor | None],
    rows: torch.Tensor,
    k: torch.Tensor,
) -> list[torch.Tensor]:
    """Each method's row of step `k` as fixed-shape device work (`device_step`; all have `has_device_step`), its layer
    factors written into row k of its `layers` buffer where it has one (`reserve_layers`); no host read.

    Args:
        rows: (L, H, T) attention rows of the step's query over N + K - 1 positions, keys after it exactly 0.
        k: (1,) long on the device, the step.

    Returns:
        each method's (N,) row on the device (MACS: float64 log; Rollout: float32), for its `finish_step`."""
    out = []
    for m, buffer in zip(methods, layers):
        row, floored = m.device_step(rows, k)
        if buffer is not None:
            buffer.index_copy_(0, k, floored[None])
        out.append(row)
    return out


def ends(steps_done: int, token: int, num_steps: int, stop_ids: Container[int]) -> bool:
    """Whether decoding stops after a step's `token`: `num_steps` done, or a stop id (`DecodeJob.stop_ids`)."""
    return steps_done >= num_steps or token in stop_ids


def full_row_consumer(methods: Sequence[AttributionMethod]) -> Callable[[int, int, torch.Tensor], None] | None:
    """One consumer of a prefill's full rows that hands each chunk to every method with `needs_full_rows`; None when
    none has it."""
    consumers = [m.consume_full_rows for m in methods if m.needs_full_rows]
    if not consumers:
        return None

    def consume(layer_idx: int, q_start: int, probs: torch.Tensor) -> None:
        for c in consumers:
            c(layer_idx, q_start, probs)

    return consume


def forward_pass(
    model: torch.nn.Module,
    ids: torch.Tensor,
    cache: DynamicCache,
    inputs: dict[str, Any],
    total: int,
    *,
    keep_rows: bool,
    full_rows: Callable[[int, int, torch.Tensor], None] | None = None,
    sinks: SinkTracker | None = None,
    prefill: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One generation pass: (V,) next-token logits and, when `keep_rows` (a streaming method reads them), the
    (L, H, `total`) attention rows of its last query, captured for this pass only (else None); `full_rows` gets every
    query row of a prefill (`full_row_consumer`); `sinks` gets the rows (and, in the `prefill`, the hidden-state
    norms)."""
    if not keep_rows:
        out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1, **inputs)
        return out.logits[0, -1], None
    chunk = full_row_chunk(total, ids.device.type)  # (H, chunk, T) rows per consumer call: sized by the device
    with capture_attention(model, full_row_consumer=full_rows, full_row_chunk=chunk) as recorder:
        with sinks.probing_norms(model) if sinks is not None and prefill else contextlib.nullcontext():
            out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1, **inputs)
        rows = recorder.stacked(total)[:, 0]  # (L, H, total)
    if sinks is not None:
        sinks.add(rows)
    return out.logits[0, -1], rows


def query_stashing_attention(what: str, stash: QueryStash | None, on_call: Callable | None = None) -> Callable:
    """An attention function (transformers' signature) for a fixed-shape step: the model's own SDPA output, and each
    layer's last query with its temperature put in `stash` (when given) for the rows of all layers that come after
    the pass (`QueryStash.write_rows`); `on_call(module, query, key, attention_mask, scale)` then sees the call (the
    static step hands a prefill's full rows there). `what` names the caller in an unsupported model's error."""

    def attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        check_attention_kwargs(module, kwargs, what)
        out, _ = sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
        if stash is not None or on_call is not None:
            scale = scaling if scaling is not None else query.shape[-1] ** -0.5
            if on_call is not None:
                on_call(module, query, key, attention_mask, scale)
            if stash is not None:
                stash.put(module.layer_idx, query[:, :, -1], scale)  # (B, H, D)
        return out, None

    return attention
