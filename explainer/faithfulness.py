"""Faithfulness of one explanation: token removal curves (MIF / LIF / SRG) and pi-Soft-NC / pi-Soft-NS.

Removal ("pixel flipping" for text, MACS paper Appendix A.2): prompt tokens are ranked by the method's score
averaged over steps (the mean of the per-step z-scores over the evaluated positions; a single map repeated over
steps, as AtMan-style methods give, is thereby used as is). For each fraction F of the evaluated tokens, the first
tokens of the ranking are removed by attention masking: a 2D attention mask with zeros at their positions, so no
query attends to them, with explicit `position_ids = arange` so no other token's position moves (transformers
derives positions from the cache length, never from the mask, when they are given; `generate()` would derive them
from the mask's cumulative sum, which is why this module runs its own greedy loop). Per run we measure:

- `logit`: mean logit of the original tokens, teacher-forced on the original generation (higher is better);
- `ppl`: perplexity of the original generation, teacher-forced (it rises when evidence goes: SRG more negative is
  better);
- `rougeL`, `bleu`: ROUGE-L F1 and BLEU of the greedy regeneration against the original answer (higher is better).

Each value is divided by the unperturbed run's value, integrated with the trapezoid rule over F and divided by
max(F); SRG = AUC_LIF - AUC_MIF. The random baseline uses two independent random orderings in place of MIF and LIF.

pi-Soft (Grad-ELLM paper, section 3.1, Eqs. 1-5, dynamic routing): at every `step_stride`-th generated token the
model is run teacher-forced on prompt + generated prefix; the step's scores over the evaluated positions are
min-max scaled, calibrated to mean pi (`metrics.calibrate`), and the input embeddings of those positions are
multiplied by Bernoulli masks, e ~ Bernoulli(s~) for Soft-NS and e ~ Bernoulli(1 - s~) for Soft-NC. The Hellinger
distance of the next-token distribution to the unperturbed one is normalised by that of the all-zero baseline:
Soft-NS = max(0, dP0 - dP)/dP0, Soft-NC = dP/dP0, averaged over Monte-Carlo samples, then over evaluated steps.
"""

from __future__ import annotations

import contextlib
import copy
import functools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from transformers import DynamicCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from .capture import _additive_mask, attention_function_selected
from .errors import InputError
from .methods.base import ProgressFn
from .metrics import PI_GRID, REMOVAL_FRACTIONS, bleu, calibrate, hellinger, minmax, normalised_auc, rouge_l_f1
from .models import ModelBundle
from .result import Attribution, zscore

REMOVAL_METRICS = ("logit", "ppl", "rougeL", "bleu")
LOWER_IS_BETTER = {"ppl"}  # SRG sign: more negative is better for these
RANDOM = "random"


@dataclass
class RemovalConfig:
    fractions: tuple[float, ...] = REMOVAL_FRACTIONS  # MACS paper A.2.1; the first must be 0 (the baseline run)
    max_new_tokens: int | None = None  # regeneration length; None: the original run's limit (attr.meta)
    batch_size: int = 16  # perturbed runs per forward batch
    seed: int = 0  # the random baseline's two orderings


@dataclass
class SoftConfig:
    samples: int = 15  # Monte-Carlo masks per pi (Grad-ELLM paper, section 4.3)
    pis: tuple[float, ...] = PI_GRID  # target retaining probabilities 0.05 ... 0.95
    step_stride: int = 5  # evaluate steps 0, 5, 10, ... (section 4.3: every five generated tokens)
    routing: str = "dynamic"  # "dynamic" (section 4.3) or "fixed" (Appendix K: attention of the unperturbed pass)
    seed: int = 0
    batch_size: int = 64  # perturbed inputs per forward batch

    def __post_init__(self) -> None:
        if self.routing not in ("dynamic", "fixed"):
            raise InputError(f"routing must be 'dynamic' or 'fixed', got {self.routing!r}")
        if self.samples < 1 or self.step_stride < 1 or not self.pis:
            raise InputError("samples and step_stride must be at least 1 and pis non-empty")


QUICK_SOFT = SoftConfig(samples=5, pis=tuple(round(0.1 * i, 1) for i in range(1, 10)))  # the app's default


@dataclass
class RemovalReport:
    """MIF / LIF curves of every method.

    Attributes:
        fractions: the removed fractions F.
        curves: method -> metric -> {"mif": [c(F)...], "lif": [...]}, normalised by the unperturbed value.
        auc: method -> metric -> {"mif": AUC, "lif": AUC, "srg": AUC_LIF - AUC_MIF}.
        generations: method -> {"mif": [text per F], "lif": [...]}, the regenerated answers.
    """

    fractions: list[float]
    curves: dict[str, dict[str, dict[str, list[float]]]] = field(default_factory=dict)
    auc: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    generations: dict[str, dict[str, list[str]]] = field(default_factory=dict)


@dataclass
class SoftReport:
    """pi-Soft curves of every method, averaged over the evaluated steps.

    Attributes:
        pis: target retaining probabilities.
        steps: the evaluated generation steps.
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


@dataclass
class FaithfulnessReport:
    removal: RemovalReport | None = None
    soft: SoftReport | None = None


# --------------------------------------------------------------------------------------------------------------
def _positions(attr: Attribution, positions: Sequence[int] | None) -> np.ndarray:
    pos = np.asarray(list(positions) if positions is not None else (attr.user_positions or []), dtype=np.int64)
    if positions is None and pos.size == 0:
        pos = np.arange(attr.num_prompt_tokens)
    if pos.size == 0:
        raise InputError("No prompt positions to evaluate.")
    if pos.min() < 0 or pos.max() >= attr.num_prompt_tokens:
        raise InputError("Evaluated positions must lie inside the prompt.")
    return pos


def _check(attr: Attribution, methods: Sequence[str]) -> None:
    if attr.num_steps == 0:
        raise InputError("The result has no generated tokens to evaluate.")
    missing = [m for m in methods if m != RANDOM and m not in attr.methods]
    if missing:
        raise InputError(f"The result has no scores for {', '.join(missing)}; available: {', '.join(attr.methods)}.")


def ranking_scores(attr: Attribution, method: str, positions: Sequence[int]) -> np.ndarray:
    """(n,) score per evaluated position: the mean over steps of the per-step z-scores over those positions."""
    z = zscore(attr.methods[method].raw, positions)[:, positions]  # (K, n)
    return np.nan_to_num(z.astype(np.float64).mean(axis=0), nan=-np.inf)


def removal_orderings(attr: Attribution, method: str, positions: np.ndarray, seed: int = 0) -> dict[str, np.ndarray]:
    """{"mif": positions most important first, "lif": least important first}; two random ones for `random`."""
    if method == RANDOM:
        rng = np.random.default_rng(seed)
        return {"mif": rng.permutation(positions), "lif": rng.permutation(positions)}
    s = ranking_scores(attr, method, positions)
    return {"mif": positions[np.argsort(-s, kind="stable")], "lif": positions[np.argsort(s, kind="stable")]}


def _batches(n: int, size: int) -> Iterator[slice]:
    for start in range(0, n, max(1, size)):
        yield slice(start, min(n, start + max(1, size)))


@torch.inference_mode()
def _prefill(model, prompt: torch.Tensor, keep: torch.Tensor) -> tuple[DynamicCache, torch.Tensor]:
    """One masked pass over the prompt: its KV cache and the logits (R, V) that predict the first new token.

    Args:
        prompt: (N,) ids. keep: (R, N) bool, False = removed.
    """
    r, n = keep.shape
    cache = DynamicCache(config=model.config)
    # the positions before the first removed one are the same in every row: computed once, then repeated
    removed = (~keep).any(dim=0).nonzero()
    shared = min(int(removed[0]) if removed.numel() else n, n - 1)
    if shared > 0:
        head = torch.arange(shared, device=keep.device)[None]  # (1, P)
        model(input_ids=prompt[None, :shared], position_ids=head, past_key_values=cache, use_cache=True,
              logits_to_keep=1)  # fmt: skip
        cache.batch_repeat_interleave(r)
    pos = torch.arange(shared, n, device=keep.device).expand(r, n - shared)
    out = model(
        input_ids=prompt[shared:].expand(r, n - shared), attention_mask=keep.long(), position_ids=pos,
        past_key_values=cache, use_cache=True, logits_to_keep=1,
    )  # fmt: skip
    return cache, out.logits[:, -1].float()


@torch.inference_mode()
def _teacher_forced(
    model,
    prompt: torch.Tensor,
    gen: torch.Tensor,
    keep: torch.Tensor,
    prefilled: tuple[DynamicCache, torch.Tensor] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Mean logit and perplexity of `gen` after a masked prompt.

    Args:
        prompt: (N,) ids. gen: (K,) ids. keep: (R, N) bool, False = removed.
        prefilled: `_prefill`'s result for the same inputs (copied, not changed), to share the prompt pass.

    Returns:
        mean logits (R,), perplexities (R,).
    """
    r, n = keep.shape
    k = gen.shape[0]
    cache, first = prefilled if prefilled is not None else _prefill(model, prompt, keep)
    logits = [first[:, None]]  # (R, 1, V) predicts gen[0]
    if k > 1:
        mask = torch.cat([keep.long(), torch.ones(r, k - 1, dtype=torch.long, device=keep.device)], dim=1)
        pos = torch.arange(n, n + k - 1, device=keep.device).expand(r, k - 1)
        out = model(
            input_ids=gen[:-1].expand(r, k - 1), attention_mask=mask, position_ids=pos,
            past_key_values=copy.deepcopy(cache), use_cache=True,
        )  # fmt: skip
        logits.append(out.logits.float())  # (R, K-1, V) predicts gen[1:]
    logits = torch.cat(logits, dim=1)  # (R, K, V)
    target = logits.gather(-1, gen.expand(r, k)[..., None])[..., 0]  # (R, K)
    ce = torch.logsumexp(logits, dim=-1) - target
    return target.mean(dim=1).cpu().numpy(), torch.exp(ce.mean(dim=1)).cpu().numpy()


@torch.inference_mode()
def _greedy(
    model,
    prompt: torch.Tensor,
    keep: torch.Tensor,
    max_new_tokens: int,
    eos: set[int],
    prefilled: tuple[DynamicCache, torch.Tensor] | None = None,
) -> list[list[int]]:
    """Batched greedy decoding after a masked prompt, with a growing mask and explicit positions.

    Args:
        prompt: (N,) ids. keep: (R, N) bool, False = removed.
        prefilled: `_prefill`'s result for the same inputs; its cache is extended in place.

    Returns:
        R token lists, each ending at its first end-of-sequence token (included) or at `max_new_tokens`.
    """
    r, n = keep.shape
    dev = keep.device
    cache, logits = prefilled if prefilled is not None else _prefill(model, prompt, keep)  # logits (R, V)
    mask = keep.long()  # (R, N), grows by one column per step
    out: list[list[int]] = [[] for _ in range(r)]
    done = torch.zeros(r, dtype=torch.bool, device=dev)
    for step in range(max_new_tokens):
        token = logits.argmax(dim=-1)  # (R,)
        for i in (~done).nonzero().flatten().tolist():
            out[i].append(int(token[i]))
        done |= torch.tensor([t in eos for t in token.tolist()], dtype=torch.bool, device=dev)
        if bool(done.all()) or step == max_new_tokens - 1:
            break
        mask = torch.cat([mask, torch.ones(r, 1, dtype=mask.dtype, device=dev)], dim=1)
        pos = torch.full((r, 1), n + step, dtype=torch.long, device=dev)
        logits = model(
            input_ids=token[:, None], attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True,
        ).logits[:, -1]  # (R, V)  # fmt: skip
    return out


def _decode(bundle: ModelBundle, ids: Sequence[int]) -> str:
    return bundle.tokenizer.decode(list(ids), skip_special_tokens=True)


def removal_curves(
    bundle: ModelBundle,
    attr: Attribution,
    methods: Sequence[str] | None = None,
    positions: Sequence[int] | None = None,
    config: RemovalConfig | None = None,
    include_random: bool = True,
    progress: ProgressFn | None = None,
) -> RemovalReport:
    """MIF / LIF curves and SRG for the given methods of one result (MACS paper, Appendix A.2).

    All perturbed runs (every method, ordering and fraction; equal masks once) are batched together.

    Args:
        bundle: the model that produced `attr`.
        attr: a finished result.
        methods: methods of `attr` to evaluate (default: all); "random" needs no scores.
        positions: prompt positions that may be removed (default: the user's text).
        include_random: add the random baseline (two random orderings) if not among `methods`.
        progress: progress(fraction, message).

    Returns:
        A `RemovalReport`; SRG is higher-is-better for logit, ROUGE-L and BLEU, lower-is-better for perplexity.

    Raises:
        InputError: no generated tokens, unknown method, or bad positions.
    """
    cfg = config or RemovalConfig()
    methods = list(methods if methods is not None else attr.methods)
    if include_random and RANDOM not in methods:
        methods.append(RANDOM)
    _check(attr, methods)
    pos = _positions(attr, positions)
    fractions = [float(f) for f in cfg.fractions]
    if fractions[0] != 0.0 or len(fractions) < 2:
        raise InputError("fractions must start at 0 and have at least two entries")
    counts = [int(round(f * pos.size)) for f in fractions]

    # one run per distinct removed set; index 0 is the unperturbed baseline
    runs: dict[frozenset, int] = {frozenset(): 0}
    plan: dict[str, dict[str, list[int]]] = {}
    for m in methods:
        plan[m] = {}
        for name, order in removal_orderings(attr, m, pos, cfg.seed).items():
            plan[m][name] = [runs.setdefault(frozenset(order[:c].tolist()), len(runs)) for c in counts]
    dev = bundle.device
    keep = torch.ones(len(runs), attr.num_prompt_tokens, dtype=torch.bool, device=dev)  # (R, N)
    for removed, row in runs.items():
        keep[row, sorted(removed)] = False
    prompt = torch.tensor(attr.prompt_token_ids, dtype=torch.long, device=dev)  # (N,)
    gen = torch.tensor(attr.generated_token_ids, dtype=torch.long, device=dev)  # (K,)
    max_new = cfg.max_new_tokens or int(attr.meta.get("max_new_tokens") or attr.num_steps)
    eos = bundle.eos_token_ids
    reference = _decode(bundle, attr.generated_token_ids)

    values = {m: np.zeros(len(runs)) for m in REMOVAL_METRICS}
    texts = [""] * len(runs)
    batches = list(_batches(len(runs), cfg.batch_size))
    for b, sl in enumerate(batches):
        if progress:
            progress(b / len(batches), f"removal runs {sl.start + 1}-{sl.stop} of {len(runs)}")
        prefilled = _prefill(bundle.model, prompt, keep[sl])  # shared by both passes
        values["logit"][sl], values["ppl"][sl] = _teacher_forced(bundle.model, prompt, gen, keep[sl], prefilled)
        regenerated = _greedy(bundle.model, prompt, keep[sl], max_new, eos, prefilled)
        for i, tokens in zip(range(sl.start, sl.stop), regenerated):
            texts[i] = _decode(bundle, tokens)
            values["rougeL"][i] = rouge_l_f1(texts[i], reference)
            values["bleu"][i] = bleu(texts[i], reference)
    if progress:
        progress(1.0, "removal runs done")

    report = RemovalReport(fractions=fractions)
    for m, orders in plan.items():
        report.curves[m], report.auc[m] = {}, {}
        report.generations[m] = {name: [texts[i] for i in rows] for name, rows in orders.items()}
        for metric, v in values.items():
            base = v[0]
            curves = {
                name: [float(v[i] / base) if base != 0 and np.isfinite(base) else float("nan") for i in rows]
                for name, rows in orders.items()
            }
            auc = {name: normalised_auc(fractions, c) for name, c in curves.items()}
            auc["srg"] = auc["lif"] - auc["mif"]
            report.curves[m][metric], report.auc[m][metric] = curves, auc
    return report


# --------------------------------------------------------------------------------------------------------------
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
        p = probs[module.layer_idx][:, :, tk - tq : tk, :tk].to(value.dtype)  # (1, H, Tq, Tk); queries are the newest
        p = p.expand(b, h, tq, tk).reshape(b, kvh, (h // kvh) * tq, tk)  # (B, KVH, G*Tq, Tk)
        out = torch.matmul(p, value).reshape(b, h, tq, d)  # (B, H, Tq, D)
        return out.transpose(1, 2).contiguous(), None

    with attention_function_selected(model, "explainer_fixed_routing_", fixed_forward):
        yield


@contextlib.contextmanager
def _recording(model: torch.nn.Module, store: dict[int, torch.Tensor]) -> Iterator[None]:
    """Record every layer's full attention probabilities (1, H, T, T) of one unperturbed pass."""

    def record_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        b, h, tq, d = query.shape
        kvh, tk = key.shape[1], key.shape[2]
        scale = scaling if scaling is not None else d**-0.5
        k = key.repeat_interleave(h // kvh, dim=1)  # (B, H, Tk, D)
        scores = torch.matmul(query, k.transpose(-1, -2)).float() * scale  # (B, H, Tq, Tk)
        mask = _additive_mask(attention_mask, torch.float32)
        if mask is not None:  # the model's own mask (causal, sliding window) when it builds one
            scores = scores + mask
        else:
            causal = torch.ones(tq, tk, dtype=torch.bool, device=query.device).tril(tk - tq)
            scores = scores.masked_fill(~causal, float("-inf"))
        store[module.layer_idx] = torch.softmax(scores, dim=-1)
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
    cache = None
    if prefix is not None and start > 0:
        cache = copy.deepcopy(prefix)
        cache.batch_repeat_interleave(b)
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
) -> SoftReport:
    """pi-Soft-NS and pi-Soft-NC curves of the given methods of one result (Grad-ELLM paper, section 3.1).

    Cost per evaluated step: 2 + 2 * len(pis) * samples forwards per method (batched); the paper's settings give
    572 for one method.

    Returns:
        A `SoftReport`; higher is better for both curves.

    Raises:
        InputError: no generated tokens, unknown method, or bad positions.
    """
    cfg = config or SoftConfig()
    methods = list(methods if methods is not None else attr.methods)
    _check(attr, [])
    methods = [m for m in methods if m in attr.methods]  # the random orderings of `removal_curves` have no scores
    if not methods:
        raise InputError(f"pi-Soft needs a method with scores; available: {', '.join(attr.methods) or 'none'}.")
    pos = _positions(attr, positions)
    model = bundle.model
    dev = bundle.device
    embed = model.get_input_embeddings()
    all_ids = attr.prompt_token_ids + attr.generated_token_ids
    n = attr.num_prompt_tokens
    steps = list(range(0, attr.num_steps, cfg.step_stride))
    pis = [float(p) for p in cfg.pis]
    ns = {m: np.full((len(steps), len(pis)), np.nan) for m in methods}
    nc = {m: np.full((len(steps), len(pis)), np.nan) for m in methods}
    pos_t = torch.as_tensor(pos, device=dev)
    for si, k in enumerate(steps):
        if progress:
            progress(si / len(steps), f"pi-Soft: step {k + 1} of {attr.num_steps}")
        ids = torch.tensor([all_ids[: n + k]], dtype=torch.long, device=dev)  # (1, T), T = N + k
        emb = embed(ids)  # (1, T, D)
        probs: dict[int, torch.Tensor] = {}
        with _recording(model, probs) if cfg.routing == "fixed" else contextlib.nullcontext():
            p_orig = _next_token_probs(model, emb)  # (1, V)
        # positions before the first evaluated one never change: their cache is computed once per step
        prefix = DynamicCache(config=model.config)
        if pos.min() > 0:
            head = torch.arange(int(pos.min()), device=dev)[None]  # (1, P)
            model(inputs_embeds=emb[:, head[0]], position_ids=head, past_key_values=prefix, use_cache=True,
                  logits_to_keep=1)  # fmt: skip
        routing = functools.partial(fixed_routing, model, probs) if cfg.routing == "fixed" else contextlib.nullcontext
        zero = emb.clone()
        zero[:, pos_t] = 0.0
        with routing():
            d0 = float(hellinger(p_orig.numpy(), _next_token_probs(model, zero, prefix).numpy())[0])
        if not d0 > 0:
            continue  # the zero baseline does not move the prediction: the step carries no signal
        # masks for every method, pi, kind (NS keeps by s~, NC by 1 - s~) and sample: (M, n)
        masks, index = [], []
        for m in methods:
            s = minmax(attr.methods[m].raw[k, pos])
            rng = np.random.default_rng([cfg.seed, k, methods.index(m)])
            for pi_i, pi in enumerate(pis):
                st = calibrate(s, pi)
                for kind, p_keep in (("ns", st), ("nc", 1.0 - st)):
                    masks.append(rng.random((cfg.samples, pos.size)) < p_keep)
                    index.append((m, kind, pi_i))
        e = torch.as_tensor(np.concatenate(masks), dtype=emb.dtype, device=dev)  # (M, n)
        dist = np.empty(e.shape[0])
        for sl in _batches(e.shape[0], cfg.batch_size):
            batch = emb.expand(sl.stop - sl.start, -1, -1).clone()  # (B, T, D)
            batch[:, pos_t] *= e[sl, :, None]
            with routing():
                dist[sl] = hellinger(p_orig.numpy(), _next_token_probs(model, batch, prefix).numpy())
        for j, (m, kind, pi_i) in enumerate(index):
            d = dist[j * cfg.samples : (j + 1) * cfg.samples]
            if kind == "ns":
                ns[m][si, pi_i] = float(np.mean(np.maximum(0.0, d0 - d) / d0))
            else:
                nc[m][si, pi_i] = float(np.mean(d / d0))
    if progress:
        progress(1.0, "pi-Soft done")
    report = SoftReport(pis=pis, steps=steps, config=dict(vars(cfg)))
    with np.errstate(all="ignore"):
        for m in methods:
            for target, auc, curve in ((report.ns, report.auc_ns, ns[m]), (report.nc, report.auc_nc, nc[m])):
                mean = np.nanmean(curve, axis=0) if np.isfinite(curve).any() else np.full(len(pis), np.nan)
                target[m] = [float(x) for x in mean]
                auc[m] = float(np.trapezoid(mean, pis)) if len(pis) > 1 else float(mean[0])
    return report


def measure_faithfulness(
    bundle: ModelBundle,
    attr: Attribution,
    methods: Sequence[str] | None = None,
    positions: Sequence[int] | None = None,
    removal: RemovalConfig | None = None,
    soft: SoftConfig | None = QUICK_SOFT,
    progress: ProgressFn | None = None,
    include_removal: bool = True,
) -> FaithfulnessReport:
    """Removal curves and pi-Soft curves of one result, with one progress callback over both.

    `soft=None` skips pi-Soft; `include_removal=False` skips the removal curves.
    """

    def part(lo: float, hi: float) -> Callable[[float, str], None] | None:
        if progress is None:
            return None
        return lambda f, msg: progress(lo + (hi - lo) * f, msg)

    split = 0.5 if include_removal and soft is not None else (1.0 if include_removal else 0.0)
    report = FaithfulnessReport()
    if include_removal:
        report.removal = removal_curves(bundle, attr, methods, positions, removal, progress=part(0.0, split))
    if soft is not None:
        report.soft = soft_curves(bundle, attr, methods, positions, soft, progress=part(split, 1.0))
    return report
