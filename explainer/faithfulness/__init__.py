"""Faithfulness of one explanation: token removal curves (MIF / LIF / SRG) and pi-Soft-NC / pi-Soft-NS.

- `removal`: MACS paper, Appendix A.2 (attention-masking removal, regeneration, SRG);
- `soft`: Grad-ELLM paper, section 3.1 (Bernoulli-masked input embeddings, Hellinger distances);
- `common`: evaluated positions, rankings and batching that both use.

`measure_faithfulness` runs both and returns one report; `stream_faithfulness` runs them in a worker that holds the
model and yields the report as it grows (removal curves first, pi-Soft after), and stops when cancelled.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace

from ..eval.metrics import REMOVAL_METRIC_KEYS, REMOVAL_METRICS
from ..methods.base import ProgressFn
from ..models.loading import ModelBundle
from ..result.attribution import Attribution
from ..runtime.session import CancelToken, WorkerStream, hold, run_in_worker
from .common import RANDOM, evaluated_positions, ranking_scores, removal_orderings
from .removal import RemovalConfig, RemovalReport, removal_curves, removal_runs
from .soft import PAPER_SOFT, QUICK_SOFT, SoftConfig, SoftReport, fixed_routing, soft_cost, soft_curves, soft_steps


@dataclass
class FaithfulnessReport:
    """Removal and pi-Soft results of one answer; `seconds` holds the time of each part that ran."""

    removal: RemovalReport | None = None
    soft: SoftReport | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    status: str = ""


def _part(progress: ProgressFn | None, lo: float, hi: float) -> Callable[[float, str], None] | None:
    if progress is None:
        return None
    return lambda f, msg: progress(lo + (hi - lo) * f, msg)


def _faithfulness_parts(
    bundle: ModelBundle,
    attr: Attribution,
    methods: Sequence[str] | None,
    positions: Sequence[int] | None,
    removal: RemovalConfig | None,
    soft: SoftConfig | None,
    progress: ProgressFn | None,
    include_removal: bool,
    steps: Sequence[int] | None,
    image_inputs: dict | None = None,
) -> Iterator[FaithfulnessReport]:
    split = 0.5 if include_removal and soft is not None else (1.0 if include_removal else 0.0)
    report = FaithfulnessReport()
    if include_removal:
        report.status = "measuring removal curves"
        t0 = time.perf_counter()
        report.removal = removal_curves(
            bundle, attr, methods, positions, removal, progress=_part(progress, 0, split), image_inputs=image_inputs
        )
        report.seconds["removal"] = time.perf_counter() - t0
        report.status = "removal curves done" + ("; measuring pi-Soft" if soft is not None else "")
        yield replace(report, seconds=dict(report.seconds))
    if soft is not None:
        t0 = time.perf_counter()
        report.soft = soft_curves(bundle, attr, methods, positions, soft, _part(progress, split, 1.0), steps)
        report.seconds["soft"] = time.perf_counter() - t0
        report.status = "done"
        yield replace(report, seconds=dict(report.seconds))


def measure_faithfulness(
    bundle: ModelBundle,
    attr: Attribution,
    methods: Sequence[str] | None = None,
    positions: Sequence[int] | None = None,
    removal: RemovalConfig | None = None,
    soft: SoftConfig | None = QUICK_SOFT,
    progress: ProgressFn | None = None,
    include_removal: bool = True,
    steps: Sequence[int] | None = None,
    cancel: CancelToken | None = None,
) -> FaithfulnessReport:
    """Removal curves and pi-Soft curves of one result, with one progress callback over both.

    `soft=None` skips pi-Soft; `include_removal=False` skips the removal curves; `steps` (0-based) picks the steps
    pi-Soft evaluates (None: every `soft.step_stride`-th). Holds the model for the whole call; `cancel` stops it
    between forward passes (`Cancelled` is raised).
    """
    with hold(bundle.model, cancel):
        parts = list(
            _faithfulness_parts(bundle, attr, methods, positions, removal, soft, progress, include_removal, steps)
        )
    return parts[-1] if parts else FaithfulnessReport()


def stream_faithfulness(
    bundle: ModelBundle,
    attr: Attribution,
    methods: Sequence[str] | None = None,
    positions: Sequence[int] | None = None,
    removal: RemovalConfig | None = None,
    soft: SoftConfig | None = QUICK_SOFT,
    progress: ProgressFn | None = None,
    include_removal: bool = True,
    steps: Sequence[int] | None = None,
    cancel: CancelToken | None = None,
    image_inputs: dict | None = None,
) -> WorkerStream[FaithfulnessReport]:
    """Like `measure_faithfulness`, in a worker thread: yields the report after the removal curves and again after
    pi-Soft. Closing or cancelling the stream stops the work within one forward pass. An image result needs
    `image_inputs` (see `removal_curves`) and `soft=None`."""
    return run_in_worker(
        lambda: _faithfulness_parts(
            bundle, attr, methods, positions, removal, soft, progress, include_removal, steps, image_inputs
        ),
        bundle.model,
        cancel,
    )


__all__ = [
    "FaithfulnessReport",
    "PAPER_SOFT",
    "QUICK_SOFT",
    "RANDOM",
    "REMOVAL_METRICS",
    "REMOVAL_METRIC_KEYS",
    "RemovalConfig",
    "RemovalReport",
    "SoftConfig",
    "SoftReport",
    "evaluated_positions",
    "fixed_routing",
    "measure_faithfulness",
    "ranking_scores",
    "removal_curves",
    "removal_orderings",
    "removal_runs",
    "soft_cost",
    "soft_curves",
    "soft_steps",
    "stream_faithfulness",
]
