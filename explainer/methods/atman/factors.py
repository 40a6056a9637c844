"""AtMan's suppression factors (AtMan paper, section 3.3, correlated suppression): which prompt tokens are suppressed,
and how strongly, when token i is. `atman.py` runs the passes; `atman_cost.py` counts distinct rows from these."""

from __future__ import annotations

import torch


def suppression_factors(
    embeddings: torch.Tensor,
    factor: float = 0.1,
    correlated: bool = True,
    threshold: float = 0.6,
) -> torch.Tensor:
    """Attention factors applied when each prompt token is suppressed (section 3.3).

    Args:
        embeddings: (N, d) the prompt's input embeddings, as the first layer sees them: token embeddings for text,
            the vision tower's merged patch features at image-token positions (the AtMan paper computes the cosine
            neighbourhood "right after the embedding layer", which for image tokens is what makes neighbouring,
            redundant patches correlated).
        factor: the factor of the suppressed token itself.
        correlated: also suppress tokens whose input-embedding cosine similarity to it is >= `threshold`, by
            (1 - factor) * (1 - cos) + factor.
        threshold: kappa.

    Returns:
        (N, N) float32: row i holds the factor on the attention to every prompt token j when token i is suppressed;
        1 means untouched. The diagonal is `factor`; with `correlated`, so is every other token with the same
        embedding (cosine 1, e.g. another occurrence of a text token), which makes their rows identical.
    """
    n = embeddings.shape[0]
    if not correlated:
        return torch.ones(n, n, dtype=torch.float32, device=embeddings.device).fill_diagonal_(factor)  # (N, N)
    per_id, inverse = distinct_suppression_factors(embeddings, factor, threshold)
    return per_id[inverse][:, inverse]  # (N, N)


def distinct_suppression_factors(
    embeddings: torch.Tensor, factor: float, threshold: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Correlated suppression factors per distinct embedding, so that equal embeddings give bit-identical rows (the
    fast path computes such rows once, and the time estimate counts them without a model run).

    Returns:
        ((U, U) factors: row u on the attention to every distinct embedding v when u is suppressed, 1 for untouched;
        (N,) index of each prompt token's distinct embedding).
    """
    distinct, inverse = torch.unique(embeddings.float(), dim=0, return_inverse=True)  # (U, d), (N,)
    unit = torch.nn.functional.normalize(distinct, dim=-1)  # (U, d); zero rows stay zero
    cos = (unit @ unit.T).clamp(max=1.0)  # (U, U)
    per_id = torch.where(cos >= threshold, (1.0 - factor) * (1.0 - cos) + factor, torch.ones_like(cos))
    per_id.fill_diagonal_(factor)
    return per_id, inverse
