"""The decode layer: which path a request's decode takes (`choose_path`, `choice.py`) and why, the job every path
runs (`DecodeJob`, `job.py`) and the per-token work that every path's scheduler calls (`step.py`).

By default (`EXPLAINER_DECODE` unset or `auto`):

- `batched`, a row of the model's batched decode (`batched/`): a text request while batching is on (the app) and
  the caller does not hold the model; the batch's step is one CUDA graph per slot state on CUDA, row by row on a CPU
  (`choice.batch_step_form`);
- `cuda-graph`, the static-cache step (`static.py`) replayed as a CUDA graph: on CUDA, when every
  streaming method has a device step (`has_device_step`: MACS, calibrated MACS, Rollout), text and image prompts;
- `static`, the same step run eagerly: on CUDA after a failed capture;
- `solo`, the plain loop (`solo.py`): the rest (the CPU, text prompts to vision-language models, sliding
  windows, device maps, methods without a device step).

`EXPLAINER_DECODE` = `solo`, `static`, `static-eager` or `batched` forces a path wherever it can run. The result
records the choice once, `meta["decode"] = {path, reason, batch_size, prefill_rows}`; every `Step` carries its path.
"""

from .choice import (
    BATCHED,
    CUDA_GRAPH,
    DECODE_ENV,
    OVERRIDES,
    PATHS,
    SOLO,
    STATIC,
    DecodeChoice,
    batching_enabled,
    choose_path,
    decode_record,
    enable_batching,
)
from .job import DecodeJob
from .step import Step

__all__ = [
    "BATCHED",
    "CUDA_GRAPH",
    "DECODE_ENV",
    "OVERRIDES",
    "PATHS",
    "SOLO",
    "STATIC",
    "DecodeChoice",
    "DecodeJob",
    "Step",
    "batching_enabled",
    "choose_path",
    "decode_record",
    "enable_batching",
]
