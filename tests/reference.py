"""Independent, deliberately plain reference implementations (python loops over eager attention matrices)."""

from __future__ import annotations

import contextlib
import math
import statistics

import torch


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


@contextlib.contextmanager
def suppressed_eager_attention(config, from_query: int = 0):
    """Select, on `config`, eager attention whose scores to chosen keys are edited in a plain loop (AtMan's
    reference): yields a dict {key position: factor} to fill before each forward; the pre-softmax score of every
    query from position `from_query` on for that key gets ln(factor) added in every head (a full forward, no cache).
    On exit the config and registries are restored."""
    import torch
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    factors: dict[int, float] = {}

    def attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        heads = query.shape[1]
        key = key.repeat_interleave(heads // key.shape[1], dim=1)  # (1, H, T, D)
        value = value.repeat_interleave(heads // value.shape[1], dim=1)  # (1, H, T, D)
        scores = torch.matmul(query, key.transpose(-1, -2)) * scaling + attention_mask  # (1, H, T, T), eager mask
        for j, factor in factors.items():
            for h in range(heads):
                for q in range(from_query, scores.shape[2]):
                    scores[0, h, q, j] += math.log(factor) if factor > 0 else -1e4  # factor 0: masked (Sources)
        probs = torch.softmax(scores, dim=-1)
        return torch.matmul(probs, value).transpose(1, 2).contiguous(), probs

    name = "test_suppressed_eager_reference"
    ALL_ATTENTION_FUNCTIONS.register(name, attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(name, eager_mask)
    previous = config._attn_implementation_internal
    try:
        config._attn_implementation_internal = name
        yield factors
    finally:
        config._attn_implementation_internal = previous
        ALL_ATTENTION_FUNCTIONS._global_mapping.pop(name, None)
        ALL_MASK_ATTENTION_FUNCTIONS._global_mapping.pop(name, None)


def reference_suppression_rows(vectors, correlated: bool = True, threshold: float = 0.6, f: float = 0.1):
    """AtMan section 3.3 in a plain loop: row i is {position: factor} of every prompt token suppressed with token i,
    from the prompt's input embeddings `vectors` (a sequence of 1-D tensors)."""
    vectors = [v.double() for v in vectors]
    rows = []
    for i in range(len(vectors)):
        row = {i: f}
        for j in range(len(vectors)):
            if j == i or not correlated:
                continue
            cos = float(vectors[i] @ vectors[j]) / (float(vectors[i].norm()) * float(vectors[j].norm()))
            if cos >= threshold:
                row[j] = (1 - f) * (1 - min(cos, 1.0)) + f
        rows.append(row)
    return rows


@torch.no_grad()
def removal_reference(model, prompt, gen, keep, max_new_tokens, eos):
    """One removal run the plain way (MACS paper, Appendix A.2): no cache, no batching, every pass from scratch.

    Args:
        prompt: (N,) ids. gen: (K,) the original answer. keep: (N,) bool, False = removed by attention masking.

    Returns:
        (mean logit of `gen` teacher-forced, its perplexity, greedy regeneration as a list of ids).
    """
    n, k = prompt.shape[0], gen.shape[0]

    def logits_of(ids, mask):  # (T,), (T,) -> (T, V); explicit positions so masked tokens move nothing
        return model(input_ids=ids[None], attention_mask=mask[None], position_ids=torch.arange(ids.shape[0])[None])[
            "logits"
        ][0].float()

    ids = torch.cat([prompt, gen])
    mask = torch.cat([keep.long(), torch.ones(k, dtype=torch.long)])
    logits = logits_of(ids, mask)[n - 1 : n + k - 1]  # (K, V) predicting gen
    target = logits[torch.arange(k), gen]
    ce = torch.logsumexp(logits, dim=-1) - target
    tokens: list[int] = []
    for _ in range(max_new_tokens):
        ids = torch.cat([prompt, torch.tensor(tokens, dtype=torch.long)])
        mask = torch.cat([keep.long(), torch.ones(len(tokens), dtype=torch.long)])
        tokens.append(int(logits_of(ids, mask)[-1].argmax()))
        if tokens[-1] in eos:
            break
    return float(target.mean()), float(torch.exp(ce.mean())), tokens


def reference_knockout_logprobs(
    model, ids: list[int], response: list[int], removed: set[int], start: int
) -> list[float]:
    """(K,) log p of each response token from one forward with a full 4-D mask: causal, and every query from `start`
    on blind to the `removed` positions (the queries before `start` see every earlier token)."""
    seq = torch.tensor([ids + response[:-1]])
    t = seq.shape[1]
    allowed = torch.ones(t, t, dtype=torch.bool).tril()
    for q in range(start, t):
        allowed[q, sorted(removed)] = False
    mask = torch.zeros(1, 1, t, t).masked_fill(~allowed, torch.finfo(torch.float32).min)
    with torch.no_grad():
        logits = model(input_ids=seq, attention_mask=mask).logits[0].float()  # (T, V)
    logp = torch.log_softmax(logits, dim=-1)
    return [float(logp[len(ids) - 1 + k, tok]) for k, tok in enumerate(response)]


def plain_logp(model, prompt: list[int], response: list[int]) -> float:
    """log p(response | prompt) from one forward of the whole sequence, no cache."""
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()  # (K, V)
    return float(torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(response)[:, None]).sum())
