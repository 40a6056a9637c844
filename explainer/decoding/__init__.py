"""The decode layer, in a serving engine's roles: `choose_path` (`choice.py`) decides a request's path once (asked by
the request path alone, `explain.decode_choice`), a `DecodeChoice` (path, reason, the step's form); `generate_steps`
(`dispatch.py`) hands the request's `DecodeJob` (`job.py`) to the scheduler the choice names: the solo loop (`solo.py`),
the static step (`static.py`) or a row of the batch (`batched/`); every scheduler calls the same per-token work
(`step.py`), and the one graph wrapper (`graphs.py`) records and replays both CUDA graphs (the static step's and the
batch's).

The paths are two axes, alone or in the batch, and a dynamic, fixed-shape eager or CUDA-graph step (see
`choice.py` and docs/architecture.md). `EXPLAINER_DECODE` = `solo`, `static`, `cuda-graph` or `batched` (the path
names) forces a path wherever it can run; `batched:fixed-shape` also forces the batch's form. The result records the
choice once, `meta["decode"] = {path, reason, batch_size, prefill_rows}`; every `Step` carries its path.
"""

from .choice import (
    BATCHED,
    CUDA_GRAPH,
    DECODE_ENV,
    DYNAMIC,
    FIXED_SHAPE,
    FORMS,
    GRAPH,
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
from .dispatch import generate_steps
from .job import DecodeJob
from .step import Step

__all__ = [
    "BATCHED",
    "CUDA_GRAPH",
    "DECODE_ENV",
    "DYNAMIC",
    "FIXED_SHAPE",
    "FORMS",
    "GRAPH",
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
    "generate_steps",
]
