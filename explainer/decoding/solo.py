"""The decode loop: greedy generation (or a given answer, teacher-forced) with the streaming methods' score rows.

Step k explains generated token k: its attention row comes from the forward pass whose logits chose token k (the
prefill's last prompt position for k = 0, the previous token's decode pass after; MACS paper section 3.2.1).
Attention capture is entered around each forward pass only, never across a `yield`, so a consumer that stops
iterating (or fails) cannot leave the model changed.

A given answer is teacher-forced: the loop feeds its tokens instead of the argmax, with the very same forward passes,
so every method explains each answer token as if the model had generated it (the "forced targets" of inseq). Each
step also records the probability the model gave its token and the entropy of that next-token distribution, from the
logits the step computed anyway.

The other schedulers of the same step are the static step (`static.py`) and the batch (`batched/`); which one runs
is the request's `DecodeChoice`, dispatched once by `decoding.generate_steps` (`dispatch.py`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import torch
from transformers import DynamicCache

from ..methods import AttributionMethod
from ..result.sinks import SinkTracker
from ..runtime.session import between_passes
from .job import DecodeJob
from .step import Step, ends, forward_pass, full_row_consumer, make_step, method_scores, token_stats

__all__ = ["DecodeJob", "Step", "solo_steps"]


def solo_steps(
    model: torch.nn.Module,
    job: DecodeJob,
    streaming: list[AttributionMethod],
    method_seconds: dict[str, float] | None = None,
    sinks: SinkTracker | None = None,
) -> Iterator[Step]:
    """Greedy decoding (or the job's given answer, teacher-forced) on a dynamic cache, one Python step per token,
    yielding each token with the `streaming` methods' scores (they have had `begin`); the dispatcher
    (`decoding.generate_steps`) calls it under inference mode.

    Each `Step` carries the probability its logits gave its token and their entropy (nats); no extra forward pass.
    """
    input_ids = job.input_ids
    n = input_ids.shape[1]
    full_rows = full_row_consumer(streaming)  # None: no method reads a prefill's full rows
    cache = DynamicCache(config=model.config)
    next_input = input_ids
    inputs = dict(job.extra_inputs or {})  # prefill only
    forced = None if job.forced_ids is None else torch.tensor(job.forced_ids, device=input_ids.device)  # (K,)
    for k in range(job.num_steps):
        between_passes()
        t0 = time.perf_counter()
        if k > 0:
            inputs = job.step_positions(k)  # explicit positions (mRoPE) continue from the prompt's last
        logits, attention = forward_pass(
            model, next_input, cache, inputs, n + k, keep_rows=bool(streaming), full_rows=full_rows, sinks=sinks,
            prefill=k == 0,
        )  # fmt: skip
        stats = token_stats(logits, None if forced is None else forced[k : k + 1])[1].tolist()  # the step's one read
        seconds = time.perf_counter() - t0
        scores = method_scores(streaming, lambda m, attention=attention: m.step(attention), method_seconds)
        step = make_step(k, stats, scores, seconds)
        yield step
        if ends(k + 1, step.token_id, job.num_steps, job.stop_ids):
            break
        next_input = torch.tensor([[step.token_id]], dtype=input_ids.dtype, device=input_ids.device)  # (1, 1)
