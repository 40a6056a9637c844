"""pi-Soft-NC / pi-Soft-NS (Grad-ELLM paper, section 3.1, Eqs. 1-5).

At an evaluated generation step k the model is run teacher-forced on prompt + generated prefix; the step's scores
over the evaluated positions are min-max scaled, calibrated to mean pi (`metrics.calibrate`), and the input
embeddings of those positions are multiplied by Bernoulli masks, e ~ Bernoulli(s~) for Soft-NS and
e ~ Bernoulli(1 - s~) for Soft-NC. The Hellinger distance of the next-token distribution to the unperturbed one is
normalised by that of the all-zero baseline: Soft-NS = max(0, dP0 - dP)/dP0, Soft-NC = dP/dP0, averaged over
Monte-Carlo samples, then over evaluated steps.

Routing: "dynamic" (section 4.3: attention recomputed on the perturbed input) or "fixed" (Appendix K: the attention
weights of the unperturbed pass, so only the values change).

The unperturbed distribution is computed as one extra row of every forward (the all-zero baseline's and each batch of
masked inputs'), so it comes from exactly the layout (shared prefix, batch, length) of the rows it is compared with:
a mask of ones gives a distance of exactly 0, and on a GPU, where a pass's rounding depends on its shape, bfloat16
leaves no layout noise floor.

Cost: per evaluated step, 2 * len(pis) * samples perturbed inputs per method, plus the all-zero baseline and one
unperturbed row per forward, over the positions from the first evaluated one to the step (the positions before it
are computed once). `soft_cost` tells it before running.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from transformers import DynamicCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from ..capture import additive_mask, attention_function_selected, attention_probs
from ..errors import InputError
from ..methods.base import ProgressFn
from ..models.loading import ModelBundle
from ..result.attribution import Attribution
from ..runtime.devices import input_device
from ..runtime.host import to_numpy
from ..runtime.kv import TOKENS_PER_BATCH, batch_budget, prefix_cache, rows_per_batch
from ..runtime.memory import ModelShape, check_fits
from ..runtime.session import between_passes, hold
from .common import check_result, evaluated_positions
from .metrics import PI_GRID, calibrate, hellinger, minmax

CPU_ROWS = 16  # perturbed inputs per forward on a CPU


@dataclass(frozen=True)
class SoftConfig:
    samples: int = 15  # Monte-Carlo masks per pi (Grad-ELLM paper, section 4.3)
    pis: tuple[float, ...] = PI_GRID  # target retaining probabilities 0.05 ... 0.95
    step_stride: int = 5  # evaluate steps 0, 5, 10, ... (section 4.3: every five generated tokens)
    routing: str = "dynamic"  # "dynamic" (section 4.3) or "fixed" (Appendix K: attention of the unperturbed pass)
    seed: int = 0
    batch_size: int = 0  # most perturbed inputs per forward (fewer when long); 0: from the device (CPU: 16)

    def __post_init__(self) -> None:
        if self.routing not in ("dynamic", "fixed"):
            raise InputError(f"routing must be 'dynamic' or 'fixed', got {self.routing!r}")
        if self.samples < 1 or self.step_stride < 1 or not self.pis:
            raise InputError("samples and step_stride must be at least 1 and pis non-empty")


PAPER_SOFT = SoftConfig()
# The app's and the CLI's default: a coarser estimate that fits a live demo (docs/benchmarks.md, "Faithfulness").
QUICK_SOFT = SoftConfig(samples=4, pis=(0.1, 0.3, 0.5, 0.7, 0.9))


@dataclass
class SoftReport:
    """pi-Soft curves of every method, averaged over the evaluated steps.

    Attributes:
        pis: target retaining probabilities.
        steps: the evaluated generation steps (0-based).
        ns, nc: method -> [value per pi].
        auc_ns, auc_nc: method -> trapezoid area over pi (not rescaled: at most max(pi) - min(pi)).
        config: the settings used (samples, routing, ...).
    """

    pis: list[float]
    steps: list[int]
    ns: dict[str, list[float]] = field(default_factory=dict)
    nc: dict[str, list[float]] = field(default_factory=dict)
    auc_ns: dict[str, float] = field(default_factory=dict)
    auc_nc: dict[str, float] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)


def soft_steps(attr: Attribution, config: SoftConfig, steps: Sequence[int] | None = None) -> list[int]:
    """The evaluated steps: the given ones (0-based), else every `step_stride`-th."""
    if steps is None:
        return list(range(0, attr.num_steps, config.step_stride))
    out = sorted({int(s) for s in steps})
    if not out or out[0] < 0 or out[-1] >= attr.num_steps:
        raise InputError(f"Steps must lie between 1 and {attr.num_steps} (the answer's tokens).")
    return out


def soft_cost(
    attr: Attribution,
    methods: Sequence[str],
    config: SoftConfig | None = None,
    steps: Sequence[int] | None = None,
    positions: Sequence[int] | None = None,
) -> dict[str, int]:
    """What `soft_curves` will compute: {"forwards": sequences run, "tokens": positions they recompute, "steps"}, at
    most (masks that keep every position are not run)."""
    cfg = config or QUICK_SOFT
    pos = evaluated_positions(attr, positions)
    masks = 2 * len(cfg.pis) * cfg.samples * len(methods)
    chosen = soft_steps(attr, cfg, steps)
    forwards = tokens = 0
    for k in chosen:
        length = attr.num_prompt_tokens + k - int(pos.min())
        size = rows_per_batch(length, TOKENS_PER_BATCH, cfg.batch_size or CPU_ROWS)
        sequences = 2 + masks + -(-masks // size)  # unperturbed and all-zero, the masks, one unperturbed per batch
        forwards, tokens = forwards + sequences, tokens + sequences * length
    return {"forwards": forwards, "tokens": tokens, "steps": len(chosen)}


@contextlib.contextmanager
def fixed_routing(model: torch.nn.Module, probs: dict[int, torch.Tensor]) -> Iterator[None]:
    """Attention weights replaced by `probs` (layer -> (1, H, T, T), from an unperturbed pass) while the block runs.

    Grad-ELLM paper, Appendix K: only values (token content) change under perturbation, not the routing. The
    function is registered under a unique name and selected on the language config; both are undone on exit.
    """

    def fixed_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        b, h, tq, d = query.shape
        kvh = key.shape[1]
        tk = key.shape[2]
        p = probs[module.layer_idx][:, :, tk - tq : tk, :tk].to(value.device)  # (1, H, Tq, Tk) float32: newest
        p = p.expand(b, h, tq, tk).reshape(b, kvh, (h // kvh) * tq, tk)  # (B, KVH, G*Tq, Tk)
        out = torch.matmul(p, value.float()).reshape(b, h, tq, d)  # (B, H, Tq, D), in float32 like the weights
        return out.transpose(1, 2).to(value.dtype).contiguous(), None

    with attention_function_selected(model, "explainer_fixed_routing_", fixed_forward):
        yield


@contextlib.contextmanager
def _recording(model: torch.nn.Module, store: dict[int, torch.Tensor]) -> Iterator[None]:
    """Record every layer's full attention probabilities (1, H, T, T) of one unperturbed pass."""

    def record_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        tq, tk = query.shape[2], key.shape[2]
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        # the model's own mask (causal, sliding window) when it builds one, else causality
        mask = additive_mask(attention_mask, torch.float32)
        store[module.layer_idx] = attention_probs(query, key, mask, scale, tk - tq)
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)  # fmt: skip

    with attention_function_selected(model, "explainer_record_routing_", record_forward):
        yield


def _next_token_probs(model, embeds: torch.Tensor, prefix: DynamicCache | None = None) -> torch.Tensor:
    """(B, T, D) input embeddings -> (B, V) next-token probabilities (float64, on CPU).

    With `prefix` (the cache of the first P positions, batch 1, left unchanged) only positions P.. are computed.
    """
    b, t, _ = embeds.shape
    start = prefix.get_seq_length() if prefix is not None else 0
    cache = prefix_cache(prefix, start, b) if prefix is not None and start > 0 else None
    pos = torch.arange(start, t, device=embeds.device).expand(b, t - start)
    out = model(inputs_embeds=embeds[:, start:], position_ids=pos, past_key_values=cache, logits_to_keep=1)
    return torch.softmax(out.logits[:, -1].double(), dim=-1).cpu()  # (B, V)


@torch.inference_mode()
def soft_curves(
    bundle: ModelBundle,
    attr: Attribution,
    methods: Sequence[str] | None = None,
    positions: Sequence[int] | None = None,
    config: SoftConfig | None = None,
    progress: ProgressFn | None = None,
    steps: Sequence[int] | None = None,
) -> SoftReport:
    """pi-Soft-NS and pi-Soft-NC curves of the given methods of one result (Grad-ELLM paper, section 3.1).

    Args:
        steps: the generation steps to evaluate (0-based); None: every `config.step_stride`-th step.

    Returns:
        A `SoftReport`; higher is better for both curves.

    Raises:
        InputError: no generated tokens, unknown method, bad positions or steps. Cancelled: the request was cancelled.
    """
    cfg = config or SoftConfig()
    methods = list(methods if methods is not None else attr.methods)
    check_result(attr, [])
    methods = [m for m in methods if m in attr.methods]  # the random orderings of `removal_curves` have no scores
    if not methods:
        raise InputError(f"pi-Soft needs a method with scores; available: {', '.join(attr.methods) or 'none'}.")
    pos = evaluated_positions(attr, positions)
    chosen = soft_steps(attr, cfg, steps)
    check_soft_memory(bundle.model, attr, cfg, chosen)
    with hold(bundle.model):
        ns, nc = _soft_values(bundle, attr, methods, pos, cfg, chosen, progress)
    pis = [float(p) for p in cfg.pis]
    if progress:
        progress(1.0, "pi-Soft done")
    report = SoftReport(pis=pis, steps=chosen, config=dict(vars(cfg)))
    with np.errstate(all="ignore"):
        for m in methods:
            for target, auc, curve in ((report.ns, report.auc_ns, ns[m]), (report.nc, report.auc_nc, nc[m])):
                mean = np.nanmean(curve, axis=0) if np.isfinite(curve).any() else np.full(len(pis), np.nan)
                target[m] = [float(x) for x in mean]
                auc[m] = float(np.trapezoid(mean, pis)) if len(pis) > 1 else float(mean[0])
    return report


def check_soft_memory(model: torch.nn.Module, attr: Attribution, cfg: SoftConfig, steps: Sequence[int]) -> None:
    """Refuse before any work a pi-Soft run that will not fit: fixed routing keeps the unperturbed attention weights,
    L x H x T^2 float32, of the longest evaluated step; both routings run batches with a prefix cache.

    Raises:
        MemoryLimitError: names the limit and the alternative.
    """
    if not steps:
        return
    t = attr.num_prompt_tokens + max(steps) + 1
    shape = ModelShape.of(model)
    parts = {"forward passes": shape.kv_bytes(t) * 2 + shape.activation_bytes(min(t, TOKENS_PER_BATCH))}
    if cfg.routing == "fixed":
        parts["fixed routing's attention weights"] = 4 * shape.layers * shape.heads * t * t
    check_fits(
        parts,
        input_device(model),
        f"pi-Soft with {cfg.routing} routing at {t} tokens",
        "use dynamic routing (it keeps no attention weights), fewer answer tokens, or a shorter prompt.",
    )


def _soft_values(bundle, attr, methods, pos, cfg, steps, progress) -> tuple[dict, dict]:
    """(steps, pis) arrays of Soft-NS and Soft-NC per method (NaN where a step carries no signal)."""
    model = bundle.model
    dev = bundle.device
    embed = model.get_input_embeddings()
    all_ids = attr.prompt_token_ids + attr.generated_token_ids
    n = attr.num_prompt_tokens
    pis = [float(p) for p in cfg.pis]
    ns = {m: np.full((len(steps), len(pis)), np.nan) for m in methods}
    nc = {m: np.full((len(steps), len(pis)), np.nan) for m in methods}
    pos_t = torch.as_tensor(pos, device=dev)
    for si, k in enumerate(steps):
        between_passes()
        if progress:
            progress(si / len(steps), f"pi-Soft: step {k + 1} of {attr.num_steps}")
        ids = torch.tensor([all_ids[: n + k]], dtype=torch.long, device=dev)  # (1, T), T = N + k
        emb = embed(ids)  # (1, T, D)
        probs: dict[int, torch.Tensor] = {}
        if cfg.routing == "fixed":
            with _recording(model, probs):
                _next_token_probs(model, emb)  # the unperturbed pass's attention weights, layer -> (1, H, T, T)
        # positions before the first evaluated one never change: their cache is computed once per step
        prefix = DynamicCache()
        if pos.min() > 0:
            head = torch.arange(int(pos.min()), device=dev)[None]  # (1, P)
            model(inputs_embeds=emb[:, head[0]], position_ids=head, past_key_values=prefix, use_cache=True,
                  logits_to_keep=1)  # fmt: skip
        routing = functools.partial(fixed_routing, model, probs) if cfg.routing == "fixed" else contextlib.nullcontext
        zero = np.zeros((1, pos.size), dtype=bool)  # the all-zero baseline: every evaluated position dropped
        with routing():
            d0 = float(_distances(model, emb, pos_t, zero, prefix, 1)[0])
        if not d0 > 0:
            continue  # the zero baseline does not move the prediction: the step carries no signal
        masks, index = _masks(attr, methods, k, pos, cfg)  # (M, n)

        def report(done: int, total: int, si=si, k=k) -> None:
            if progress:
                progress((si + done / total) / len(steps), f"pi-Soft: step {k + 1}, {done}/{total}")

        size = rows_per_batch(emb.shape[1] - int(pos.min()), *batch_budget(model, n + k, 1, cfg.batch_size, CPU_ROWS))
        with routing():
            dist = _distances(model, emb, pos_t, masks, prefix, size, report)  # (M,)
        for j, (m, kind, pi_i) in enumerate(index):
            d = dist[j * cfg.samples : (j + 1) * cfg.samples]
            if kind == "ns":
                ns[m][si, pi_i] = float(np.mean(np.maximum(0.0, d0 - d) / d0))
            else:
                nc[m][si, pi_i] = float(np.mean(d / d0))
    return ns, nc


def _masks(attr: Attribution, methods: list[str], k: int, pos: np.ndarray, cfg: SoftConfig) -> tuple[np.ndarray, list]:
    """Bernoulli keep-masks (M, n) for every method, pi, kind (NS keeps by s~, NC by 1 - s~) and sample, and
    (method, kind, pi index) per block of `cfg.samples` rows."""
    masks, index = [], []
    for m in methods:
        s = minmax(attr.methods[m].raw[k, pos])
        rng = np.random.default_rng([cfg.seed, k, methods.index(m)])
        for pi_i, pi in enumerate(cfg.pis):
            st = calibrate(s, float(pi))
            for kind, p_keep in (("ns", st), ("nc", 1.0 - st)):
                masks.append(rng.random((cfg.samples, pos.size)) < p_keep)
                index.append((m, kind, pi_i))
    return np.concatenate(masks), index


def _distances(
    model: torch.nn.Module,
    emb: torch.Tensor,
    pos_t: torch.Tensor,
    keep: np.ndarray,
    prefix: DynamicCache,
    size: int,
    report: Callable[[int, int], None] | None = None,
) -> np.ndarray:
    """Hellinger distances of the next-token distribution under each keep-mask to the unperturbed one.

    Every forward holds one unperturbed row beside its `size` (at most) masked rows, so each distance compares two
    rows of one pass; a mask that keeps every position is the unperturbed input itself, distance exactly 0, not run.

    Args:
        emb: (1, T, D) input embeddings. pos_t: (n,) the evaluated positions. keep: (M, n) bool masks.
        prefix: cache of the positions before the first evaluated one (batch 1, left unchanged).

    Returns:
        (M,) float64 distances.
    """
    dist = np.zeros(keep.shape[0])
    todo = np.flatnonzero(~keep.all(axis=1))  # masks that drop something
    e = torch.as_tensor(keep[todo], dtype=emb.dtype, device=emb.device)  # (M', n)
    for start in range(0, todo.size, size):
        between_passes()
        rows = slice(start, min(todo.size, start + size))
        batch = emb.expand(rows.stop - rows.start + 1, -1, -1).clone()  # (B + 1, T, D): row 0 stays unperturbed
        batch[1:, pos_t] *= e[rows, :, None]
        p = to_numpy(_next_token_probs(model, batch, prefix))  # (B + 1, V)
        dist[todo[rows]] = hellinger(p[:1], p[1:])
        if report is not None:
            report(rows.stop, todo.size)
    return dist
