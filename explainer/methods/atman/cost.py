"""AtMan's cost model for the time estimates (`AtMan.cost`, `explainer/estimate.py`): the passes `atman_scores`
makes, counted without a model run from the prompt's token ids or, exactly, its input embeddings."""

from __future__ import annotations

import torch

from ...runtime.kv import batches_by_first
from ..cost import Cost, CostRequest
from .config import CPU_BATCH_ROWS, AtManConfig
from .factors import distinct_suppression_factors


def first_suppressed(request: CostRequest, config: AtManConfig) -> list[int]:
    """First suppressed position of every distinct suppression row: the earliest occurrence of its token or, with
    correlated suppression, of any token whose embedding is at least `cosine_threshold` similar. Exact with
    `request.embeddings`; from token ids alone similar tokens are not seen, so positions may come out later."""
    n = request.n
    if config.suppression_factor == 1.0:  # every factor is 1: rows that suppress nothing are not run
        return []
    if not config.correlated:
        return list(range(n))  # one row per position, each suppressing only itself
    if request.embeddings is None:
        first: dict[int, int] = {}
        for i, token in enumerate(request.prompt_ids):
            first.setdefault(token, i)
        return sorted(first.values())
    factor, inverse = distinct_suppression_factors(
        request.embeddings, config.suppression_factor, config.cosine_threshold
    )  # (U, U): row u suppresses column v where the factor is not 1
    device = factor.device
    own = torch.full((factor.shape[0],), n, dtype=torch.long, device=device).scatter_reduce(
        0, inverse, torch.arange(n, device=device), reduce="amin"
    )  # (U,) first occurrence of each distinct embedding
    return torch.where(factor != 1.0, own[None, :], n).amin(dim=1).tolist()


def atman_cost(request: CostRequest, config: AtManConfig) -> Cost:
    """The passes AtMan makes: fast path, one unperturbed forward over T - 1 positions, then one forward per group
    of distinct suppression rows (grouped as `_fast_scores` groups them, plus one unperturbed row each), each row
    recomputing the suffix from its first suppressed position to T - 1; naive path, N + 1 forwards over T positions."""
    n, t, k = request.n, request.t, request.num_new_tokens
    if k <= 0:
        return Cost()
    if not config.fast:
        return Cost(forward_passes=n + 1, forward_tokens=(n + 1) * t)
    first = first_suppressed(request, config)
    if not first:
        return Cost()
    most = min([r for r in (config.batch_size, request.batch_rows) if r] or [CPU_BATCH_ROWS])
    groups = batches_by_first(first, t - 1, most, request.batch_tokens)  # as AtMan batches its passes
    # a group's first row has its smallest position; each pass also runs one unperturbed row (the baseline)
    tokens = sum((len(g) + 1) * (t - 1 - first[g[0]]) for g in groups)
    return Cost(forward_passes=1 + len(groups), forward_tokens=t - 1 + tokens)  # + the unperturbed pass
