"""Many visitors, one model: text requests that arrive while others decode share the decode steps.

A request's row joins the batch at the next step and leaves when it is done or its visitor cancels or leaves:

- its prefill runs alone, at batch size 1 with capture, exactly as the solo loop's (`solo.generate_steps`), which
  gives its step 0 (rows with the same prompt that join together share that one pass: a crowd pressing the same
  example reads the prompt once, `row.same_prefill`); then its KV cache takes a free slot of the batch's static
  slots, left-aligned where its solo cache holds it (`slots.py`); the other rows do not move;
- each decode step runs every slot in one forward pass of fixed shape (`fixed.py`): on a CPU eagerly with attention
  row by row on each row's own keys by the solo call, on CUDA as one CUDA graph per slot state with attention over
  each slot's positions, masked (`attention.py`); either way each row gets its attention rows for its own streaming
  methods (MACS, Rollout), its own sink tracker, its forced ids (a given answer) or argmax, its own end-of-sequence
  ids and step count (`row.py`); in the fixed shape a row whose methods all have a device step runs them, and its
  sink shares, inside the step (so inside the graph); the host writes the forced ids before a step and reads every
  row's token statistics (and those methods' rows) after it;
- one thread per model owns the steps (`engine.py`), holding the model (`session.hold`) one round at a time; its
  rounds go first (`runtime/turns.py`): a request's post-hoc methods and other users of the model run when no row
  decodes, and give the model up between their passes when one arrives; a row that does not fit the memory check
  beside the others waits for room.

Off by default in the library (`decoding.enable_batching()`): a request then holds the model for its whole run, as
before; the app turns it on. Which requests join is `decoding.choose_path`'s choice (path `batched`); image prompts,
vision-language models, models with sliding-window layers (their window is measured in cache positions, which left
padding shifts) and models spread over several devices run solo.

Why not transformers' `ContinuousBatchingManager` (paged attention): it flattens all requests into one (1, sum of
queries) sequence over keys gathered from a paged cache, samples inside its own thread and hands back token ids only.
The capture would have to cut every request's last query and keys out of that layout, Rollout's prefill rows would
arrive mixed and possibly split by chunked prefill, and nothing would give each step's full distribution (probability,
entropy, alternatives) or feed a given answer.

Numbers: a visitor's result does not depend on who else decodes. The matrix products run at a fixed row count
(`products.py`: a CPU's or GPU's product library picks its kernel by the number of rows, and a row's last bits with
it), a lone row padded to it; token statistics are computed slot by slot; attention runs row by row on each row's own
keys (a CPU) or over its slot's C positions in a call of fixed shape (CUDA: a row's bits then depend on C, a power of
two of at least 256 positions, and not on the other rows). So every row equals, bit for bit, the same request
decoding alone in the batcher, in float32 and bfloat16 (tests/explainer/decoding/test_batched.py in both forms; on
CUDA, test_slots.py; the crowd test compares the app's visitors digit for digit). Against the solo loop
(`solo.generate_steps`, the library's default, 1-row products) the numbers agree to rounding: the tiny models'
float32 rows within ~3e-6 relative.
"""

from __future__ import annotations

import queue
from collections.abc import Iterator
from typing import Any

import torch

from ...result.sinks import SinkTracker
from ...runtime.session import check_cancelled
from ..choice import batch_step_form, override
from ..job import DecodeJob
from ..step import Step
from .engine import batcher_for, counts
from .row import Row

__all__ = ["batched_steps", "counts"]

POLL_SECONDS = 0.05  # how often a request waiting for its next step looks at its cancel token


def batched_steps(
    model: torch.nn.Module,
    job: DecodeJob,
    method_seconds: dict[str, float] | None = None,
    sinks: SinkTracker | None = None,
    seen: dict[str, Any] | None = None,
    form: str | None = None,
) -> Iterator[Step]:
    """`decoding.generate_steps` as a row of the model's batch: the same arguments and steps.

    The caller must not hold the model (the batcher's thread takes it for each round). `seen`, when given, gets
    "batch_size": the most rows any step of this request shared a forward pass with, and "prefill_rows": how many
    rows (itself included) took their step 0 from its prefill pass. `form`: the batch's step form, the request's
    `DecodeChoice.form` (None: the device's, or the one `EXPLAINER_DECODE` names: `choice.batch_step_form`); a
    batch already decoding keeps its own.

    Raises:
        ValueError: the job has prefill inputs (an image prompt: `decoding.choose_path` sends it to the static step
            or the solo loop).
    """
    if job.extra_inputs:
        raise ValueError("image prompts do not join the batched decode (decoding.generate_steps runs them)")
    row = Row(model, job, method_seconds, sinks)
    form = form or batch_step_form(model, job.input_ids.device, override()[1])[0]
    return _follow(row, model, form, seen)


def _follow(row: Row, model: torch.nn.Module, form: str, seen: dict[str, Any] | None) -> Iterator[Step]:
    batcher_for(model).submit(row, form)
    try:
        while True:
            check_cancelled()
            try:
                kind, value = row.out.get(timeout=POLL_SECONDS)
            except queue.Empty:  # look at the cancel token again
                continue
            if seen is not None:
                seen["batch_size"] = row.largest_batch
                seen["prefill_rows"] = row.prefill_rows
            if kind == "step":
                yield value
            elif kind == "error":
                raise value
            else:
                return
    finally:
        row.left.set()  # cancelled, closed or done: the batcher drops the row before its next step
