"""The one dispatcher of the decode layer: a request's `DecodeChoice` (made once, in the request path:
`explain.decode_choice`, which asks `choice.choose_path`) picks the scheduler that runs its steps, the way a serving
engine's runner picks the graph mode per batch shape:

- `solo`: the plain loop on a dynamic cache (`solo.solo_steps`);
- `static` / `cuda-graph`: the static-cache step, eagerly or replayed as a CUDA graph (`static.static_steps`);
- `batched`: a row of the model's batch (`batched.batched_steps`), in the batch's form the choice names.

No scheduler asks for the path again; a graph whose capture fails falls back inside its wrapper (`graphs.StepGraph`)
and the steps say so (`Step.decode_path`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from ..result.sinks import SinkTracker
from .batched import batched_steps
from .choice import BATCHED, SOLO, DecodeChoice
from .job import DecodeJob
from .solo import solo_steps
from .static import static_steps
from .step import Step

__all__ = ["generate_steps"]


def generate_steps(
    model: torch.nn.Module,
    job: DecodeJob,
    choice: DecodeChoice,
    method_seconds: dict[str, float] | None = None,
    sinks: SinkTracker | None = None,
    seen: dict[str, Any] | None = None,
) -> Iterator[Step]:
    """Greedy decoding (or the job's given answer, teacher-forced) that yields each token with the streaming
    methods' scores, on the path `choice` names.

    Args:
        model: causal LM.
        job: the prompt, methods and answer (`DecodeJob`).
        choice: the request's path, decided once in the request path (`explain.decode_choice`; a caller with a bare
            job gets its choice there too, never `batched`: it holds no place in the batch).
        method_seconds: if given, accumulates per-method time spent in `step`.
        sinks: gathers, on the device, what attention-sink detection needs when a streaming method captures rows.
        seen: on the batched path, gets "batch_size" and "prefill_rows" (`batched.batched_steps`).

    Each `Step` carries the probability its logits gave its token and their entropy (nats); no extra forward pass.
    """
    if choice.path == BATCHED:
        return batched_steps(model, job, method_seconds, sinks, seen, choice.form)
    return _alone(model, job, method_seconds, sinks, choice)


@torch.inference_mode()
def _alone(
    model: torch.nn.Module,
    job: DecodeJob,
    method_seconds: dict[str, float] | None,
    sinks: SinkTracker | None,
    choice: DecodeChoice,
) -> Iterator[Step]:
    streaming = [m for m in job.methods if m.streaming]
    for m in streaming:
        m.begin(job.input_ids.shape[1])
    if choice.path == SOLO:
        return (yield from solo_steps(model, job, streaming, method_seconds, sinks))
    return (yield from static_steps(model, job, streaming, sinks, method_seconds, choice.graphs))
