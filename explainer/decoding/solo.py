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

import time
from collections.abc import Iterator

import torch
from transformers import DynamicCache

from ..result.sinks import SinkTracker
from ..runtime.session import between_passes
from . import static
from .choice import BATCHED, SOLO, DecodeChoice, choose_path
from .job import DecodeJob
from .step import Step, ends, forward_pass, full_row_consumer, make_step, method_scores, token_stats

__all__ = ["DecodeJob", "Step", "generate_steps"]


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
            (a batched row runs through `decoding.batched.batched_steps`).

    Each `Step` carries the probability its logits gave its token and their entropy (nats); no extra forward pass.
    """
    choice = choice or choose_path(model, job, can_batch=False)
    if choice.path == BATCHED:
        raise ValueError("a batched row runs through decoding.batched.batched_steps")
    input_ids = job.input_ids
    n = input_ids.shape[1]
    streaming = [m for m in job.methods if m.streaming]
    for m in streaming:
        m.begin(n)
    if choice.path != SOLO:  # the static step: eager or as a CUDA graph
        return (yield from static.static_steps(model, job, streaming, sinks, method_seconds, choice.path))
    capture = full_row_consumer(streaming) if streaming else False  # False: no attention captured
    cache = DynamicCache(config=model.config)
    next_input = input_ids
    inputs = dict(job.extra_inputs or {})  # prefill only
    prompt_positions = inputs.get("position_ids")  # (..., N) or None
    forced = None if job.forced_ids is None else torch.tensor(job.forced_ids, device=input_ids.device)  # (K,)
    for k in range(job.num_steps):
        between_passes()
        t0 = time.perf_counter()
        if k > 0:
            inputs = {} if prompt_positions is None else {"position_ids": prompt_positions[..., -1:] + k}  # (..., 1)
        logits, rows = forward_pass(model, next_input, cache, inputs, capture, n + k, sinks, k == 0)
        stats = token_stats(logits, None if forced is None else forced[k : k + 1])[1].tolist()  # the step's one read
        seconds = time.perf_counter() - t0
        step = make_step(k, stats, method_scores(streaming, lambda m, rows=rows: m.step(rows), method_seconds), seconds)
        yield step
        if ends(k + 1, step.token_id, job.num_steps, job.stop_ids):
            break
        next_input = torch.tensor([[step.token_id]], dtype=input_ids.dtype, device=input_ids.device)  # (1, 1)
