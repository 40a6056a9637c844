"""Image reliance of a finished image question (`result/reliance.py` defines what it holds): the attention knockout
that hides every image token from the answer's positions, and the step of the request that fills `attr.reliance`.

The knockout is Sources' scope "answer" (`methods/sources.py`) with the image as the one hidden unit: the queries at
positions N - 1 .. T - 2 (those that predict the answer's K tokens) get a large negative pre-softmax bias on every
image key, in every layer and head; the prompt's own queries attend as usual. Everything before position N - 1 is
then the unperturbed prompt, so its cache is computed once, and one forward of batch 2 over the K answer positions
after it gives both log-probabilities: row 0 hides nothing (the baseline), row 1 hides the image. The baseline is
recomputed in that pass rather than read from the decode loop's step probabilities: both rows then have the same
layout and kernels, so on an accelerator in bfloat16 their difference has no rounding floor (on a CPU in float32
it equals the decode loop's log-probability to ~1e-6). A cache that cannot be sliced (recurrent layers) falls back to
one full forward of batch 2 with the bias on the answer's queries only. The reference is one full eager forward
with the image's columns masked for the answer's queries (tests/explainer/test_reliance.py).

Cost: the vision tower once (the merged embeddings), the prompt's N - 1 positions once, and 2K positions.
`knockout_logprobs` is the same knockout for any number of rows, each hiding its own positions (the calibration of
`macs_calibrated` hides image regions so: `eval/calibrate.py`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from transformers import DynamicCache

from .errors import UnsupportedModelError
from .methods import AttributionMethod
from .methods.atman.method import attention_suppression
from .methods.inputs import SequenceInputs
from .methods.sources import MASK_BIAS
from .result.attribution import Attribution
from .result.reliance import Reliance, image_share, share_positions
from .result.sinks import sink_positions
from .runtime.devices import input_device
from .runtime.host import to_numpy
from .runtime.kv import prefix_cache, reusable
from .runtime.memory import language_config
from .runtime.session import check_cancelled, hold


def image_knockout(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    num_prompt_tokens: int,
    hidden: Sequence[int],
    extra_inputs: dict[str, Any] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Each answer token's log-probability with the prompt as it is, and with the `hidden` positions hidden from the
    queries that predict the answer (see the module docstring).

    Args:
        model: causal LM or vision-language model whose language model uses transformers' AttentionInterface.
        input_ids: (1, N + K) prompt and answer.
        num_prompt_tokens: N >= 1.
        hidden: prompt positions hidden from the answer (the image tokens).
        extra_inputs: a forward's further inputs over all N + K positions (`GenerationRun.extra_inputs`: the
            image's `pixel_values`, `image_grid_thw` and (3, 1, N + K) `position_ids`); None for text.

    Returns:
        ((K,), (K,)) float32 log-probabilities: visible, hidden.

    Raises:
        UnsupportedModelError: the model's attention cannot be edited.
    """
    rows = np.zeros((2, num_prompt_tokens), dtype=bool)  # (2, N): row 0 hides nothing
    rows[1, list(hidden)] = True
    both = knockout_logprobs(model, input_ids, num_prompt_tokens, rows, extra_inputs, batch_size=2)
    return both[0], both[1]


@torch.inference_mode()
def knockout_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    num_prompt_tokens: int,
    hidden: np.ndarray,
    extra_inputs: dict[str, Any] | None = None,
    batch_size: int = 8,
) -> np.ndarray:
    """The answer's token log-probabilities with each row's hidden prompt positions hidden from the queries that
    predict the answer (`image_knockout`'s knockout, one row per ablation: `calibrate` hides image regions so).

    Args:
        input_ids: (1, N + K) prompt and answer; extra_inputs: as `image_knockout`'s.
        hidden: (R, N) bool, True = hidden from the answer; a row hiding nothing is the unperturbed run.
        batch_size: most rows per forward, each over the K answer positions after the prompt's shared cache.

    Returns:
        (R, K) float32 log-probabilities.

    Raises:
        UnsupportedModelError: the model's attention cannot be edited.
    """
    n, t, r = num_prompt_tokens, input_ids.shape[1], hidden.shape[0]
    k, start = t - n, n - 1  # the answer's first token is predicted at position N - 1
    if k <= 0 or r == 0:
        return np.zeros((r, max(k, 0)), np.float32)
    out = []
    with hold(model):
        seq = SequenceInputs.of(model, input_ids, extra_inputs)  # ids, or (1, T, d) embeddings and 3D positions
        bias = torch.zeros(r, t - 1, dtype=torch.float32, device=input_ids.device)  # (R, T - 1)
        bias[:, :n][torch.as_tensor(hidden, device=input_ids.device)] = MASK_BIAS
        targets = input_ids[0, n:]  # (K,)
        with attention_suppression(model) as state:
            cache = DynamicCache()  # no config: every layer keeps all positions, sliding ones included
            if start:
                model(**seq.inputs(0, start, 1), past_key_values=cache, use_cache=True,
                      logits_to_keep=1)  # fmt: skip
            for lo in range(0, r, batch_size):
                state.bias = bias[lo : lo + batch_size]  # (B, T - 1)
                b = state.bias.shape[0]
                if start and reusable(cache, start):
                    logits = model(**seq.inputs(start, t - 1, b), use_cache=True, logits_to_keep=k,
                                   past_key_values=prefix_cache(cache, start, b)).logits  # fmt: skip
                else:  # nothing to reuse: the whole sequence, the bias on the answer's queries only
                    state.from_query = start
                    logits = model(**seq.inputs(0, t - 1, b), use_cache=False, logits_to_keep=k).logits
                if state.calls == 0:
                    raise UnsupportedModelError(
                        "No attention layer of this model uses transformers' AttentionInterface, so the image cannot "
                        "be hidden from the answer: run it with reliance=False."
                    )
                logp = torch.log_softmax(logits.float(), dim=-1)  # (B, K, V)
                picked = logp.gather(-1, targets.to(logp.device).view(1, -1, 1).expand(b, -1, 1))[..., 0]  # (B, K)
                out.append(to_numpy(picked).astype(np.float32))
                check_cancelled()
    return np.concatenate(out)


def measure_reliance(
    model: torch.nn.Module, attr: Attribution, methods: Sequence[AttributionMethod], extra_inputs: dict[str, Any]
) -> Reliance:
    """The reliance of a finished image question: the knockout over the answer, each method's image share.

    Args:
        model: the model that produced `attr`.
        attr: a result with `image` and its answer; its methods' scores are read.
        methods: the instances that produced `attr.methods` (for their `raw_floor`).
        extra_inputs: the prompt's prefill inputs (`ImagePrompt.prefill_inputs`: positions over the N prompt tokens).
    """
    from .models.vision import full_sequence_inputs  # as in explain.py: image support loads on first use

    ids = torch.tensor([attr.prompt_token_ids + attr.generated_token_ids], dtype=torch.long,
                       device=input_device(model))  # (1, N + K)  # fmt: skip
    full = full_sequence_inputs(extra_inputs, attr.num_steps)
    logprob, hidden = image_knockout(model, ids, attr.num_prompt_tokens, attr.image_token_positions, full)
    image, text = share_positions(attr.image_token_positions, attr.user_positions, sink_positions(attr))
    layers = int(language_config(model).num_hidden_layers)
    floors = {m.name: m.raw_floor(attr.num_steps, layers) for m in methods if m.name in attr.methods}
    shares = {name: image_share(s.raw, image, text, floors.get(name, 0.0)) for name, s in attr.methods.items()}
    return Reliance(
        logprob=logprob, image_hidden_logprob=hidden, image_share=shares, image_positions=image, text_positions=text,
        share_floor={name: _known(f) for name, f in floors.items()},
    )  # fmt: skip


def _known(floor: np.ndarray) -> float:
    """A method's floor as one number: its value at the steps where it is known (NaN if none)."""
    known = floor[np.isfinite(floor)]
    return float(known[0]) if known.size else float("nan")


def add_reliance(
    model: torch.nn.Module,
    attr: Attribution,
    methods: Sequence[AttributionMethod],
    extra_inputs: dict[str, Any] | None,
    enabled: bool = True,
) -> Iterator[Attribution]:
    """The request's last step for an image question (`explain.stream_explain`, after every method): a snapshot that
    says it runs, then `attr.reliance` (the caller's next snapshot has it). Nothing for a text prompt, an empty
    answer, or with `enabled` False. A model whose attention cannot be edited keeps its maps:
    `meta["reliance_error"]` says why there is no reliance."""
    if not enabled or attr.image is None or extra_inputs is None or attr.num_steps == 0:
        return
    attr.meta["status"] = "measuring image reliance"
    yield attr.snapshot()
    t0 = time.perf_counter()
    try:
        attr.reliance = measure_reliance(model, attr, methods, extra_inputs)
    except UnsupportedModelError as e:  # an extra measure: the methods' maps stand without it
        attr.meta["reliance_error"] = str(e)
    attr.meta["reliance_seconds"] = time.perf_counter() - t0
