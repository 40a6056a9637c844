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

from . import static_decode
from .capture import capture_attention
from .contrast import TOP_ALTERNATIVES
from .decoding.choice import BATCHED, SOLO, DecodeChoice, choose_path
from .errors import InputError
from .methods import AttributionMethod
from .result.sinks import SinkTracker
from .runtime.kv import full_row_chunk
from .runtime.session import between_passes


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


def _next_token(logits: torch.Tensor, forced: int | None) -> tuple[int, float, float, list[tuple[int, float]]]:
    """(V,) next-token logits -> (token: the argmax or `forced`, its probability, the entropy in nats, the
    `TOP_ALTERNATIVES` most probable tokens as (id, probability)), in float32 whatever the model's dtype, with one
    device sync for all."""
    probs = torch.softmax(logits.float(), dim=-1)  # (V,)
    # The probabilities' argmax is the logits' (softmax keeps their order, ties included) and is found faster on the
    # CPU in float32 than in the logits' bfloat16.
    token = probs.argmax() if forced is None else torch.tensor(forced, device=logits.device)  # ()
    top = probs.topk(min(TOP_ALTERNATIVES, probs.shape[0]))  # (A,) values and indices
    head = torch.stack([token.double(), probs[token].double(), torch.special.entr(probs).sum().double()])  # (3,)
    stats = torch.cat([head, top.indices.double(), top.values.double()]).tolist()  # (3 + 2A,)
    t, p, h = stats[:3]  # entr(0) = 0: masked logits are fine; float64 holds any token id exactly
    a = (len(stats) - 3) // 2
    alternatives = [(int(i), float(q)) for i, q in zip(stats[3 : 3 + a], stats[3 + a :])]
    return int(t), min(max(p, 0.0), 1.0), max(h, 0.0), alternatives


def _full_row_consumer(methods: Sequence[AttributionMethod]):
    consumers = [m.consume_full_rows for m in methods if m.needs_full_rows]
    if not consumers:
        return None

    def consume(layer_idx: int, q_start: int, probs: torch.Tensor) -> None:
        for c in consumers:
            c(layer_idx, q_start, probs)

    return consume


@dataclass(frozen=True, eq=False)
class DecodeJob:
    """What the decode loop runs: a prompt's ids, the methods, and the answer's bound or the given answer.

    `explain.py` makes one from an `ExplainRequest` once it has met the model (its ids encoded, a given answer
    tokenised and checked); tests and benchmarks make one from raw ids, e.g. `DecodeJob(ids, [get_method("macs")], 4)`.

    Attributes:
        input_ids: (1, N) the prompt.
        methods: the request's methods; the streaming ones score each step, the post-hoc ones are left out here.
        max_new_tokens: generation stops after this many tokens, or after an end-of-sequence token.
        forced_ids: a given answer: step k yields `forced_ids[k]` instead of the argmax and feeds it to the next pass
            (the forward passes are those of generation); all K = len(forced_ids) steps run, an end-of-sequence id
            inside the answer included, and `max_new_tokens` does not apply (the request checked that it fits).
        eos_token_ids: generation stops after producing one of these (it is yielded as the last step).
        extra_inputs: keyword inputs of the prefill forward only (e.g. a vision-language model's `pixel_values`,
            `image_grid_thw`). When they hold explicit `position_ids` (..., N), decode steps continue from the last
            prompt position in every axis (Qwen's 3D mRoPE), so no position state is read from or left in the model.
    """

    input_ids: torch.Tensor
    methods: Sequence[AttributionMethod]
    max_new_tokens: int
    forced_ids: Sequence[int] | None = None
    eos_token_ids: Iterable[int] = ()
    extra_inputs: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.input_ids.ndim != 2 or self.input_ids.shape[0] != 1:
            raise InputError(f"expected input_ids of shape (1, N), got {tuple(self.input_ids.shape)}")
        object.__setattr__(self, "methods", tuple(self.methods))
        object.__setattr__(self, "eos_token_ids", frozenset(self.eos_token_ids))
        if self.forced_ids is not None:
            object.__setattr__(self, "forced_ids", tuple(int(t) for t in self.forced_ids))

    @property
    def num_steps(self) -> int:
        """K: the given answer's length, else the bound `max_new_tokens` (generation may stop earlier)."""
        return self.max_new_tokens if self.forced_ids is None else len(self.forced_ids)


@torch.inference_mode()
def generate_steps(
    model: torch.nn.Module,
    job: DecodeJob,
    method_seconds: dict[str, float] | None = None,
    sinks: SinkTracker | None = None,
    choice: DecodeChoice | None = None,
) -> Iterator[Step]:
    """Greedy decoding (or the job's given answer, teacher-forced) that yields each token with the streaming
    methods' scores, on the solo loop or the static step.

    Args:
        model: causal LM.
        job: the prompt, methods and answer (`DecodeJob`).
        method_seconds: if given, accumulates per-method time spent in `step`.
        sinks: gathers, on the device, what attention-sink detection needs when a streaming method captures rows.
        choice: the path (`decoding.choose_path`'s, made once per request); None: chosen here, never `batched`
            (a batched row runs through `batching.batched_steps`).

    Each `Step` carries the probability its logits gave its token and their entropy (nats); no extra forward pass.
    """
    choice = choice or choose_path(model, job, can_batch=False)
    if choice.path == BATCHED:
        raise ValueError("a batched row runs through batching.batched_steps")
    input_ids, forced_ids = job.input_ids, job.forced_ids
    n = input_ids.shape[1]
    streaming = [m for m in job.methods if m.streaming]
    for m in streaming:
        m.begin(n)
    if choice.path != SOLO:  # the static step: eager or as a CUDA graph
        args = (job.num_steps, job.eos_token_ids, forced_ids, sinks, method_seconds, choice.path)
        return (yield from (Step(**r) for r in static_decode.static_steps(model, input_ids, streaming, *args)))
    capture = _full_row_consumer(streaming) if streaming else False  # False: no attention captured
    cache = DynamicCache(config=model.config)
    next_input = input_ids
    inputs = dict(job.extra_inputs or {})  # prefill only
    prompt_positions = inputs.get("position_ids")  # (..., N) or None
    for k in range(job.num_steps):
        between_passes()
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
        if forced_ids is None and token in job.eos_token_ids:
            break
        next_input = torch.tensor([[token]], dtype=input_ids.dtype, device=input_ids.device)  # (1, 1)


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


# The batched decode (explainer/batching/) runs each row's prefill and reads each of its steps with these very
# helpers, so a row's tokens, probabilities and method rows are computed as in this loop.
forward_pass = _forward
next_token = _next_token
full_row_consumer = _full_row_consumer
method_scores = _method_scores
