"""Attention-row capture through transformers' `AttentionInterface`, without eager attention.

A uniquely named attention function is registered for the duration of a `capture_attention` block and selected on
the language model's config only. Its layer output is SDPA's own, computed by the very call the model makes without
capture, so capture never changes the generated tokens; in addition it records the softmax probability row of the
*last* query position of every layer and head:

- the row's scores are computed in float32 from the model's q and k (upcast before the product, never rounded to a
  bfloat16 or float16 model's dtype: scores of 20-40 rounded to bfloat16 move single probabilities by up to ~13%),
  with the query viewed as (B, kv_heads, group, D) against the unexpanded keys; one query row costs as much as the
  output of a decode step.
- optionally (for methods such as Attention Rollout) every query row of a prefill is handed to a consumer in chunks
  of rows, one layer at a time, so no layer's full N x N matrix is held at once.

Nothing is left behind: on exit (also after an exception) the config's attention implementation is restored and the
registered names are removed.
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from .errors import UnsupportedModelError
from .runtime.devices import input_device
from .runtime.memory import language_config
from .runtime.scores import stacked_scores
from .runtime.session import hold

_NAME_PREFIX = "explainer_capture_"
_counter = itertools.count()
_counter_lock = threading.Lock()

# Called as consumer(layer_idx, q_start, probs) with probs (B, H, q_chunk, W) for query rows q_start..q_start+q_chunk:
# the rows' first W <= T_k keys; the keys after them are invisible to these queries (probability 0).
FullRowConsumer = Callable[[int, int, torch.Tensor], None]


@dataclass
class AttentionRecorder:
    """What one forward pass recorded.

    Attributes:
        rows: layer index -> (B, H, T_k) float32 probabilities of the last query position, on its layer's device.
        full_row_consumer: when set, receives every query row of multi-query (prefill) passes.
        full_row_chunk: number of query rows per chunk handed to the consumer.
        device: where rows of all layers are gathered (`stacked`, the consumer's chunks): a model spread over devices
            computes each layer's rows on that layer's device. None: the first recorded layer's device.
    """

    rows: dict[int, torch.Tensor] = field(default_factory=dict)
    full_row_consumer: FullRowConsumer | None = None
    full_row_chunk: int = 128  # rows per chunk: a chunk's (H, 128, T) probabilities stay in the L3 cache at 4k tokens
    device: torch.device | None = None

    def clear(self) -> None:
        self.rows.clear()

    def stacked(self, total_len: int | None = None) -> torch.Tensor:
        """Rows of all recorded layers in layer order, gathered on `device`: (L, B, H, T).

        Sliding-window layers whose cache keeps only the last keys give shorter rows; they cover the newest
        positions, so they are left-padded with zeros (no attention) to `total_len` (default: the longest row).

        Raises:
            UnsupportedModelError: no layer was recorded.
        """
        if not self.rows:
            raise UnsupportedModelError(
                "No attention was captured: the model has no attention layers that use transformers' "
                "AttentionInterface, so attention-based methods cannot explain it."
            )
        rows = [self.rows[i] for i in sorted(self.rows)]  # each (B, H, T_l)
        device = self.device if self.device is not None else rows[0].device
        rows = [r.to(device) for r in rows]  # no-op on one device
        total = total_len if total_len is not None else max(r.shape[-1] for r in rows)
        # Padding only the short rows: on a GPU every pad is a kernel launch per layer and token.
        return torch.stack(
            [r if r.shape[-1] == total else torch.nn.functional.pad(r, (total - r.shape[-1], 0)) for r in rows]
        )


def additive_mask(attention_mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """Bool (True = attend) or additive float mask -> additive float mask; None stays None."""
    if attention_mask is None:
        return None
    if attention_mask.dtype == torch.bool:
        return torch.zeros(attention_mask.shape, dtype=dtype, device=attention_mask.device).masked_fill(
            ~attention_mask, torch.finfo(dtype).min
        )
    return attention_mask.to(dtype)


def attention_probs(
    query: torch.Tensor,
    key: torch.Tensor,
    mask: torch.Tensor | None,
    scaling: float,
    causal_offset: int | None,
) -> torch.Tensor:
    """Softmax attention probabilities for the given queries, computed in float32 whatever the model's dtype.

    Args:
        query: (B, H, Tq, D).
        key: (B, KVH, Tk, D), unexpanded.
        mask: additive float mask broadcastable to (B, 1, Tq, Tk), or None.
        scaling: softmax temperature of the scores.
        causal_offset: when `mask` is None and causality must still be applied, the absolute key index of query 0.

    Returns:
        (B, H, Tq, Tk) float32.
    """
    b, h, tq, _ = query.shape
    kvh, tk = key.shape[1], key.shape[2]
    g = h // kvh
    q = (query.float() * scaling).reshape(b, kvh, g * tq, -1)  # (B, KVH, G*Tq, D); scaling the few queries
    scores = torch.matmul(q, key.float().transpose(-1, -2))  # (B, KVH, G*Tq, Tk) float32
    scores = scores.view(b, kvh, g, tq, tk)
    if mask is not None:
        scores += mask.float().unsqueeze(1)  # mask (B|1, 1, Tq, Tk) -> (B|1, 1, 1, Tq, Tk)
    elif causal_offset is not None and causal_offset + 1 < tk:
        # Only keys after query 0 can lie in a query's future: mask that corner (at most Tq wide) in place.
        first = max(causal_offset + 1, 0)
        qpos = torch.arange(tq, device=key.device)[:, None] + causal_offset
        kpos = torch.arange(first, tk, device=key.device)[None, :]
        scores[..., first:].masked_fill_(kpos > qpos, float("-inf"))
    return torch.softmax(scores, dim=-1).view(b, h, tq, tk)


def stacked_last_rows(
    queries: torch.Tensor, keys: torch.Tensor, visible: torch.Tensor, scaling: float, float32_out: bool
) -> torch.Tensor:
    """Every layer's softmax row of its last query at once, in float32: a decode step's rows in a few kernels
    instead of a few per layer (the static decode path and the batch's fixed-shape step stash each layer's query and
    keep all layers' keys in one buffer).

    Args:
        queries: (L, B, H, D) each layer's last query, in the model's dtype.
        keys: (L, B, KVH, T, D) all layers' keys, contiguous, unexpanded.
        visible: (B, T) bool, the keys each row's query sees (the others get probability exactly 0).
        scaling: the scores' temperature (every layer's).
        float32_out: the products give float32 from the model's dtype (`runtime.scores.float32_products`);
            otherwise each layer's operands are upcast in turn (`runtime.scores.stacked_scores`).

    Returns:
        (L, B, H, T) float32; the same numbers as `attention_probs` to float32 rounding (its queries are scaled
        before the product, these scores after it).
    """
    num_layers, b, h, d = queries.shape
    kvh, t = keys.shape[2], keys.shape[3]
    q = queries.reshape(num_layers * b * kvh, h // kvh, d)  # (L*B*KVH, G, D): head h reads key head h // G
    k = keys.view(num_layers * b * kvh, t, d).transpose(1, 2)  # (L*B*KVH, D, T)
    scores = stacked_scores(q, k, b * kvh, float32_out).view(num_layers, b, h, t).mul_(scaling)
    scores.masked_fill_(~visible[None, :, None, :], float("-inf"))
    return torch.softmax(scores, dim=-1)


class QueryStash:
    """Each layer's last queries of a decode step, (B, H, D) per layer, stashed by its attention call for the rows
    of all layers that come after the pass (`write_rows`). Each layer's buffer is made by its first call (an eager
    pass, never a graph's recording); once every layer has one and they share a shape, they become views of one
    (L, B, H, D) buffer, which one product over all layers reads."""

    def __init__(self, num_layers: int) -> None:
        self.layers: list[torch.Tensor | None] = [None] * num_layers
        self.scales: list[float | None] = [None] * num_layers  # each layer's scores' temperature
        self.buffer: torch.Tensor | None = None  # (L, B, H, D) once the layers share a shape

    def put(self, layer: int, query: torch.Tensor, scale: float) -> None:
        """A layer's (B, H, D) queries of this pass and its temperature."""
        if self.layers[layer] is None:
            self.layers[layer] = torch.zeros_like(query)
            made = [q for q in self.layers if q is not None]
            if len(made) == len(self.layers) and len({(q.shape, q.dtype, q.device) for q in made}) == 1:
                self.buffer = torch.stack(made)
                self.layers = [self.buffer[i] for i in range(len(made))]  # views written in place (not unbind's)
        self.layers[layer].copy_(query)
        self.scales[layer] = scale

    @property
    def one_product(self) -> bool:
        """Whether one product can serve every layer: the queries lie in one buffer and share one temperature."""
        return self.buffer is not None and len(set(self.scales)) == 1

    def write_rows(
        self,
        out: torch.Tensor,
        keys: list[torch.Tensor],
        stacked: torch.Tensor | None,
        visible: torch.Tensor,
        float32_out: bool,
    ) -> None:
        """`stacked_last_rows` of the stashed queries into `out` (L, B, H, T), a view of any layout: one product over
        `stacked` (L, B, KVH, T, D), the layers' `keys` (B, KVH, T, D) in one buffer, when the queries are in one too
        and the layers share one temperature; otherwise one product per layer."""
        if stacked is not None and self.one_product:
            out.copy_(stacked_last_rows(self.buffer, stacked, visible, self.scales[0], float32_out))
            return
        for i, (query, layer_keys) in enumerate(zip(self.layers, keys)):
            out[i].copy_(stacked_last_rows(query[None], layer_keys[None], visible, self.scales[i], float32_out)[0])


def _visible_keys(mask: torch.Tensor | None, first_query: int, num_queries: int, num_keys: int) -> int:
    """How many leading keys the queries first_query .. first_query + num_queries - 1 can see: a causal pass hides
    every key after the last query; an explicit mask (e.g. bidirectional image blocks) is read as it is.

    Args:
        mask: additive float mask (B|1, 1, Tq_chunk, Tk) of these queries, or None (causal).
        first_query: absolute key index of the chunk's first query under causality (no mask).
    """
    if mask is None:
        return min(num_keys, first_query + num_queries)
    visible = (mask > torch.finfo(mask.dtype).min).flatten(0, -2).any(dim=0)  # (Tk,)
    hits = visible.nonzero()
    return int(hits[-1]) + 1 if hits.numel() else num_keys


# Attention arguments that change the scores in ways the probability rows (and AtMan's additive bias) leave out.
UNSUPPORTED_ATTENTION_KWARGS = ("softcap", "position_bias", "s_aux", "sinks")


def check_attention_kwargs(module: torch.nn.Module, kwargs: dict, what: str) -> None:
    """Refuse an attention call whose scores use soft-capping, a position bias or sinks.

    Raises:
        UnsupportedModelError: naming the layer and `what` cannot handle it.
    """
    if any(kwargs.get(k) is not None for k in UNSUPPORTED_ATTENTION_KWARGS):
        raise UnsupportedModelError(
            f"{type(module).__name__} uses attention soft-capping, position bias or sinks, which {what} does not "
            "support yet."
        )


def _mask_rows(attention_mask: torch.Tensor | None, start: int, stop: int) -> torch.Tensor | None:
    """The additive float32 mask of query rows start..stop - 1, (B|1, 1, rows|1, Tk), or None."""
    if attention_mask is None:
        return None
    rows = attention_mask if attention_mask.shape[-2] == 1 else attention_mask[..., start:stop, :]
    return additive_mask(rows, torch.float32)  # converted per chunk: never a full (Tq, Tk) float copy


def hand_full_rows(
    consumer: FullRowConsumer,
    chunk_rows: int,
    layer_idx: int,
    query: torch.Tensor,
    key: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    first_query: int,
    device: torch.device | None = None,
) -> None:
    """Every query row of a multi-query pass of one layer to `consumer`, `chunk_rows` rows at a time, each chunk's
    (B, H, chunk, W) float32 probabilities only as wide as its queries can see (the capture's prefill rows, and the
    static decode path's).

    Args:
        query: (B, H, Tq, D); key: (B, KVH, Tk, D), unexpanded; attention_mask: the layer's mask (Tq or 1 rows) or
            None (causal); first_query: the key index of query 0; device: where the chunks go (None: where computed).
    """
    tq, tk = query.shape[2], key.shape[2]
    key = key.float()  # a no-op when the caller upcast it
    step = max(1, chunk_rows)
    for start in range(0, tq, step):
        stop = min(tq, start + step)
        chunk_mask = _mask_rows(attention_mask, start, stop)
        # Keys no query of the chunk can see have probability 0: they are left out of the chunk's rows.
        width = _visible_keys(chunk_mask, first_query + start, stop - start, tk)
        chunk_mask = None if chunk_mask is None else chunk_mask[..., :width]
        q = query[:, :, start:stop, :]  # (B, H, chunk, D)
        chunk = attention_probs(q, key[:, :, :width], chunk_mask, scaling, first_query + start)
        if device is not None:
            chunk = chunk.to(device)  # every layer's chunks on one device
        consumer(layer_idx, first_query + start, chunk)


def _make_attention_function(recorder: AttentionRecorder) -> Callable:
    def capture_attention_forward(
        module: torch.nn.Module,
        query: torch.Tensor,  # (B, H, Tq, D)
        key: torch.Tensor,  # (B, KVH, Tk, D)
        value: torch.Tensor,  # (B, KVH, Tk, D)
        attention_mask: torch.Tensor | None,
        dropout: float = 0.0,
        scaling: float | None = None,
        **kwargs,
    ) -> tuple[torch.Tensor, None]:
        check_attention_kwargs(module, kwargs, "attention capture")
        tq, d = query.shape[2], query.shape[3]
        tk = key.shape[2]
        scale = scaling if scaling is not None else d**-0.5

        # Without a mask the model relies on causality; the last query then sees every key (it is the newest).
        offset = tk - tq
        # The output is exactly the model's own SDPA call (same mask function, same arguments), so greedy decoding
        # with capture on gives the tokens of plain generation; the probabilities are computed beside it.
        out, _ = sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
        key = key.float()  # once per layer, not per chunk (a no-op for a float32 model)
        last = attention_probs(query[:, :, -1:, :], key, _mask_rows(attention_mask, tq - 1, tq), scale, tk - 1)
        recorder.rows[module.layer_idx] = last[:, :, 0, :]  # (B, H, Tk)
        if recorder.full_row_consumer is not None and tq > 1:  # prefill passes only
            hand_full_rows(
                recorder.full_row_consumer, recorder.full_row_chunk, module.layer_idx, query, key, attention_mask,
                scale, offset, recorder.device,
            )  # fmt: skip
        return out, None

    return capture_attention_forward


@contextlib.contextmanager
def capture_attention(
    model: torch.nn.Module,
    full_row_consumer: FullRowConsumer | None = None,
    full_row_chunk: int = 128,
) -> Iterator[AttentionRecorder]:
    """Record last-query attention rows of every layer while the block runs.

    Args:
        model: a transformers model whose language model uses the `AttentionInterface`.
        full_row_consumer: optional callback receiving all query rows of multi-query passes, chunk by chunk.
        full_row_chunk: query rows per chunk for the consumer.

    Yields:
        The recorder; `recorder.rows` is overwritten by every forward pass (call `clear()` between passes to detect
        layers that did not run). Rows are gathered on the device of the model's input embeddings.
    """
    recorder = AttentionRecorder(
        full_row_consumer=full_row_consumer, full_row_chunk=full_row_chunk, device=input_device(model)
    )
    try:
        with attention_function_selected(model, _NAME_PREFIX, _make_attention_function(recorder)):
            yield recorder
    finally:
        recorder.rows.clear()


_active_block: contextvars.ContextVar[object | None] = contextvars.ContextVar("explainer_attention_block", default=None)


@contextlib.contextmanager
def attention_function_selected(
    model: torch.nn.Module, prefix: str, attention: Callable, mask: Callable = sdpa_mask
) -> Iterator[str]:
    """Run the block with the language model's attention layers calling `attention` (and masks built by `mask`).

    Both are registered with transformers' `AttentionInterface` / `AttentionMaskInterface` under one name unique to
    this block (`prefix` + a counter) and selected on the language model's config only. On exit, also after an
    exception, the previous implementation is restored and both names are removed, so nothing outlives the block.

    Only forward passes of this block's own context (its thread, its request) reach `attention` and `mask`: a pass
    from anywhere else that meets the selected name gets plain SDPA, so it can neither feed this request's recorder
    nor be manipulated by it. The block holds the model's lock (`session.hold`), so within the library no other
    request runs a forward pass on the model meanwhile.

    Yields:
        The registered name.
    """
    with _counter_lock:
        name = f"{prefix}{next(_counter)}"
    owner = object()

    def guarded_attention(*args, **kwargs):
        if _active_block.get() is not owner:
            return sdpa_attention_forward(*args, **kwargs)
        return attention(*args, **kwargs)

    def guarded_mask(*args, **kwargs):
        if _active_block.get() is not owner:
            return sdpa_mask(*args, **kwargs)
        return mask(*args, **kwargs)

    config = language_config(model)
    with hold(model):
        previous = config._attn_implementation_internal
        # Mask creation only honours names in the class-wide mapping, so both go there; the name is unique here.
        ALL_ATTENTION_FUNCTIONS.register(name, guarded_attention)
        ALL_MASK_ATTENTION_FUNCTIONS.register(name, guarded_mask)
        active = _active_block.set(owner)
        try:
            config._attn_implementation_internal = name
            yield name
        finally:
            _active_block.reset(active)
            config._attn_implementation_internal = previous
            ALL_ATTENTION_FUNCTIONS._global_mapping.pop(name, None)
            ALL_MASK_ATTENTION_FUNCTIONS._global_mapping.pop(name, None)


def registered_names(prefix: str = "explainer_") -> list[str]:
    """Attention and mask function names currently registered by this package (empty outside its blocks); a
    narrower `prefix` picks one kind, e.g. "explainer_capture_" or "explainer_atman_"."""
    names = set(ALL_ATTENTION_FUNCTIONS.keys()) | set(ALL_MASK_ATTENTION_FUNCTIONS.keys())
    return sorted(n for n in names if n.startswith(prefix))


def last_query_probs(query: torch.Tensor, key: torch.Tensor, scaling: float) -> torch.Tensor:
    """(B, H, Tk) float32 attention probabilities of the last query over every key, computed exactly as the capture
    records them for a decode step (no mask: the newest query sees every key); for callers that run a decode step's
    attention themselves (the batched decode, explainer/decoding/batched/)."""
    return attention_probs(query[:, :, -1:, :], key.float(), None, scaling, key.shape[2] - 1)[:, :, 0, :]
