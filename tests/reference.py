"""Independent, deliberately plain reference implementations (python loops over eager attention matrices)."""

from __future__ import annotations

import math
import statistics


def reference_macs(attentions, n: int, k_steps: int, alpha=0.8, pooling="max", redistribute=True):
    """MACS (paper Eqs. 4-8) from eager attentions: tuple over layers of (1, H, T, T) tensors.

    Returns (raw, z): lists of K lists of N floats; raw is the plain product c_L.
    """
    pool = {"max": max, "min": min, "mean": statistics.fmean}[pooling]
    raws, zs = [], []
    for k in range(k_steps):
        q = n - 1 + k  # query that predicts generated token k
        c = [1.0] * n
        for att in attentions:
            a = att[0].double()  # (H, T, T)
            for i in range(n):
                per_head = []
                for h in range(a.shape[0]):
                    value = float(a[h, q, i])
                    if redistribute:
                        value += sum(float(a[h, q, n + p]) for p in range(k)) / n
                    per_head.append(value)
                c[i] *= alpha * pool(per_head) + (1 - alpha)
        mu = statistics.fmean(c)
        sd = statistics.pstdev(c)
        raws.append(c)
        zs.append([(ci - mu) / sd if sd > 0 else 0.0 for ci in c])
    return raws, zs


def log_zscore(log_values):
    """z-scores of exp(log_values) computed with arbitrary precision (for products that underflow float64)."""
    import mpmath

    mpmath.mp.dps = 50
    vals = [mpmath.exp(v) for v in log_values]
    mu = sum(vals) / len(vals)
    sd = mpmath.sqrt(sum((v - mu) ** 2 for v in vals) / len(vals))
    return [float((v - mu) / sd) for v in vals]


def isclose_all(a, b, tol):
    return all(math.isclose(x, y, abs_tol=tol) for x, y in zip(a, b, strict=True))


def reference_rollout(attentions, n: int, k_steps: int, residual=0.5, head_fusion="mean"):
    """Dense Attention Rollout from eager full attention matrices (tuple over layers of (1, H, T, T)).

    R = Â_L · … · Â_1 with Â_l = normalise((1 - r)·fuse(A_l) + r·I); returns K rows of R restricted to N columns.
    """
    import torch

    t = attentions[0].shape[-1]
    rollout = torch.eye(t, dtype=torch.float64)
    for att in attentions:
        a = att[0].double()  # (H, T, T)
        fused = a.mean(0) if head_fusion == "mean" else a.amax(0)
        hat = (1 - residual) * fused + residual * torch.eye(t, dtype=torch.float64)
        hat = hat / hat.sum(-1, keepdim=True)
        rollout = hat @ rollout
    return [rollout[n - 1 + k, :n].tolist() for k in range(k_steps)]
