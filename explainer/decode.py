"""The decode loop: greedy generation (or a given answer, teacher-forced) with the streaming methods' score rows.

Step k explains generated token k: its attention row comes from the forward pass whose logits chose token k (the
prefill's last prompt position for k = 0, the previous token's decode pass after; MACS paper section 3.2.1).
Attention capture is entered around each forward pass only, never across a `yield`, so a consumer that stops
iterating (or fails) cannot leave the model changed.

A given answer is teacher-forced: the loop feeds its tokens instead of the argmax, with the very same forward passes,
so every method explains each answer token as if the model had generated it (the "forced targets" of inseq). Each
step also records the probability the model gave its token and the entropy of that next-token distribution, from the
logits the step computed anyway.

This is the part that GPU graph capture and batching of several visitors change; the request orchestration around it
(encoding, post-hoc methods, snapshots) is `explain.py`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from transformers import DynamicCache

from .capture import capture_attention
from .contrast import TOP_ALTERNATIVES
from .errors import InputError
from .methods import AttributionMethod
from .result.sinks import SinkTracker
from .runtime.kv import full_row_chunk
from .runtime.session import check_cancelled


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


def _next_token(logits: torch.Tensor, forced: int | None) -> tuple[int, float, float, list[tuple[int, float]]]:
    """(V,) next-token logits -> (token: the argmax or `forced`, its probability, the entropy in nats, the
    `TOP_ALTERNATIVES` most probable tokens as (id, probability)), in float32 whatever the model's dtype, with one
    device sync for all."""
    probs = torch.softmax(logits.float(), dim=-1)  # (V,)
    token = logits.argmax() if forced is None else torch.tensor(forced, device=logits.device)  # ()
    top = probs.topk(min(TOP_ALTERNATIVES, probs.shape[0]))  # (A,) values and indices
    head = torch.stack([token.double(), probs[token].double(), torch.special.entr(probs).sum().double()])  # (3,)
    stats = torch.cat([head, top.indices.double(), top.values.double()]).tolist()  # (3 + 2A,)
    t, p, h = stats[:3]  # entr(0) = 0: masked logits are fine; float64 holds any token id exactly
    a = (len(stats) - 3) // 2
    alternatives = [(int(i), float(q)) for i, q in zip(stats[3 : 3 + a], stats[3 + a :])]
    return int(t), min(max(p, 0.0), 1.0), max(h, 0.0), alternatives


def _full_row_consumer(methods: Sequence[AttributionMethod]):
    consumers = [m.consume_full_rows for m in methods if getattr(m, "needs_full_rows", False)]
    if not consumers:
        return None

    def consume(layer_idx: int, q_start: int, probs: torch.Tensor) -> None:
        for c in consumers:
            c(layer_idx, q_start, probs)

    return consume


@torch.inference_mode()
def generate_steps(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    methods: Sequence[AttributionMethod],
    max_new_tokens: int,
    eos_token_ids: Iterable[int] = (),
    method_seconds: dict[str, float] | None = None,
    extra_inputs: dict[str, Any] | None = None,
    forced_ids: Sequence[int] | None = None,
    sinks: SinkTracker | None = None,
) -> Iterator[Step]:
    """Greedy decoding that yields each token with the streaming methods' scores.

    Args:
        model: causal LM.
        input_ids: (1, N) prompt.
        methods: streaming methods (post-hoc ones are ignored here).
        max_new_tokens: upper bound on K.
        eos_token_ids: generation stops after producing one of these (it is yielded as the last step).
        method_seconds: if given, accumulates per-method time spent in `step`.
        extra_inputs: keyword inputs of the prefill forward only (e.g. a vision-language model's `pixel_values`,
            `image_grid_thw`). When they hold explicit `position_ids` (..., N), decode steps continue from the last
            prompt position in every axis (Qwen's 3D mRoPE), so no position state is read from or left in the model.
        forced_ids: a given answer (K ids, K <= max_new_tokens): step k yields `forced_ids[k]` instead of the argmax
            and feeds it to the next pass; otherwise the forward passes are those of generation. All K steps run, an
            end-of-sequence id inside the answer included.
        sinks: gathers, on the device, what attention-sink detection needs when a streaming method captures rows.

    Each `Step` carries the probability its logits gave its token and their entropy (nats); no extra forward pass.
    """
    forced_ids, max_new_tokens = _check_request(model, input_ids, forced_ids, max_new_tokens)
    n = input_ids.shape[1]
    streaming = [m for m in methods if m.streaming]
    for m in streaming:
        m.begin(n)
    capture = _full_row_consumer(streaming) if streaming else False  # False: no attention captured
    eos = set(eos_token_ids)
    cache = DynamicCache(config=model.config)
    next_input = input_ids
    inputs = dict(extra_inputs or {})  # prefill only
    prompt_positions = inputs.get("position_ids")  # (..., N) or None
    for k in range(max_new_tokens):
        check_cancelled()
        t0 = time.perf_counter()
        if k > 0:
            inputs = {} if prompt_positions is None else {"position_ids": prompt_positions[..., -1:] + k}  # (..., 1)
        logits, rows = _forward(model, next_input, cache, inputs, capture, n + k, sinks, k == 0)
        token, probability, entropy, alternatives = _next_token(logits, None if forced_ids is None else forced_ids[k])
        forward_seconds = time.perf_counter() - t0
        scores = _method_scores(streaming, rows, method_seconds)
        yield Step(
            index=k, token_id=token, scores=scores, seconds=forward_seconds, probability=probability, entropy=entropy,
            alternatives=alternatives,
        )  # fmt: skip
        if forced_ids is None and token in eos:
            break
        next_input = torch.tensor([[token]], dtype=input_ids.dtype, device=input_ids.device)  # (1, 1)


def _check_request(
    model: torch.nn.Module, input_ids: torch.Tensor, forced_ids: Sequence[int] | None, max_new_tokens: int
) -> tuple[list[int] | None, int]:
    """(the forced ids checked, the number of steps): K = len(forced_ids) when an answer is given."""
    if input_ids.ndim != 2 or input_ids.shape[0] != 1:
        raise InputError(f"expected input_ids of shape (1, N), got {tuple(input_ids.shape)}")
    if forced_ids is None:
        return None, max_new_tokens
    forced = check_token_ids(forced_ids, model.get_input_embeddings().num_embeddings)
    if len(forced) > max_new_tokens:
        raise InputError(f"The answer has {len(forced)} tokens, more than max_new_tokens ({max_new_tokens}).")
    return forced, len(forced)


def _forward(
    model: torch.nn.Module,
    ids: torch.Tensor,
    cache: DynamicCache,
    inputs: dict[str, Any],
    consumer: Any,
    total: int,
    sinks: SinkTracker | None = None,
    prefill: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One generation pass: (V,) next-token logits and, unless `consumer` is False (no streaming method), the
    (L, H, `total`) attention rows of its last query, captured for this pass only; `sinks` gets the rows (and, in the
    `prefill`, the hidden-state norms)."""
    if consumer is False:
        out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1, **inputs)
        return out.logits[0, -1], None
    chunk = full_row_chunk(total, ids.device.type)  # (H, chunk, T) rows per consumer call: sized by the device
    with capture_attention(model, full_row_consumer=consumer, full_row_chunk=chunk) as recorder:
        with sinks.probing_norms(model) if sinks is not None and prefill else contextlib.nullcontext():
            out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1, **inputs)
        rows = recorder.stacked(total)[:, 0]  # (L, H, total)
    if sinks is not None:
        sinks.add(rows)
    return out.logits[0, -1], rows


def _method_scores(
    streaming: Sequence[AttributionMethod], rows: torch.Tensor | None, method_seconds: dict[str, float] | None
) -> dict[str, np.ndarray]:
    """Each streaming method's (N,) raw row of this step, its time added to `method_seconds` when given."""
    scores = {}
    for m in streaming:
        t1 = time.perf_counter()
        scores[m.name] = m.step(rows)
        if method_seconds is not None:
            method_seconds[m.name] = method_seconds.get(m.name, 0.0) + time.perf_counter() - t1
    return scores


def check_token_ids(ids: Any, vocab_size: int) -> list[int]:
    """A non-empty list of ids the model's embedding holds, or an InputError (never an index error on the device)."""
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence | np.ndarray | torch.Tensor):
        raise InputError(f"Answer token ids must be a list of whole numbers, got {type(ids).__name__}.")
    out = []
    for t in list(ids.tolist() if isinstance(ids, np.ndarray | torch.Tensor) else ids):
        if isinstance(t, bool) or not isinstance(t, int | np.integer) or not 0 <= int(t) < vocab_size:
            raise InputError(f"Answer token ids must be whole numbers from 0 to {vocab_size - 1}, found {t!r:.40}.")
        out.append(int(t))
    if not out:
        raise InputError("The answer has no tokens: give at least one token id, or no answer to generate one.")
    return out


# The batched decode (explainer/batching/) runs each row's prefill and reads each of its steps with these very
# helpers, so a row's tokens, probabilities and method rows are computed as in this loop.
forward_pass = _forward
next_token = _next_token
full_row_consumer = _full_row_consumer
method_scores = _method_scores
checked_request = _check_request
