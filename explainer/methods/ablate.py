"""Log-probabilities of a fixed response after removing parts of the prompt: what Sources' surrogate is fitted on
(`sources.py`) and what LDS and the top-k drop measure (`eval/lds.py`, `eval/lds_eval.py`).

Removal, as ContextCite ablates a source (and AT2 with `ablation_method="remove"`): the removed tokens are taken
out of the prompt, so the model sees a shorter prompt whose kept tokens sit next to each other. We take them out of
the prompt's token ids rather than re-tokenising the rejoined text as ContextCite does: the kept tokens and the
response keep their ids, and the two differ only where a tokeniser would merge characters across a removed sentence.

How it is computed, equal to a solo forward of each shortened prompt up to float rounding (the tests check it):

1. One pass over prompt + response gives the unperturbed log-probabilities and a KV cache of every position. Where
   the caller has those log-probabilities already (the generation computed them), the pass covers only the positions
   the runs below reuse: those before the last of their first removed tokens.
2. A run recomputes only the kept positions from its first removed token on, reusing the cache before it (queries
   there cannot see what comes later): the removed tokens are dropped from its inputs, so a run that keeps half of
   the prompt computes half of it, and each kept token gets its position in the shortened prompt (`position_ids` =
   the kept tokens before it), so every kept query computes what it computes in the shortened sequence. Runs are
   sorted by their first removed token and batched; rows of a batch are left-padded to its longest, the padding
   hidden by the attention mask. A batch whose first removed token is the prompt's first and whose rows differ in
   length (a padding query would see no key: there is no cache to reuse) keeps every position instead and hides the
   removed tokens by the mask: the same values, more positions.
3. Sliding-window layers measure their window in cache positions, which the hidden tokens still occupy; a model with
   such layers runs each shortened prompt on its own instead.

`reread_from=p` computes a cheaper, approximate ablation, a knockout: every run recomputes only the positions from p
on (what reads the passages: a question after them, the template, the response), with the removed tokens hidden from
those queries and every position where it was, while the positions before p keep the cache of the whole prompt (the
kept passages were read beside the removed ones). It costs R x (N + K - p) positions instead of about R x N.
"""

from __future__ import annotations

import numpy as np
import torch
from transformers import DynamicCache

from ..runtime.host import to_numpy
from ..runtime.kv import batch_budget, batches_by_first, prefix_cache
from ..runtime.memory import language_config
from ..runtime.session import between_passes
from .base import ProgressFn

CPU_ROWS = 16  # removal runs per forward on a CPU


def _token_logprobs(logits: torch.Tensor, response: torch.Tensor) -> np.ndarray:
    """(B, K, V) logits predicting `response` (K,) -> (B, K) float32 log-probabilities of its tokens."""
    logp = torch.log_softmax(logits.float(), dim=-1)  # float32 whatever the model's dtype
    target = response.to(logits.device).expand(logits.shape[0], -1)[..., None]  # (B, K, 1)
    return to_numpy(logp.gather(-1, target)[..., 0], np.float32)


def has_sliding_window(model: torch.nn.Module) -> bool:
    """Whether any attention layer of the language model sees a sliding window (from its config)."""
    config = language_config(model)
    types = getattr(config, "layer_types", None)
    if types:
        return any(t != "full_attention" for t in types)
    return bool(getattr(config, "sliding_window", None)) and getattr(config, "use_sliding_window", True)


def _one_by_one(model: torch.nn.Module, prompt: torch.Tensor, response: torch.Tensor, keep: torch.Tensor,
                given: np.ndarray | None) -> np.ndarray:  # fmt: skip
    """(R, K) each shortened prompt run on its own (a model with sliding-window layers); a row that removes nothing
    takes the `given` unperturbed values where there are some."""
    out = np.zeros((keep.shape[0], response.shape[0]), dtype=np.float32)
    for i in range(keep.shape[0]):
        if given is not None and bool(keep[i].all()):
            out[i] = given
            continue
        between_passes()
        ids = torch.cat([prompt[keep[i]], response[:-1]])[None]  # (1, T_i)
        out[i] = _token_logprobs(model(input_ids=ids, logits_to_keep=response.shape[0]).logits, response)[0]
    return out


def forward_positions(keep: np.ndarray, t: int, reread_from: int | None = None, known: bool = False) -> int:
    """The positions `response_logprobs` computes for prompt keep-rows (R, N) over T = N + K - 1 positions: the
    unperturbed pass (`known`: the values were given, so only the cache before the last first removed token), then
    each perturbed row's kept tokens from its first removed one (a knockout: every position from `reread_from`); a
    batch that starts before a row's first removed token, or pads its rows, computes a few more."""
    used, reused = 0, 0
    for row in keep:
        if row.all():
            continue
        first = int(np.argmin(row))
        reused = max(reused, first if reread_from is None else max(first, reread_from))
        used += t - reread_from if reread_from is not None else int(row[first:].sum()) + t - len(row)
    return used + (reused if known else t)


def _recompute_from(keep: torch.Tensor, n: int, reread_from: int | None) -> list[int]:
    """(R,) where each run starts recomputing: its first removed token (removal) or `reread_from` (a knockout); N for
    a run that removes nothing (the unperturbed one)."""
    removed = ~keep
    first = torch.where(removed.any(dim=1), removed.float().argmax(dim=1), n).tolist()
    return first if reread_from is None else [f if f >= n else max(f, reread_from) for f in first]


@torch.inference_mode()
def response_logprobs(model: torch.nn.Module, prompt: torch.Tensor, response: torch.Tensor, keep: torch.Tensor,
                      batch_size: int = 0, progress: ProgressFn | None = None,
                      reread_from: int | None = None, unperturbed: np.ndarray | None = None) -> np.ndarray:  # fmt: skip
    """The response's token log-probabilities after each removal.

    Args:
        model: a causal LM (the caller holds it).
        prompt: (N,) ids. response: (K,) ids, teacher-forced.
        keep: (R, N) bool, False = the token is removed; a row removing nothing is the unperturbed run. The last
            prompt token, whose logits predict the response's first token, is never removed (a chat template's
            generation prompt is there).
        batch_size: most runs per forward; 0: from the device (CPU: `CPU_ROWS`).
        progress: called with (fraction done, message) after each batched pass (a cancel between passes stops it).
        reread_from: None: removal (the default, exact); p: the knockout above, recomputing from position p on.
        unperturbed: (K,) the response's log-probabilities on the whole prompt where the caller has them (the decode
            loop computed them while generating, `GenerationRun.answer_logprobs`): the rows that remove nothing take
            them, and the unperturbed pass computes only the cache the perturbed rows reuse, no logits.

    Returns:
        (R, K) float32: log p(response[k] | prompt with row r's removed tokens taken out, response[:k]).

    Raises:
        ValueError: a row removes the prompt's last token.
    """
    n, k, r = prompt.shape[0], response.shape[0], keep.shape[0]
    keep = keep.to(device=prompt.device, dtype=torch.bool)
    if r and not bool(keep[:, -1].all()):
        raise ValueError("the prompt's last token predicts the response's first one and cannot be removed")
    seq = torch.cat([prompt, response[:-1]])  # (T,) T = N + K - 1: every position whose logits predict a token
    out = np.zeros((r, k), dtype=np.float32)
    if reread_from is not None and not 0 < reread_from < n:
        raise ValueError(f"reread_from must lie in 1..{n - 1}, got {reread_from}")
    if unperturbed is not None and np.shape(unperturbed) != (k,):
        raise ValueError(f"unperturbed must hold the response's {k} log-probabilities, got {np.shape(unperturbed)}")
    if has_sliding_window(model) and reread_from is None:
        return _one_by_one(model, prompt, response, keep, unperturbed)
    first_all = _recompute_from(keep, n, reread_from)
    perturbed = [i for i in range(r) if first_all[i] < n]
    first = [first_all[i] for i in perturbed]
    base = DynamicCache()
    out[[i for i in range(r) if first_all[i] >= n]] = _unperturbed(model, seq, response, base, unperturbed,
                                                                     max(first, default=0))  # fmt: skip
    tokens, most = batch_budget(model, seq.shape[0], k, batch_size, CPU_ROWS)
    kept_all = torch.cat([keep, torch.ones(r, k - 1, dtype=torch.bool, device=prompt.device)], dim=1)  # (R, T)
    groups = batches_by_first(first, seq.shape[0], most, tokens)
    for done, group in enumerate(groups, start=1):
        between_passes()
        rows = [perturbed[g] for g in group]
        start = min(first[g] for g in group)
        logits = _removal_pass(model, seq, kept_all[rows], start, base, k, reread_from is not None)
        out[rows] = _token_logprobs(logits, response)
        if progress is not None:
            progress(done / len(groups), f"Removal passes {done} of {len(groups)}")
    return out


def _unperturbed(model: torch.nn.Module, seq: torch.Tensor, response: torch.Tensor, base: DynamicCache,
                 given: np.ndarray | None, reused: int) -> np.ndarray:  # fmt: skip
    """(K,) the response's log-probabilities on the whole prompt, filling `base` with the cache the perturbed rows
    reuse: one pass over `seq` (T,) when they are not `given`, else one over its first `reused` positions only."""
    if given is None:
        out = model(input_ids=seq[None], past_key_values=base, use_cache=True, logits_to_keep=response.shape[0])
        return _token_logprobs(out.logits, response)[0]
    if reused:
        model(input_ids=seq[None, :reused], past_key_values=base, use_cache=True, logits_to_keep=1)
    return np.asarray(given, dtype=np.float32)


def _removal_pass(model: torch.nn.Module, seq: torch.Tensor, kept: torch.Tensor, start: int, base: DynamicCache,
                  k: int, knockout: bool) -> torch.Tensor:  # fmt: skip
    """(B, K, V) logits of one batched pass over positions `start` on of `seq` (T,) for rows `kept` (B, T), reusing
    `base`'s cache before `start` (every row keeps those positions). A removal leaves the removed tokens out of its
    inputs, the rows left-padded to the longest; a knockout, or a removal from position 0 whose rows would need
    padding, keeps every position where it is and hides the removed ones by the attention mask (module docstring)."""
    b, lengths = kept.shape[0], kept[:, start:].sum(dim=1)  # (B,) kept positions each row computes
    if knockout or start == 0 and bool((lengths != lengths[0]).any()):  # padding would need a prefix to attend to
        if knockout:  # every position stays where it was
            positions = torch.arange(kept.shape[1], device=kept.device).expand(b, -1)
        else:  # (B, T) place in the shortened sequence
            positions = (kept.long().cumsum(dim=1) - 1).clamp(min=0)
        return model(
            input_ids=seq[start:].expand(b, -1), attention_mask=kept.long(), position_ids=positions[:, start:],
            past_key_values=prefix_cache(base, start, b), use_cache=True, logits_to_keep=k,
        ).logits  # fmt: skip
    suffix = kept[:, start:]  # (B, L)
    width = int(lengths.max())
    rank = suffix.long().cumsum(dim=1) - 1  # (B, L) a kept token's index among the row's kept ones
    slot = width - lengths[:, None] + rank  # (B, L) its place, right-aligned so the response ends every row
    row = torch.arange(b, device=seq.device)[:, None].expand_as(suffix)
    ids = torch.zeros(b, width, dtype=seq.dtype, device=seq.device)  # (B, W) padding: token 0, hidden
    pos = torch.zeros(b, width, dtype=torch.long, device=seq.device)  # (B, W)
    ids[row[suffix], slot[suffix]] = seq[start:].expand(b, -1)[suffix]
    pos[row[suffix], slot[suffix]] = start + rank[suffix]  # its position in the shortened prompt
    real = torch.arange(width, device=seq.device) >= width - lengths[:, None]  # (B, W)
    return model(
        input_ids=ids, attention_mask=torch.cat([kept.new_ones(b, start), real], dim=1).long(), position_ids=pos,
        past_key_values=prefix_cache(base, start, b), use_cache=True, logits_to_keep=k,
    ).logits  # fmt: skip
