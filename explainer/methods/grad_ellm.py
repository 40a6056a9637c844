"""Grad-ELLM: gradient-weighted value features with loosened attention token weights.

Implements the Grad-ELLM method of the Grad-ELLM paper ("pi-Soft faithfulness", section 3.3, Eqs. 9-11, derived in
Appendix B, Eqs. 12-23). For generated token k, whose logit l_k is predicted by the query at position p = N + k - 1,
and for each of the last L decoder layers:

- channel weights (Eq. 10): w_c = dl_k / do_p[c], the gradient of the logit with respect to channel c of the layer's
  attention output at the predicting position, before the output projection (c runs over heads x head_dim, the
  channels of the value vectors);
- token weights (Appendix B, the "loosening" of Eq. 14's softmax): lambda_{h,i} = Phi(q_{h,p} . k_{h,i}), the
  query-key similarities of the predicting query min-max normalised over the keys it attends to (every earlier
  position, or the window of a sliding-window layer); keys with equal similarities all get 1;
- token attribution (Eq. 11 / 23): H_i = ReLU(sum_c w_c lambda_i v_ic), i.e. ReLU(sum_h lambda_{h,i} (w_h . v_{h,i}))
  with v_{h,i} the value vector of token i seen by head h (shared by a key-value group);

and the map is the sum of H over the L layers (section 3.3, "aggregate over the selected decoder layers"; Eq. 15
decomposes the logit into per-layer terms). The paper's final normalisation is left to consumers: the result type
z-scores each row and pi-Soft min-max normalises it, both invariant to it. Raw scores are in logit units.

`layers` (L) is searched per dataset in the paper's Appendix I over {1, 4, 8, 16, 32}; the default 8 is that search's
pick on our SQuAD rows for the embedded model, and L = 1 is the map of Appendix B ("using the last layer value v as
the feature map", as in Grad-ECLIP). L larger than the model's depth means every layer.

The gradients need the graph from the first selected layer's attention output up to the logits only: that output
is made a leaf that requires grad (parameters are frozen), so the layers below it run without autograd. One forward
and one backward pass per generated token.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from ..capture import attention_function_selected, check_attention_kwargs
from ..errors import UnsupportedModelError
from ..runtime.host import to_numpy
from ..runtime.memory import MemoryRequest, graph_bytes
from ..runtime.session import hold
from .base import AttributionMethod, GenerationRun
from .cost import Cost, CostRequest, gradient_cost
from .gradients import forward_inputs, gradients_enabled, input_embeddings, per_target_gradients, target_logits
from .steps import chosen_steps, parse_steps, steps_option

_NAME_PREFIX = "explainer_grad_ellm_"


@dataclass
class GradELLMConfig:
    layers: int = 8  # L, the last decoder layers aggregated; Appendix I's search over {1, 4, 8, 16, 32} on our SQuAD
    # data picked 8 for the embedded model (docs/results.md, "Method notes"); 1 is Appendix B's single-layer definition
    steps: str = steps_option()  # the answer steps explained (`steps.py`); the other steps' rows stay 0

    def __post_init__(self) -> None:
        if self.layers < 1:
            raise ValueError(f"layers must be at least 1, got {self.layers}")
        parse_steps(self.steps)


@dataclass
class _Layer:
    """What one selected layer's attention call keeps.

    Attributes:
        query: (H, K, D) queries at the K predicting positions (after RoPE).
        key: (KVH, T, D) keys (after RoPE).
        value: (KVH, T, D) values.
        visible: (K, T) bool, the keys each predicting query attends to.
        output: (1, T, H, D) the attention output before the output projection, in the graph.
    """

    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    visible: torch.Tensor
    output: torch.Tensor


@dataclass
class _State:
    first_layer: int
    positions: torch.Tensor  # (K,) the predicting positions
    layers: dict[int, _Layer] = field(default_factory=dict)


def _visible_keys(mask: torch.Tensor | None, positions: torch.Tensor, num_keys: int) -> torch.Tensor:
    """(K, T) bool: which keys the queries at `positions` attend to, from the mask the layer received."""
    if mask is None:  # transformers skips the mask when plain causality is enough
        return torch.arange(num_keys, device=positions.device)[None, :] <= positions[:, None]
    rows = mask[0, 0, positions.to(mask.device)]  # (K, T)
    if rows.dtype == torch.bool:
        return rows
    return rows > torch.finfo(rows.dtype).min / 2  # additive float mask: 0 attend, very negative not


def _make_attention_function(state: _State):
    def grad_ellm_attention(
        module: torch.nn.Module,
        query: torch.Tensor,  # (1, H, T, D)
        key: torch.Tensor,  # (1, KVH, T, D)
        value: torch.Tensor,  # (1, KVH, T, D)
        attention_mask: torch.Tensor | None,
        dropout: float = 0.0,
        scaling: float | None = None,
        **kwargs,
    ) -> tuple[torch.Tensor, None]:
        check_attention_kwargs(module, kwargs, "Grad-ELLM")
        out, _ = sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )  # (1, T, H, D)
        layer = module.layer_idx
        if layer < state.first_layer:
            return out, None
        if layer == state.first_layer:
            out = out.detach().requires_grad_(True)  # the graph starts here
        positions = state.positions.to(query.device)
        state.layers[layer] = _Layer(
            query=query.detach()[0, :, positions],
            key=key[0].detach(),
            value=value[0].detach(),
            visible=_visible_keys(attention_mask, positions, key.shape[2]),
            output=out,
        )
        return out, None

    return grad_ellm_attention


def layer_attribution(layer: _Layer, weights: torch.Tensor) -> torch.Tensor:
    """Eq. 11 for one layer and every predicting query.

    Args:
        layer: the layer's recorded attention inputs.
        weights: (K, H, D) channel weights w, the gradients at the predicting positions.

    Returns:
        (K, T) float32 H_i of every key position.
    """
    heads, kv_heads = layer.query.shape[0], layer.key.shape[0]
    key = layer.key.float().repeat_interleave(heads // kv_heads, dim=0)  # (H, T, D)
    value = layer.value.float().repeat_interleave(heads // kv_heads, dim=0)  # (H, T, D)
    sims = torch.einsum("hkd,htd->kht", layer.query.float(), key)  # (K, H, T)
    visible = layer.visible[:, None, :]  # (K, 1, T)
    low = sims.masked_fill(~visible, float("inf")).amin(-1, keepdim=True)  # (K, H, 1)
    high = sims.masked_fill(~visible, float("-inf")).amax(-1, keepdim=True)  # (K, H, 1)
    span = high - low
    lam = torch.where(span > 0, (sims - low) / span.clamp_min(torch.finfo(sims.dtype).tiny), 1.0)  # (K, H, T)
    lam = lam.masked_fill(~visible, 0.0)
    channel = torch.einsum("htd,khd->kht", value, weights.float())  # (K, H, T): w_h . v_{h,i}
    return torch.relu((lam * channel).sum(1))  # (K, T)


def grad_ellm_scores(run: GenerationRun, layers: int = 1, steps: str = "") -> tuple[np.ndarray, int]:
    """Grad-ELLM map of a finished generation (text or image prompts).

    Args:
        run: the finished generation.
        layers: L, the number of last decoder layers aggregated (capped at the model's depth).
        steps: the answer steps explained (`steps.parse_steps`); the other rows stay 0. "": every step.

    Returns:
        (K, N) float32 scores, and the number of layers actually aggregated.

    Raises:
        UnsupportedModelError: the model's attention layers do not use transformers' AttentionInterface.
    """
    model, n, k_total = run.model, run.num_prompt_tokens, run.num_steps
    num_layers = model.config.get_text_config().num_hidden_layers
    used = min(layers, num_layers)
    if k_total <= 0:
        return np.zeros((0, n), dtype=np.float32), used
    with hold(model), gradients_enabled(model):
        # created here, not under the caller's inference mode: an inference tensor cannot take part in autograd
        positions = torch.arange(n - 1, n - 1 + k_total, device=run.input_ids.device)  # (K,)
        state = _State(first_layer=num_layers - used, positions=positions)
        inputs = forward_inputs(run, input_embeddings(run, requires_grad=False))  # (1, T - 1, d): image features too
        with attention_function_selected(model, _NAME_PREFIX, _make_attention_function(state)):
            out = model(**inputs, use_cache=False, logits_to_keep=k_total)  # logits (1, K, V)
        if sorted(state.layers) != list(range(state.first_layer, num_layers)):
            raise UnsupportedModelError(
                f"Grad-ELLM saw attention calls of layers {sorted(state.layers)} in {type(model).__name__}, not the "
                f"last {used}: its attention layers do not all use transformers' AttentionInterface."
            )
        logits = target_logits(out.logits, run)  # (K,)
        del out
        selected = [state.layers[i] for i in range(state.first_layer, num_layers)]
        weights = []  # each (K, H, D) float32, on its layer's device
        for s in selected:
            weights.append(s.query.new_zeros(k_total, s.query.shape[0], s.query.shape[2], dtype=torch.float32))
        chosen = chosen_steps(steps, k_total)
        for k, grads in per_target_gradients(logits, [s.output for s in selected], run.progress, "Grad-ELLM", chosen):
            p = n - 1 + k
            for w, g in zip(weights, grads):
                w[k] = g[0, p].to(w)  # (H, D)
        scores = sum(layer_attribution(s, w).to(run.input_ids.device) for s, w in zip(selected, weights))  # (K, T)
    return to_numpy(scores[:, :n], np.float32), used


class GradELLM(AttributionMethod):
    name = "grad_ellm"
    display_name = "Grad-ELLM"
    streaming = False
    contrastive = True  # explains l_A - l_B at contrasted steps (`gradients.target_logits`)
    explains_images = True  # image tokens: the attention to the merged patch features in the last layers
    Config = GradELLMConfig

    @classmethod
    def cost(cls, request: CostRequest, config: GradELLMConfig) -> Cost:
        layers = config.layers if request.num_layers is None else min(config.layers, request.num_layers)
        return gradient_cost(request, backward_layers=layers, steps=config.steps)  # the last `layers` layers only

    @classmethod
    def memory(cls, request: MemoryRequest, config: GradELLMConfig) -> int:
        return graph_bytes(request, config.layers)  # a forward graph over T - 1 positions from the last layers

    def explain(self, run: GenerationRun) -> np.ndarray:
        scores, self.layers_used = grad_ellm_scores(run, self.config.layers, self.config.steps)
        return scores

    def meta(self) -> dict:
        return {**self.options(), "layers_used": getattr(self, "layers_used", None)}
