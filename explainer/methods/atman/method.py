"""AtMan: explanation by attention manipulation, a post-hoc perturbation method.

Implements Deb, Deiseroth, Weinbach et al., "AtMan: Understanding Transformer Predictions Through Memory Efficient
Attention Manipulation" (AtMan paper, sections 3.1-3.3):

- Eq. 3: the influence of prompt token i on generated token k is the change of k's cross-entropy under teacher
  forcing of the whole generation when i is suppressed: score[k, i] = CE_k(suppress i) - CE_k(original).
- Eq. 4 (as our issue tracker specifies it, not the paper's literal form): in every layer and head, each query's
  attention weight to the suppressed key is multiplied by `suppression_factor` before renormalisation, i.e.
  ln(suppression_factor) is added to the pre-softmax score of that key's column.
- Section 3.3, correlated suppression: every other prompt token j whose input embedding has cosine similarity
  s_ij >= kappa to token i is suppressed too, by the factor (1 - f) * (1 - s_ij) + f (f = suppression_factor).

Only prompt tokens are suppressed, never generated ones. Image tokens of a vision-language prompt are prompt tokens
like any other; their "input embedding" for correlated suppression is the merged patch feature the decoder receives.
One teacher-forced pass per suppressed token gives a whole column of the (K, N) map.

Fast path (`fast=True`), exact up to float rounding:
- one unperturbed pass gives the KV cache of every position;
- queries before the first suppressed position cannot attend to it, so their hidden states, keys and values are
  unchanged: the perturbed passes reuse that cached prefix and recompute only the suffix, several suppressed tokens
  per batch, sorted by their first suppressed position so a batch shares a long prefix;
- CE_original comes from one unperturbed row in every batch, so it is computed in exactly the layout (prefix, batch,
  length) of the rows it is subtracted from: on a GPU, where a pass's rounding depends on its shape, bfloat16 leaves
  no layout noise floor; a row that suppresses nothing (`suppression_factor=1`) is the baseline itself, scores
  exactly 0 and is not run;
- equal suppression rows are run once: with correlated suppression every occurrence of a token id suppresses all
  occurrences (cosine 1) with the same factors, so their columns are identical (512 tokens of English text have
  ~220 distinct ids);
- logits are computed only at the K positions that predict generated tokens.
The naive path (`fast=False`) runs one full forward per prompt token at batch size 1, computing every logit, and is
the reference the fast path is checked against.

The suppression is applied by a uniquely named attention function and mask function registered with transformers'
`AttentionInterface` / `AttentionMaskInterface` and selected on the language model's config only, for the duration
of an `attention_suppression` block (`capture.attention_function_selected`, shared with the capture).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
from transformers import DynamicCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import eager_mask

from ...capture import attention_function_selected, check_attention_kwargs
from ...contrast import foil_values
from ...errors import UnsupportedModelError
from ...runtime.host import to_numpy
from ...runtime.kv import batch_budget, batches_by_first, prefix_cache, reusable
from ...runtime.memory import MemoryRequest, pass_rows
from ...runtime.session import between_passes, hold
from ..base import AttributionMethod, GenerationRun, ProgressFn
from ..cost import Cost, CostRequest
from ..inputs import SequenceInputs
from .config import CPU_BATCH_ROWS, AtManConfig
from .cost import atman_cost
from .factors import suppression_factors

_NAME_PREFIX = "explainer_atman_"


@dataclass
class _Suppression:
    """What the registered functions read while a block runs.

    Attributes:
        bias: (B, T) additive pre-softmax bias per key position for each sequence of the batch, or None.
        calls: number of attention layer calls seen (0 after a pass means nothing was manipulated).
    """

    bias: torch.Tensor | None = None
    calls: int = 0
    from_query: int = 0  # the bias acts on the queries at this position and after only (Sources' answer scope)
    mask: Callable | None = None  # builds the whole mask from the mask interface's arguments instead (packed passes)


def _make_mask_function(state: _Suppression) -> Callable:
    def atman_mask(*, kv_length: int, kv_offset: int = 0, **kwargs) -> torch.Tensor:
        if state.mask is not None:
            return state.mask(kv_length=kv_length, kv_offset=kv_offset, **kwargs)
        # The float mask is built once per forward and mask type and shared by all layers, so the bias costs one add.
        mask = eager_mask(kv_length=kv_length, kv_offset=kv_offset, **kwargs)  # (B, 1, Tq, Tk) additive float
        if state.bias is None:
            return mask
        bias = state.bias[:, kv_offset : kv_offset + kv_length].to(mask.device, mask.dtype)  # (B, Tk)
        if bias.shape[0] != mask.shape[0] or bias.shape[1] != kv_length:
            raise UnsupportedModelError(
                f"This model builds attention masks of shape {tuple(mask.shape)} that AtMan's per-token bias "
                f"{tuple(bias.shape)} cannot be aligned with."
            )
        edit = bias[:, None, None, :]  # (B, 1, 1, Tk)
        q_offset = int(kwargs.get("q_offset", 0))
        if state.from_query > q_offset:  # queries before `from_query` see every key as usual
            rows = torch.arange(q_offset, q_offset + mask.shape[2], device=mask.device) >= state.from_query  # (Tq,)
            edit = torch.where(rows[None, None, :, None], edit, torch.zeros_like(edit))  # (B, 1, Tq, Tk)
        return mask + edit

    return atman_mask


def _make_attention_function(state: _Suppression) -> Callable:
    def atman_attention_forward(
        module: torch.nn.Module,
        query: torch.Tensor,  # (B, H, Tq, D)
        key: torch.Tensor,  # (B, KVH, Tk, D)
        value: torch.Tensor,  # (B, KVH, Tk, D)
        attention_mask: torch.Tensor | None,  # (B, 1, Tq, Tk) additive float, bias included
        dropout: float = 0.0,
        scaling: float | None = None,
        **kwargs,
    ) -> tuple[torch.Tensor, None]:
        check_attention_kwargs(module, kwargs, "AtMan")
        if attention_mask is None and state.bias is not None:
            raise UnsupportedModelError(
                f"{type(module).__name__} received no attention mask from transformers' mask interface, so AtMan "
                "cannot suppress tokens in it."
            )
        state.calls += 1
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )

    return atman_attention_forward


@contextlib.contextmanager
def attention_suppression(model: torch.nn.Module) -> Iterator[_Suppression]:
    """Let every attention layer of the language model add a per-key bias to its scores while the block runs.

    Set `state.bias` to a (B, T) tensor (B = batch of the next forward, T >= its total key length) before a forward;
    None leaves attention unchanged. On exit, also after an exception, the config's attention implementation is
    restored and the registered names are removed.
    """
    state = _Suppression()
    try:
        with attention_function_selected(
            model, _NAME_PREFIX, _make_attention_function(state), _make_mask_function(state)
        ):
            yield state
    finally:
        state.bias = None


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor, foils: torch.Tensor | None = None) -> torch.Tensor:
    """(B, K, V) logits and (K,) targets -> (B, K) float32 cross-entropy; at a contrasted step (`foils`, see
    `explainer/contrast.py`) CE_A - CE_B = log p(B) - log p(A), AtMan's loss difference for A against B."""
    logp = torch.log_softmax(logits.float(), dim=-1)  # (B, K, V)
    targets = targets.to(logp.device)  # the logits come from the last layer's device under a device map
    ce = -logp.gather(-1, targets.view(1, -1, 1).expand(logp.shape[0], -1, 1)).squeeze(-1)  # (B, K)
    foil = foil_values(logp, foils)  # (B, K) log p(B), 0 where no foil; or None
    return ce if foil is None else ce + foil


def check_manipulated(state: _Suppression) -> None:
    if state.calls == 0:
        raise UnsupportedModelError(
            "AtMan found no attention layers that use transformers' AttentionInterface in this model, so it cannot "
            "suppress tokens."
        )


def report_progress(progress: ProgressFn | None, done: int, total: int, label: str = "AtMan") -> None:
    """After every forward pass: progress, a stop if the request was cancelled, and the model handed to visitors'
    decoding while they want it (`session.between_passes`)."""
    between_passes()
    if progress is not None:
        progress(done / total, f"{label}: {done}/{total} passes")


@torch.inference_mode()
def atman_scores(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    num_prompt_tokens: int,
    config: AtManConfig | None = None,
    progress: ProgressFn | None = None,
    extra_inputs: dict | None = None,
    foils: torch.Tensor | None = None,
) -> np.ndarray:
    """AtMan map of a finished generation.

    Args:
        model: causal LM (or vision-language model) whose language model uses transformers' AttentionInterface.
        input_ids: (1, N + K) prompt followed by the generated tokens.
        num_prompt_tokens: N.
        config: options; `config.fast` picks the prefix-reusing batched path or the naive loop.
        progress: optional callback, called after every forward pass and last with 1.0.
        extra_inputs: further inputs of a forward over `input_ids` for image prompts (`pixel_values`,
            `image_grid_thw`, (3, 1, N + K) `position_ids`; see `GenerationRun.extra_inputs`). Image tokens are then
            suppressed like text tokens, and correlated suppression compares the decoder's input embeddings, i.e. the
            merged patch features.
        foils: (K,) foil ids of contrasted steps, -1 elsewhere (`GenerationRun.foils`): there CE_k is CE_A - CE_B.

    Returns:
        (K, N) float32: score[k, i] = CE_k(suppress i) - CE_k(original).

    Raises:
        UnsupportedModelError: the model's attention cannot be manipulated.
    """
    with hold(model):
        return _atman_scores(
            model, input_ids, num_prompt_tokens, config or AtManConfig(), progress, extra_inputs, foils
        )


def suppression_scores(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    num_prompt_tokens: int,
    log_bias: torch.Tensor,
    fast: bool = True,
    batch_size: int = 0,
    progress: ProgressFn | None = None,
    label: str = "AtMan",
    from_query: int = 0,
) -> np.ndarray:
    """CE_k(row r's suppression) - CE_k(original) of a text sequence for any suppression rows, by AtMan's passes
    (`fast`: the prefix-cache batched ones; else one full forward per row). Other methods that hide groups of tokens
    (Sources) call this; the caller holds the model and runs it in inference mode.

    Args:
        input_ids: (1, N + K) prompt and answer.
        log_bias: (R, N + K) pre-softmax bias per key position for each row (0: untouched).
        from_query: the bias acts on the queries from this position on only; earlier ones attend as usual (the
            reference of `answer_passes.PackedPasses`; the fast passes do not take it).

    Returns:
        (K, R) float32.
    """
    if fast and from_query:
        raise ValueError("the batched passes hide keys from every later query; use answer_passes for from_query")
    if fast:
        seq = SequenceInputs(input_ids)
        return _fast_scores(model, seq, num_prompt_tokens, log_bias, batch_size, progress, {}, None, label)
    return naive_scores(model, input_ids, num_prompt_tokens, log_bias, progress, {}, None, label, from_query)


def _atman_scores(model, input_ids, num_prompt_tokens, cfg, progress, extra_inputs, foils=None) -> np.ndarray:
    n, t = num_prompt_tokens, input_ids.shape[1]
    k = t - n
    if k <= 0:
        return np.zeros((0, n), dtype=np.float32)
    extra_inputs = dict(extra_inputs or {})
    seq = SequenceInputs.of(model, input_ids, extra_inputs)
    if seq.embeds is not None:
        prompt_embeddings = seq.embeds[0, :n]  # (N, d)
    else:
        prompt_embeddings = model.get_input_embeddings()(input_ids[0, :n])  # (N, d)
    factors = suppression_factors(prompt_embeddings, cfg.suppression_factor, cfg.correlated, cfg.cosine_threshold)
    log_bias = torch.zeros(n, t, dtype=torch.float32, device=input_ids.device)  # (N, T): generated keys untouched
    log_bias[:, :n] = torch.log(factors)
    if cfg.fast:
        return _fast_scores(model, seq, n, log_bias, cfg.batch_size, progress, extra_inputs or {}, foils)
    return naive_scores(model, input_ids, n, log_bias, progress, extra_inputs or {}, foils)


def naive_scores(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    n: int,
    log_bias: torch.Tensor,
    progress: ProgressFn | None,
    extra_inputs: dict,
    foils: torch.Tensor | None = None,
    label: str = "AtMan",
    from_query: int = 0,
) -> np.ndarray:
    """One full forward per suppression row (one per prompt token for AtMan; one per unit for Sources) at batch size
    1 from the original inputs (an image prompt runs its vision tower every time), every logit computed; the
    reference for `_fast_scores`. Returns (K, R) for the R rows of `log_bias`."""
    t = input_ids.shape[1]
    targets = input_ids[0, n:]  # (K,)
    scores = np.zeros((t - n, log_bias.shape[0]), dtype=np.float32)  # (K, R)
    with attention_suppression(model) as state:
        state.from_query = from_query
        state.bias = torch.zeros_like(log_bias[:1])  # (1, T): the same computation as the perturbed passes
        logits = model(input_ids=input_ids, use_cache=False, **extra_inputs).logits[:, n - 1 : t - 1]  # (1, K, V)
        base = cross_entropy(logits, targets, foils)
        check_manipulated(state)
        report_progress(progress, 1, log_bias.shape[0] + 1, label)
        for i in range(log_bias.shape[0]):
            state.bias = log_bias[i : i + 1]  # (1, T)
            logits = model(input_ids=input_ids, use_cache=False, **extra_inputs).logits[:, n - 1 : t - 1]  # (1, K, V)
            scores[:, i] = to_numpy((cross_entropy(logits, targets, foils) - base)[0])
            report_progress(progress, i + 2, log_bias.shape[0] + 1, label)
    return scores


def _fast_scores(
    model: torch.nn.Module,
    seq: SequenceInputs,
    n: int,
    log_bias: torch.Tensor,
    batch_size: int,
    progress: ProgressFn | None,
    extra_inputs: dict,
    foils: torch.Tensor | None = None,
    label: str = "AtMan",
) -> np.ndarray:
    """Batched perturbed passes over the suffix after a shared unperturbed prefix cache; equal rows run once.
    Returns (K, R): one column per row of `log_bias` (R = N for AtMan)."""
    t = seq.input_ids.shape[1]
    k = t - n
    targets = seq.input_ids[0, n:]  # (K,)
    # The last generated token predicts nothing that is scored, so every pass stops before it (T - 1 positions).
    # Equal suppression rows (other occurrences of a token under correlated suppression) give equal columns.
    rows, column_of = torch.unique(log_bias[:, : t - 1], dim=0, return_inverse=True)  # (R, T - 1), (N,)
    suppressed = rows[:, :n] != 0  # (R, N)
    first = suppressed.float().argmax(dim=1)  # (R,) first suppressed position of each row
    # A row that suppresses nothing (factor 1) is the baseline itself: its column stays exactly 0 and is not run.
    run = suppressed.any(dim=1).nonzero()[:, 0]  # (R',)
    # A group starts at its smallest first position, so its longest suffix sets how many rows fit the token budget:
    # a few seconds per forward on a CPU, so a cancelled request stops soon.
    tokens, most = batch_budget(model, t, k, batch_size, CPU_BATCH_ROWS)
    groups = [run[g] for g in batches_by_first(first[run].tolist(), t - 1, most, tokens)]  # row indices per batch
    columns = torch.zeros(k, rows.shape[0], device=rows.device)  # (K, R)
    if not groups:
        return to_numpy(columns[:, column_of])  # (K, N) zeros
    total = len(groups) + 1
    unperturbed = torch.zeros_like(rows[:1])  # (1, T - 1): row 0 of every batch, the baseline of the others
    with attention_suppression(model) as state:
        cache = DynamicCache()  # no config: every layer keeps all positions, sliding ones included
        model(**seq.inputs(0, t - 1, 1), past_key_values=cache, use_cache=True, logits_to_keep=1)
        check_manipulated(state)
        if reusable(cache, t - 1):
            report_progress(progress, 1, total, label)
            for done, group in enumerate(groups, start=2):
                start = int(first[group].min())  # positions before it are identical in every sequence of the group
                b = len(group) + 1
                state.bias = torch.cat([unperturbed, rows[group]])  # (B, T - 1)
                out = model(
                    **seq.inputs(start, t - 1, b),  # (B, T - 1 - start)
                    past_key_values=prefix_cache(cache, start, b),
                    use_cache=True,
                    logits_to_keep=k,
                )
                ce = cross_entropy(out.logits, targets, foils)  # (B, K)
                columns[:, group] = (ce[1:] - ce[:1]).T  # (K, B - 1)
                report_progress(progress, done, total, label)
            return to_numpy(columns[:, column_of])  # (K, N)
    # A cache layout we cannot slice (e.g. recurrent layers): recompute every pass in full.
    return naive_scores(model, seq.input_ids, n, log_bias, progress, extra_inputs, foils, label)


def prefix_pass_bytes(request: MemoryRequest, batch_size: int, cpu_rows: int, runs: int) -> int:
    """The unperturbed prefix cache over T positions and one batched pass over it: the pass's positions'
    activations and, per row (`memory.pass_rows`, at most the `runs` perturbed rows there are, and the unperturbed
    row), a copy of the cache and K logits rows."""
    s, t, k = request.shape, request.t, request.k
    rows = min(pass_rows(request, batch_size, cpu_rows), max(1, runs)) + 1
    per_row = s.kv_bytes(t) + 8 * k * s.vocab
    return s.kv_bytes(t) + s.activation_bytes(min(t, request.batch_tokens)) + rows * per_row


class AtMan(AttributionMethod):
    name = "atman"
    display_name = "AtMan"
    streaming = False
    contrastive = True  # CE_A - CE_B at contrasted steps (`cross_entropy`)
    explains_images = True
    needs_prompt_embeddings = True  # correlated suppression: which tokens suppress each other sets the cost
    Config = AtManConfig

    @classmethod
    def cost(cls, request: CostRequest, config: AtManConfig) -> Cost:
        return atman_cost(request, config)

    @classmethod
    def memory(cls, request: MemoryRequest, config: AtManConfig) -> int:
        """`prefix_pass_bytes` with AtMan's rows per pass on a CPU, one perturbed row per prompt token."""
        return prefix_pass_bytes(request, config.batch_size, CPU_BATCH_ROWS, request.n)

    def explain(self, run: GenerationRun) -> np.ndarray:
        return atman_scores(
            run.model, run.input_ids, run.num_prompt_tokens, self.config, run.progress, run.extra_inputs, run.foils
        )
