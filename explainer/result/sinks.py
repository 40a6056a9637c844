"""Attention sinks: prompt tokens that take a large share of attention whatever the query.

A sink draws attention that carries little content: the first token of most LLMs ("Efficient Streaming Language
Models with Attention Sinks", Xiao et al., ICLR 2024), tokens with massive hidden-state norms ("Massive Activations in
Large Language Models", Sun et al., COLM 2024), and in vision-language models a few image tokens, often at the
border or a corner ("See What You Are Told: Visual Attention Sink in Large Multimodal Models", Kang et al., ICLR
2025). In a map z-scored per step a sink takes the top of the colour scale and flattens everything else; the views
can leave the sinks out (`leave_out_sinks`).

What detection uses, gathered during generation with no extra forward pass and no host read per step
(`SinkTracker`):

- share: at every step the attention row of the query that predicts the token (the rows the capture records for the
  streaming methods), averaged over the full-attention layers and their heads, is summed on the device. Sliding-
  window layers are left out when the model has full ones: they see only the newest tokens, so what they attend to
  says where the window is, not which tokens are sinks. A prompt token's share is its mean
  fraction of that attention over steps, layers and heads (the shares of the N prompt tokens sum to at most 1; the
  answer's own tokens take the rest).
- norm: at the prefill, the L2 norm of every prompt position's hidden state entering the middle decoder layer (one
  forward pre-hook on that layer, removed when the pass ends).

Both are read from the device once, when generation ends. The rule (`detect_sinks`, thresholds in `SinkConfig`): a
token is a sink when

- its mean share is a robust outlier (above the median + c x 1.4826 x MAD over the prompt's tokens) and, at every
  step (whatever the query), its share is at least `min_share_ratio` times the uniform share 1/N; or
- its hidden-state norm is a robust outlier and at least `min_norm_ratio` times the median norm.

The outlier test finds what stands out; the ratio keeps a prompt whose attention is merely uneven from having sinks
(on the tiny random test models, ordinary tokens reach robust z-scores of 8 but never 5x the uniform share at every
step). The record (`Attribution.meta["sinks"]`, so in the JSON) lists each sink with its evidence.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..runtime.host import to_numpy
from ..runtime.memory import language_config
from .attribution import Attribution, zscore

MAD_TO_STD = 1.4826  # MAD x this estimates the standard deviation of normally distributed values


@dataclass(frozen=True)
class SinkConfig:
    mad_factor: float = 6.0  # robust standard deviations above the median: ~1e-9 of normal values pass
    min_share_ratio: float = 5.0  # a share sink takes >= 5x the uniform share 1/N of the attention at every step
    min_norm_ratio: float = 5.0  # a norm sink's hidden state is >= 5x the median norm (massive activations are
    # 100-1000x, Sun et al. 2024; ordinary tokens stay within ~2x)


def _robust_outliers(values: np.ndarray, mad_factor: float) -> np.ndarray:
    """(N,) bool: values above median + mad_factor x 1.4826 x MAD (any value above the median when MAD is 0)."""
    median = np.median(values)
    mad = np.median(np.abs(values - median))
    return values > median + mad_factor * MAD_TO_STD * mad


def detect_sinks(
    share: np.ndarray,
    norms: np.ndarray | None = None,
    config: SinkConfig | None = None,
    min_share: np.ndarray | None = None,
) -> list[dict[str, Any]]:
    """The sinks of a prompt from its tokens' attention shares and (optionally) hidden-state norms.

    Args:
        share: (N,) each prompt token's mean share of the predicting query's attention (over steps, layers, heads).
        norms: (N,) hidden-state norms at the prefill, or None.
        config: thresholds (default `SinkConfig()`).
        min_share: (N,) each token's smallest share of any one step; None: `share` (one step).

    Returns:
        One dict per sink, in prompt order: `position`, `share`, `min_share`, `share_ratio` (share / median share),
        `norm_ratio` (norm / median norm, None without norms) and `by`, the evidence that made it one ("share",
        "norm" or both). Ratios against a median of 0 are None.
    """
    cfg = config or SinkConfig()
    share = np.asarray(share, dtype=np.float32)  # (N,)
    low = share if min_share is None else np.asarray(min_share, dtype=np.float32)  # (N,)
    n = share.shape[0]
    if n < 2 or not (np.isfinite(share).all() and np.isfinite(low).all()):
        return []
    by_share = _robust_outliers(share, cfg.mad_factor) & (low >= cfg.min_share_ratio / n)
    by_norm = np.zeros(n, dtype=bool)
    norm_ratio = None
    if norms is not None and np.isfinite(norms).all() and np.median(norms) > 0:
        norms = np.asarray(norms, dtype=np.float32)  # (N,)
        norm_ratio = norms / np.median(norms)  # (N,)
        by_norm = _robust_outliers(norms, cfg.mad_factor) & (norm_ratio >= cfg.min_norm_ratio)
    median_share = float(np.median(share))
    sinks = []
    for j in np.flatnonzero(by_share | by_norm).tolist():
        sinks.append(
            {
                "position": int(j),
                "share": float(share[j]),
                "min_share": float(low[j]),
                "share_ratio": float(share[j] / median_share) if median_share > 0 else None,
                "norm_ratio": float(norm_ratio[j]) if norm_ratio is not None else None,
                "by": [name for name, hit in (("share", by_share[j]), ("norm", by_norm[j])) if hit],
            }
        )
    return sinks


class SinkTracker:
    """What sink detection needs, gathered on the device during generation (see the module docstring).

    `add` takes each step's captured rows; `probing_norms` wraps the prefill pass; `record` reads both once.
    """

    def __init__(self, num_prompt_tokens: int, model: torch.nn.Module, config: SinkConfig | None = None) -> None:
        self.n = num_prompt_tokens
        self.config = config or SinkConfig()
        self.layers = full_attention_layers(model)  # rows of these layers count (None: all)
        self._index: torch.Tensor | None = None  # (L_full,) int64 on the rows' device, made at the first step
        self.share_sum: torch.Tensor | None = None  # (N,) float32 on the rows' device, summed over steps
        self.share_min: torch.Tensor | None = None  # (N,) float32, the smallest share of any step
        self.steps = 0
        self.norms: torch.Tensor | None = None  # (N,) float32 on the probed layer's device
        self.norm_layer: int | None = None

    def share(self, rows: torch.Tensor) -> torch.Tensor:
        """(N,) float32 a step's share of each prompt position: the mean over the counted layers and the heads of its
        captured attention rows (L, H, T), T >= N (no host read)."""
        if self.layers is not None:
            if self._index is None:
                self._index = torch.tensor(self.layers, dtype=torch.long, device=rows.device)  # (L_full,)
            rows = rows.index_select(0, self._index)  # (L_full, H, T)
        return rows[..., : self.n].float().mean(dim=(0, 1))  # (N,)

    def add(self, rows: torch.Tensor) -> None:
        """One step's captured attention rows (L, H, T), T >= N: adds their `share` (no host read)."""
        share = self.share(rows)  # (N,)
        self.share_sum = share if self.share_sum is None else self.share_sum + share
        self.share_min = share if self.share_min is None else torch.minimum(self.share_min, share)
        self.steps += 1

    def gather(
        self, rows: torch.Tensor, share_sum: torch.Tensor, share_min: torch.Tensor, alive: torch.Tensor | None = None
    ) -> None:
        """A decode step's `share` of its rows (L, H, T) added to `share_sum` and folded into `share_min`, (N,) device
        buffers (zeros and +inf at first), in place: fixed-shape device work, no host read. `alive`: (1,) bool, False
        for a step after an end-of-sequence token, which then leaves both as they are. `add_totals` hands them over."""
        share = self.share(rows)  # (N,)
        if alive is None:
            share_sum.add_(share)
            torch.minimum(share_min, share, out=share_min)
            return
        share_sum.add_(share * alive)
        share_min.copy_(torch.where(alive, torch.minimum(share_min, share), share_min))

    def add_totals(self, share_sum: torch.Tensor, share_min: torch.Tensor, steps: int) -> None:
        """`steps` more steps whose (N,) summed and smallest shares were gathered elsewhere on the device (the static
        decode path accumulates them inside its fixed-shape step, `explainer/decoding/static.py`); no host read."""
        if steps == 0:
            return
        self.share_sum = share_sum if self.share_sum is None else self.share_sum + share_sum
        self.share_min = share_min if self.share_min is None else torch.minimum(self.share_min, share_min)
        self.steps += steps

    def take_prefill(self, source: SinkTracker) -> None:
        """What `source` gathered in a prefill pass over the same prompt (its norms and its first step's shares), as
        this tracker's own: the batched decode's rows with one prompt share that pass (`decoding/batched/row.py`)."""
        if self.n != source.n or self.steps:
            raise ValueError("take_prefill needs a fresh tracker of the same prompt")
        self.norms, self.norm_layer, self.steps = source.norms, source.norm_layer, source.steps
        self.share_sum, self.share_min, self._index = source.share_sum, source.share_min, source._index

    @contextlib.contextmanager
    def probing_norms(self, model: torch.nn.Module) -> Iterator[None]:
        """Within the block, a forward pass of `model` over the prompt records the hidden-state norms entering its
        middle decoder layer (a forward pre-hook, removed on exit, also after an exception). A model whose decoder
        layers cannot be found is left alone: detection then uses the shares only."""
        layers = getattr(model.get_decoder(), "layers", None) if hasattr(model, "get_decoder") else None
        if not layers:
            yield
            return
        index = len(layers) // 2

        def hook(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
            hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]  # (B, T, D)
            if hidden.shape[1] == self.n:  # the prefill over the whole prompt
                self.norms = torch.linalg.vector_norm(hidden[0].float(), dim=-1)  # (N,) float32
                self.norm_layer = index

        handle = layers[index].register_forward_pre_hook(hook, with_kwargs=True)
        try:
            yield
        finally:
            handle.remove()

    def record(self) -> dict[str, Any] | None:
        """The sinks found and how (for `Attribution.meta["sinks"]`), reading the device once per quantity; None when
        no step was added (no attention was captured)."""
        if self.share_sum is None or self.steps == 0:
            return None
        share = to_numpy(self.share_sum / self.steps, np.float32)  # (N,)
        low = to_numpy(self.share_min, np.float32)  # (N,)
        norms = None if self.norms is None else to_numpy(self.norms, np.float32)  # (N,)
        sinks = detect_sinks(share, norms, self.config, low)
        return {
            "positions": [s["position"] for s in sinks],
            "evidence": sinks,
            "steps": self.steps,
            "norm_layer": self.norm_layer,
            "rule": dataclasses.asdict(self.config),
        }


def full_attention_layers(model: torch.nn.Module) -> list[int] | None:
    """Indices of the language model's full-attention layers when its config mixes them with sliding-window ones
    (`layer_types`); None when every layer counts (no `layer_types`, or no full-attention layer at all)."""
    types = getattr(language_config(model), "layer_types", None)
    if not types or "full_attention" not in types or all(t == "full_attention" for t in types):
        return None
    return [i for i, t in enumerate(types) if t == "full_attention"]


def sink_positions(attr: Attribution) -> list[int]:
    """The prompt positions of the result's sinks (`meta["sinks"]["positions"]`); empty for results without them
    (saved before detection existed, or no attention was captured) or with a malformed record."""
    record = attr.meta.get("sinks") if isinstance(attr.meta, dict) else None
    positions = record.get("positions") if isinstance(record, dict) else None
    if not isinstance(positions, list):
        return []
    n = attr.num_prompt_tokens
    return sorted(
        {int(p) for p in positions if isinstance(p, int | np.integer) and not isinstance(p, bool) and 0 <= p < n}
    )


def scored_positions(
    attr: Attribution, shown: np.ndarray, subset: bool, hide_sinks: bool
) -> tuple[np.ndarray | None, list[int]]:
    """What a view of the `shown` positions z-scores over, and the sinks among them it leaves out.

    Args:
        attr: the result (its sinks, `sink_positions`).
        shown: (n,) the positions the view shows (`spans.shown_positions`).
        subset: whether `shown` is a subset (the user's text), re-standardised over.
        hide_sinks: leave the sinks among `shown` out.

    Returns:
        (positions to re-standardise each step over, or None for the stored z over all N; the sinks left out).
    """
    inside = set(np.asarray(shown).tolist())
    left_out = [p for p in sink_positions(attr) if p in inside] if hide_sinks else []
    if left_out:
        return shown[~np.isin(shown, left_out)], left_out
    return (shown if subset else None), []


def leave_out_sinks(
    raw: np.ndarray, sinks: Sequence[int], positions: np.ndarray | Sequence[int] | None = None
) -> np.ndarray:
    """Per-step z-scores with the sinks left out: they neither count in a step's mean and spread nor get a score,
    so they leave the colour scale too (views draw them apart, e.g. hatched).

    Args:
        raw: (K, N) scores.
        sinks: prompt positions of the sinks.
        positions: columns the z-scores are over (e.g. the user's tokens); None means all N.

    Returns:
        (K, N) float32: z-scores over `positions` less the sinks; NaN at the sinks and outside `positions`.
    """
    raw = np.asarray(raw, dtype=np.float32)  # (K, N)
    cols = np.arange(raw.shape[1]) if positions is None else np.asarray(positions, dtype=np.int64)
    return zscore(raw, cols[~np.isin(cols, np.asarray(list(sinks), dtype=np.int64))])
