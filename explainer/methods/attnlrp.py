"""AttnLRP: attention-aware Layer-wise Relevance Propagation, for Llama and Qwen2 as transformers 5.x builds them.

Implements Achtibat et al., "AttnLRP: Attention-Aware Layer-wise Relevance Propagation for Transformers" (ICML 2024,
arXiv:2402.05602; the MACS paper's strongest baseline, its Table 2), without the `lxt` package. The relevance of
prompt token i for generated token k is gradient x input at the input embeddings, summed over the hidden dimension,
computed with one backward pass whose local Jacobians are replaced so that each product of "input x gradient" is the
LRP relevance of that input (the Gradient x Input formulation of LRP, as in the authors' efficient implementation):

- linear layers, residual additions, RoPE: epsilon-LRP (AttnLRP Eq. 8) with epsilon -> 0, which is plain gradient x
  input; biases (Qwen2's q/k/v projections) keep their share.
- RMSNorm: the identity rule through the normalisation (Proposition 3.4 with Eq. 9): 1/rms(x) is a constant in the
  backward pass, so the relevance passes the normalisation unchanged.
- SiLU of the gated MLP: the identity rule (Eq. 9), R_in = R_out, i.e. the backward multiplies by silu(x)/x.
- the gated MLP's product act(gate) * up: the uniform rule (Proposition 3.2, Eq. 7), each factor gets half.
- softmax: the softmax rule (Proposition 3.1, a Taylor decomposition at x with bias), R_in = x * (R_out - s * sum
  R_out). Written as a gradient this is exactly softmax's own Jacobian, so SDPA's backward is kept. The bias
  (s - J x) keeps its relevance, which is why the relevance is only approximately conserved.
- the matmuls Q K^T and A V: epsilon-LRP followed by the uniform rule (Proposition 3.3), each factor gets half.
  Everything between them (scaling, mask, softmax) is linear in the backward signal, so halving the gradient of A
  and then of Q K^T equals scaling the gradients at the attention inputs: 1/4 at q and k, 1/2 at v.

The rules hold for one call only (`lrp_rules`): the attention rule is an attention function registered and selected
through transformers' AttentionInterface (`capture.attention_function_selected`), the RMSNorm and MLP rules are forward
hooks; everything is removed in `finally` and only acts in the calling context. Per-architecture facts (norm and MLP
classes, attribute names) live in `ARCHITECTURES`; other model families are refused with `UnsupportedModelError`.

Conservation: the relevance summed over every input position (prompt and earlier generated tokens) approximates the
explained logit; see `tests/explainer/methods/test_gradient_methods.py` for the measured ratio on tiny random Llama and
Qwen2 models.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm
from transformers.models.qwen2.modeling_qwen2 import Qwen2MLP, Qwen2RMSNorm
from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as qwen2_5_vl
from transformers.models.qwen2_vl import modeling_qwen2_vl as qwen2_vl

from ..capture import attention_function_selected, check_attention_kwargs
from ..errors import UnsupportedModelError
from ..runtime.devices import parameter_value
from ..runtime.host import to_numpy
from ..runtime.memory import MemoryRequest, graph_bytes
from ..runtime.session import hold
from .base import AttributionMethod, GenerationRun
from .cost import Cost, CostRequest, gradient_cost
from .gradients import gradients_enabled
from .input_x_gradient import gradient_x_input
from .steps import parse_steps, steps_option

_NAME_PREFIX = "explainer_attnlrp_"


# --- the rules, as functions with modified gradients ---------------------------------------------------------------


class _ScaleGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, factor: float) -> torch.Tensor:
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad * ctx.factor, None


def scale_gradient(x: torch.Tensor, factor: float) -> torch.Tensor:
    """Identity in the forward pass; the backward pass multiplies the gradient by `factor`.

    Applied to the output of a product of two factors with `factor = 0.5`, it is the uniform rule: each factor
    receives half of the product's relevance.
    """
    return _ScaleGradient.apply(x, factor)


class _IdentityRule(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(torch.where(x == 0, torch.zeros_like(y), y / x))  # f(x) / x
        return y.view_as(y)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (ratio,) = ctx.saved_tensors
        return grad * ratio, None


def identity_rule(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The identity rule (Eq. 9) for an elementwise function y = f(x): returns y; the backward pass multiplies the
    gradient by f(x)/x, so that x * grad_x = y * grad_y (relevance passes unchanged). Entries with x = 0 pass nothing.
    """
    return _IdentityRule.apply(x, y.detach())


def rms_norm_identity(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm `weight * x / rms(x)` (the Llama/Qwen2 computation, float32 inside) with 1/rms(x) held constant in the
    backward pass: the identity rule through the normalisation (Proposition 3.4)."""
    dtype = x.dtype
    h = x.float()
    inv_rms = torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps).detach()  # (..., 1)
    return weight * (h * inv_rms).to(dtype)


def lrp_attention(
    module: torch.nn.Module,
    query: torch.Tensor,  # (B, H, Tq, D)
    key: torch.Tensor,  # (B, KVH, Tk, D)
    value: torch.Tensor,  # (B, KVH, Tk, D)
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """SDPA whose backward pass applies the uniform rule to both matmuls and the softmax rule to the softmax."""
    check_attention_kwargs(module, kwargs, "AttnLRP")
    query = scale_gradient(query, 0.25)  # half at Q K^T, after half at A V
    key = scale_gradient(key, 0.25)
    value = scale_gradient(value, 0.5)  # half at A V
    out, _ = sdpa_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=scaling, **kwargs)
    return out, None  # (B, Tq, H, D)


# --- where the rules go, per architecture --------------------------------------------------------------------------


@dataclass(frozen=True)
class Architecture:
    """Where the non-attention rules apply in one model family.

    Attributes:
        norm: the RMSNorm class (identity rule through 1/rms).
        norm_eps: its epsilon attribute.
        mlp: the gated MLP class, `down(act(gate(x)) * up(x))`.
        activation: the MLP's activation submodule (identity rule).
        product_into: the MLP's submodule whose input is the gated product (uniform rule).
    """

    norm: type[torch.nn.Module]
    norm_eps: str
    mlp: type[torch.nn.Module]
    activation: str = "act_fn"
    product_into: str = "down_proj"


ARCHITECTURES: dict[str, Architecture] = {
    "llama": Architecture(norm=LlamaRMSNorm, norm_eps="variance_epsilon", mlp=LlamaMLP),
    "qwen2": Architecture(norm=Qwen2RMSNorm, norm_eps="variance_epsilon", mlp=Qwen2MLP),
    # vision-language models: the rules cover the language model (its decoder); the input layer is the decoder's
    # input embeddings, the vision tower's merged patch features included, and the vision tower is not propagated
    # (each module defines its own text MLP class, named Qwen2MLP)
    "qwen2_vl": Architecture(norm=qwen2_vl.Qwen2VLRMSNorm, norm_eps="variance_epsilon", mlp=qwen2_vl.Qwen2MLP),
    "qwen2_5_vl": Architecture(norm=qwen2_5_vl.Qwen2_5_VLRMSNorm, norm_eps="variance_epsilon", mlp=qwen2_5_vl.Qwen2MLP),
}


def architecture_of(model: torch.nn.Module) -> Architecture:
    """The rules' placement for `model`.

    Raises:
        UnsupportedModelError: the model family has no AttnLRP rules here.
    """
    model_type = getattr(model.config, "model_type", None)
    if model_type not in ARCHITECTURES:
        raise UnsupportedModelError(
            f"AttnLRP has rules for the {', '.join(ARCHITECTURES)} model families only, not {type(model).__name__} "
            f"({model_type!r}); choose another method for this model."
        )
    return ARCHITECTURES[model_type]


_active_rules: contextvars.ContextVar[object | None] = contextvars.ContextVar("explainer_attnlrp_rules", default=None)


@dataclass
class _Calls:
    attention: int = 0


@contextlib.contextmanager
def lrp_rules(model: torch.nn.Module) -> Iterator[_Calls]:
    """Run the block with AttnLRP's backward rules in place on `model` (the forward pass is unchanged).

    On exit, also after an exception, every hook is removed and the attention implementation is restored. Forward
    passes from other contexts see the plain model.

    Yields:
        A counter of the attention calls that went through the rules (0 after a forward means none did).

    Raises:
        UnsupportedModelError: the model family has no rules here, or its layers are not where the rules expect them.
    """
    arch = architecture_of(model)
    num_layers = model.config.get_text_config().num_hidden_layers
    decoder = model.get_decoder()  # the language model only: a vision tower's norms and MLPs keep plain gradients
    norms = [m for m in decoder.modules() if isinstance(m, arch.norm)]
    mlps = [m for m in decoder.modules() if isinstance(m, arch.mlp)]
    if len(norms) != 2 * num_layers + 1 or len(mlps) != num_layers:
        raise UnsupportedModelError(
            f"AttnLRP expected {2 * num_layers + 1} {arch.norm.__name__} and {num_layers} {arch.mlp.__name__} modules "
            f"in {type(model).__name__}, found {len(norms)} and {len(mlps)}."
        )
    owner = object()
    calls = _Calls()

    def mine() -> bool:
        return _active_rules.get() is owner

    def norm_hook(module, args, output):
        if not mine():
            return None
        # Forward hooks run after accelerate's offload hook has put an offloaded weight back on `meta`.
        weight = parameter_value(module, "weight").to(output.device)
        return rms_norm_identity(args[0].to(output.device), weight, getattr(module, arch.norm_eps))

    def activation_hook(module, args, output):
        return identity_rule(args[0], output) if mine() else None

    def product_hook(module, args):
        return (scale_gradient(args[0], 0.5), *args[1:]) if mine() else None

    def attention(*args, **kwargs):
        calls.attention += 1
        return lrp_attention(*args, **kwargs)

    handles = []
    active = _active_rules.set(owner)
    try:
        for norm in norms:
            handles.append(norm.register_forward_hook(norm_hook))
        for mlp in mlps:
            handles.append(getattr(mlp, arch.activation).register_forward_hook(activation_hook))
            handles.append(getattr(mlp, arch.product_into).register_forward_pre_hook(product_hook))
        with attention_function_selected(model, _NAME_PREFIX, attention):
            yield calls
    finally:
        for handle in handles:
            handle.remove()
        _active_rules.reset(active)


def attnlrp_relevance(run: GenerationRun, steps: str = "") -> tuple[torch.Tensor, torch.Tensor]:
    """AttnLRP relevance of every input position for every generated token.

    Args:
        run: the finished generation (an image prompt: the merged patch features are the input layer).
        steps: the answer steps explained (`steps.parse_steps`); the other rows stay 0. "": every step.

    Returns:
        (K, N + K - 1) float32 relevance at every position of the teacher-forced sequence (zero after the position
        that predicts token k), and (K,) float32 the explained logits, which the rows approximately sum to.

    Raises:
        UnsupportedModelError: the model family has no AttnLRP rules, or its attention bypasses the rules.
    """
    model = run.model
    with hold(model), gradients_enabled(model), lrp_rules(model) as calls:
        relevance, logits = gradient_x_input(run, "AttnLRP", steps=steps)
        if calls.attention == 0:
            raise UnsupportedModelError(
                f"{type(model).__name__}'s attention layers do not use transformers' AttentionInterface, so AttnLRP "
                "cannot apply its attention rules."
            )
    return relevance, logits


@dataclass
class AttnLRPConfig:
    """The rules for Llama and Qwen2 are fixed by the paper (epsilon -> 0); the one option is which steps to explain."""

    steps: str = steps_option()  # the answer steps explained (`steps.py`); the other steps' rows stay 0

    def __post_init__(self) -> None:
        parse_steps(self.steps)


class AttnLRP(AttributionMethod):
    name = "attnlrp"
    display_name = "AttnLRP"
    streaming = False
    contrastive = True  # explains l_A - l_B at contrasted steps (`gradients.target_logits`)
    explains_images = True  # image tokens: relevance of the merged patch features (the rules stop at the decoder)
    Config = AttnLRPConfig

    @classmethod
    def cost(cls, request: CostRequest, config: AttnLRPConfig) -> Cost:
        return gradient_cost(request, steps=config.steps)

    @classmethod
    def memory(cls, request: MemoryRequest, config: AttnLRPConfig) -> int:
        return graph_bytes(request)  # one forward graph over T - 1 positions

    def explain(self, run: GenerationRun) -> np.ndarray:
        architecture_of(run.model)  # refuse before any work
        if run.num_steps <= 0:
            return np.zeros((0, run.num_prompt_tokens), dtype=np.float32)
        relevance, _ = attnlrp_relevance(run, self.config.steps)  # (K, T - 1)
        return to_numpy(relevance[:, : run.num_prompt_tokens])  # (K, N)
