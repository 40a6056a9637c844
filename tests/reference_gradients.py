"""Independent, deliberately plain references for the gradient methods: finite differences, one full forward per
generated token, explicit q/k/v and hand-written LRP rules in loops (float64 where it matters)."""

from __future__ import annotations

import contextlib

import torch

from .conftest import eager


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


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (T, heads, D) rotated by positions' cos/sin (T, D), the rotate-half convention of Llama and Qwen2."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


def _visible(config, layer: int, p: int) -> list[int]:
    """Keys the query at position p attends to in `layer` (causal, and the window of sliding-window layers)."""
    types = getattr(config, "layer_types", None)
    if types is not None and types[layer] == "sliding_attention":
        return [j for j in range(p + 1) if p - j < config.sliding_window]
    return list(range(p + 1))


@contextlib.contextmanager
def _attention_taps(model):
    """Per layer: the attention's input hidden states and rotary cos/sin, and a zero tensor added to the attention
    output (the o_proj input) whose gradient is dl/do."""
    inputs, deltas, handles = {}, {}, []
    for index, layer in enumerate(model.model.layers):

        def attention_input(module, args, kwargs, index=index):
            inputs[index] = (kwargs["hidden_states"].detach(), kwargs["position_embeddings"])

        def output_delta(module, args, index=index):
            deltas[index] = torch.zeros_like(args[0], requires_grad=True)
            return (args[0] + deltas[index],)

        handles.append(layer.self_attn.register_forward_pre_hook(attention_input, with_kwargs=True))
        handles.append(layer.self_attn.o_proj.register_forward_pre_hook(output_delta))
    try:
        yield inputs, deltas
    finally:
        for handle in handles:
            handle.remove()


def reference_grad_ellm(model, ids: torch.Tensor, n: int, layers: int) -> list[list[float]]:
    """Grad-ELLM (paper Eqs. 10-11 with Appendix B's min-max token weights), summed over the last `layers` layers, in
    plain loops: per generated token one eager forward over the sequence up to its predicting position, w from
    autograd at the attention output, q, k, v recomputed from the layer input."""
    cfg = model.config
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    dim = cfg.hidden_size // heads
    group = heads // kv_heads
    num_layers = cfg.num_hidden_layers
    first = max(0, num_layers - layers)
    rows = []
    for k in range(ids.shape[1] - n):
        p, target = n - 1 + k, int(ids[0, n + k])
        with _attention_taps(model) as (inputs, deltas), eager(model), torch.enable_grad():
            logit = model(input_ids=ids[:, : p + 1]).logits[0, -1, target]
            grads = torch.autograd.grad(logit, [deltas[li] for li in range(first, num_layers)])
        row = [0.0] * n
        with torch.no_grad():
            for li, grad in zip(range(first, num_layers), grads):
                attn = model.model.layers[li].self_attn
                hidden, (cos, sin) = inputs[li]
                cos, sin = cos[0].double(), sin[0].double()  # (p + 1, D)
                q = _rope(attn.q_proj(hidden)[0].view(p + 1, heads, dim).double(), cos, sin)
                key = _rope(attn.k_proj(hidden)[0].view(p + 1, kv_heads, dim).double(), cos, sin)
                value = attn.v_proj(hidden)[0].view(p + 1, kv_heads, dim).double()
                w = grad[0, p].view(heads, dim).double()
                visible = _visible(cfg, li, p)
                for i in range(n):
                    total = 0.0
                    for h in range(heads):
                        kv = h // group
                        sims = [float(q[p, h] @ key[j, kv]) for j in visible]
                        low, high = min(sims), max(sims)
                        if i not in visible:
                            lam = 0.0
                        elif high > low:
                            lam = (float(q[p, h] @ key[i, kv]) - low) / (high - low)
                        else:
                            lam = 1.0
                        total += lam * float(w[h] @ value[i, kv])
                    row[i] += max(total, 0.0)
        rows.append(row)
    return rows


def reference_attention_relevance(q, k, v, visible, scaling, relevance_out):
    """AttnLRP's attention rules written out per head in float64 (AttnLRP paper, Propositions 3.1 and 3.3):

    out = A V, uniform rule:  R_A[i, j] = 1/2 sum_d A_ij V_jd R_out[i, d] / out[i, d], R_V likewise;
    A = softmax(S), softmax rule:  R_S[i, j] = S_ij (R_A[i, j] - A_ij sum_j' R_A[i, j']) over visible keys;
    S = scaling * Q K^T, uniform rule:  R_Q[i, d] = 1/2 sum_j scaling Q_id K_jd R_S[i, j] / S_ij, R_K likewise.

    Args:
        q: (H, T, D); k, v: (KVH, T, D); visible: (T, T) bool; relevance_out: (T, H, D).

    Returns:
        R_q (H, T, D), R_k (KVH, T, D), R_v (KVH, T, D).
    """
    heads, t, d = q.shape
    group = heads // k.shape[0]
    r_q, r_k, r_v = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for h in range(heads):
        kv = h // group
        for i in range(t):
            cols = [j for j in range(t) if visible[i, j]]
            s = {j: scaling * float(q[h, i] @ k[kv, j]) for j in cols}
            top = max(s.values())
            z = sum(torch.exp(torch.tensor(s[j] - top, dtype=torch.float64)) for j in cols)
            a = {j: float(torch.exp(torch.tensor(s[j] - top, dtype=torch.float64)) / z) for j in cols}
            out = [sum(a[j] * float(v[kv, j, c]) for j in cols) for c in range(d)]
            r_a = {}
            for j in cols:
                share = [a[j] * float(v[kv, j, c]) * float(relevance_out[i, h, c]) / out[c] for c in range(d)]
                r_a[j] = 0.5 * sum(share)
                for c in range(d):
                    r_v[kv, j, c] += 0.5 * share[c]
            total = sum(r_a.values())
            for j in cols:
                r_s = s[j] * (r_a[j] - a[j] * total)
                for c in range(d):
                    term = scaling * float(q[h, i, c]) * float(k[kv, j, c]) * r_s / s[j]
                    r_q[h, i, c] += 0.5 * term
                    r_k[kv, j, c] += 0.5 * term
    return r_q, r_k, r_v
