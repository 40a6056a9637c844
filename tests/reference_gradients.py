"""Independent, deliberately plain references for the gradient methods (float64 where it matters)."""

from __future__ import annotations

import torch


def logit_along(model, ids: torch.Tensor, p: int, target: int, position: int, t: float) -> float:
    """l = logit of `target` at position p when the input embedding at `position` is scaled by (1 + t)."""
    embeds = model.get_input_embeddings()(ids[:, : p + 1]).clone()  # (1, p + 1, d)
    embeds[0, position] *= 1.0 + t
    return float(model(inputs_embeds=embeds).logits[0, -1, target])


@torch.no_grad()
def reference_input_x_gradient(model, ids: torch.Tensor, n: int, h: float = 1e-2) -> list[list[float]]:
    """Input x Gradient by finite differences: e_i . dl_k/de_i is the derivative of l_k along t when e_i is scaled by
    (1 + t), at t = 0 (five-point stencil, error O(h^4): RMSNorm computes in float32 even in a float64 model, so h
    cannot be tiny). Returns K lists of N floats."""
    rows = []
    for k in range(ids.shape[1] - n):
        p, target = n - 1 + k, int(ids[0, n + k])
        row = []
        for i in range(n):
            f = {s: logit_along(model, ids, p, target, i, s * h) for s in (-2, -1, 1, 2)}
            row.append((8 * (f[1] - f[-1]) - (f[2] - f[-2])) / (12 * h))
        rows.append(row)
    return rows
