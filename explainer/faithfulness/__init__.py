"""Faithfulness of one explanation: token removal curves (MIF / LIF / SRG) and pi-Soft-NC / pi-Soft-NS.

- `removal`: MACS paper, Appendix A.2 (attention-masking removal, regeneration, SRG);
- `soft`: Grad-ELLM paper, section 3.1 (Bernoulli-masked input embeddings, Hellinger distances);
- `common`: evaluated positions, rankings and batching that both use;
- `request`: `FaithfulnessRequest`, what one measurement asks for, checked once when built;
- `lds`: each method's LDS on this answer, from the ablations Sources' surrogate already ran (no pass).

`measure_faithfulness(bundle, attr, request)` runs both (the LDS first: it costs nothing) and returns one report;
`stream_faithfulness` runs them in a worker that holds the model and yields the report as it grows (removal curves
first, pi-Soft after), and stops when cancelled.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

from ..methods.base import ProgressFn
from ..models.loading import ModelBundle
from ..result.attribution import Attribution
from ..runtime.session import CancelToken, WorkerStream, hold, run_in_worker
from .common import RANDOM, evaluated_positions, ranking_scores, removal_orderings
from .lds import LdsReport, answer_lds
from .metrics import REMOVAL_METRIC_KEYS, REMOVAL_METRICS
from .removal import RemovalConfig, RemovalReport, removal_curves, removal_runs
from .request import FaithfulnessRequest
from .soft import PAPER_SOFT, QUICK_SOFT, SoftConfig, SoftReport, fixed_routing, soft_cost, soft_curves, soft_steps

MEASURING_SOFT = "measuring pi-Soft"  # ends a report's status while its pi-Soft part is still to come


@dataclass
class FaithfulnessReport:
    """Removal and pi-Soft results of one answer; `seconds` holds the time of each part that ran."""

    removal: RemovalReport | None = None
    soft: SoftReport | None = None
    lds: LdsReport | None = None  # None: the result holds no Sources surrogate whose ablations it could reuse
    seconds: dict[str, float] = field(default_factory=dict)
    status: str = ""


def _part(progress: ProgressFn | None, lo: float, hi: float) -> Callable[[float, str], None] | None:
    if progress is None:
        return None
    return lambda f, msg: progress(lo + (hi - lo) * f, msg)


def _faithfulness_parts(
    bundle: ModelBundle, attr: Attribution, request: FaithfulnessRequest, progress: ProgressFn | None
) -> Iterator[FaithfulnessReport]:
    methods, positions, soft, steps = request.methods, request.positions, request.soft, request.steps
    split = 0.5 if request.include_removal and soft is not None else (1.0 if request.include_removal else 0.0)
    report = FaithfulnessReport(lds=answer_lds(attr, list(attr.methods) if methods is None else methods))
    if request.include_removal:
        report.status = "measuring removal curves"
        t0 = time.perf_counter()
        report.removal = removal_curves(
            bundle, attr, methods, positions, request.removal, progress=_part(progress, 0, split),
            image_inputs=request.image_inputs,
        )  # fmt: skip
        report.seconds["removal"] = time.perf_counter() - t0
        report.status = "removal curves done" + (f"; {MEASURING_SOFT}" if soft is not None else "")
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
    request: FaithfulnessRequest | None = None,
    progress: ProgressFn | None = None,
    cancel: CancelToken | None = None,
) -> FaithfulnessReport:
    """Removal curves and pi-Soft curves of one result, with one progress callback over both.

    Args:
        bundle: the model that produced `attr`.
        attr: a finished result.
        request: what to measure (`FaithfulnessRequest`; None: its defaults, removal curves and quick pi-Soft over
            every method of the result).
        progress: progress(fraction, message) over both parts.
        cancel: stops the work between forward passes (`Cancelled` is raised).

    Holds the model for the whole call.
    """
    request = request or FaithfulnessRequest()
    with hold(bundle.model, cancel):
        parts = list(_faithfulness_parts(bundle, attr, request, progress))
    return parts[-1] if parts else FaithfulnessReport()


def stream_faithfulness(
    bundle: ModelBundle,
    attr: Attribution,
    request: FaithfulnessRequest | None = None,
    progress: ProgressFn | None = None,
    cancel: CancelToken | None = None,
) -> WorkerStream[FaithfulnessReport]:
    """Like `measure_faithfulness`, in a worker thread that gets the request whole: yields the report after the
    removal curves and again after pi-Soft. Closing or cancelling the stream stops the work within one forward pass.
    """
    request = request or FaithfulnessRequest()
    return run_in_worker(lambda: _faithfulness_parts(bundle, attr, request, progress), bundle.model, cancel)


__all__ = [
    "FaithfulnessReport",
    "FaithfulnessRequest",
    "LdsReport",
    "MEASURING_SOFT",
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
    "answer_lds",
    "ranking_scores",
    "removal_curves",
    "removal_orderings",
    "removal_runs",
    "soft_cost",
    "soft_curves",
    "soft_steps",
    "stream_faithfulness",
]
