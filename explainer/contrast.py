"""Contrastive targets: "why did the model write A rather than B at step k?"

For a contrasted step k with answer token A and a foil B, the perturbation and gradient methods explain the logit
difference instead of A's logit (inseq's contrastive attribution; Yin & Neubig, 2022, "Interpreting Language Models
with Contrastive Explanations"):

- gradient methods (Input x Gradient, Grad-ELLM, AttnLRP) differentiate l_A - l_B at the position that predicts k;
- AtMan scores the change of CE_A - CE_B = -log p(A) + log p(B) = l_B - l_A when a token is suppressed (the
  log-softmax normaliser cancels), i.e. AtMan's loss difference for A against B.

Both are linear in the target, so a contrastive row equals A's row minus B's row (the tests check this). Attention
methods (MACS, Rollout) and random do not depend on the target, so they cannot be contrastive: the result lists them
and the views say so at a contrasted step instead of showing their (target-independent) map.

Steps are 0-based here and in the Python API (`explain(..., contrast={k: foil})`); the CLI and the app count from 1.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .errors import InputError

TOP_ALTERNATIVES = 5  # alternatives kept per step (the model's most probable tokens), offered as foils


def foil_id(bundle: Any, foil: str | int, alternatives: list[dict] | None = None) -> int:
    """The token id of a foil (a non-negative id or a non-empty text, as `ExplainRequest` checked): an id as it is,
    or a text that is one of the step's alternatives (as shown) or tokenises to exactly one token.

    Raises:
        InputError: not a single token of the vocabulary.
    """
    vocab = bundle.model.get_input_embeddings().num_embeddings
    if isinstance(foil, int):
        if not 0 <= foil < vocab:
            raise InputError(f"Foil id {foil} is outside the vocabulary (0 to {vocab - 1}).")
        return foil
    for alt in alternatives or []:
        if alt["token"] == foil:
            return int(alt["id"])
    ids = bundle.tokenizer.encode(foil, add_special_tokens=False)
    if len(ids) != 1:
        shown = ", ".join(repr(t) for t in bundle.readable(ids))
        raise InputError(
            f"The foil {foil!r} is {len(ids)} tokens ({shown}); a foil must be one token. Pick one of the step's "
            "alternatives, or type a single token (a leading space is part of many tokens)."
        )
    return int(ids[0])


def alternatives_record(bundle: Any, alternatives: list[tuple[int, float]]) -> list[dict[str, Any]]:
    """A step's most probable tokens as the result keeps them (`meta["alternatives"][step]`): id, readable token, p."""
    tokens = bundle.readable([i for i, _ in alternatives])
    return [{"id": i, "token": t, "p": q} for (i, q), t in zip(alternatives, tokens)]


def resolve_contrast(
    bundle: Any, attr: Any, contrast: Mapping[int, str | int] | None, methods: list | None = None
) -> dict[int, int]:
    """{0-based step: foil id} for a finished generation, checked against its answer (the request checked the rest:
    `ExplainRequest.contrast`); with contrast, records it in `attr.meta["contrast"]` (`contrast_meta`), naming those
    of `methods` that cannot be contrastive.

    Raises:
        InputError: a step past the answer (which ended before `max_new_tokens`), or a foil that is not one token of
            the vocabulary or equals the step's own token.
    """
    if not contrast:
        return {}
    alternatives = attr.meta.get("alternatives") or []
    out = {}
    for step, foil in contrast.items():
        if step >= attr.num_steps:
            raise InputError(
                f"Contrast step {step!r} is not a step of the answer (steps 1 to {attr.num_steps}; 0-based in Python)."
            )
        fid = foil_id(bundle, foil, alternatives[step] if step < len(alternatives) else None)
        if fid == attr.generated_token_ids[step]:
            raise InputError(
                f"The foil at step {step + 1} is the answer's own token {attr.generated_tokens[step]!r}; pick another."
            )
        out[step] = fid
    attr.meta["contrast"] = contrast_meta(bundle, attr, out, [m.name for m in methods or [] if not m.contrastive])
    return out


def contrast_meta(bundle: Any, attr: Any, foils: dict[int, int], not_contrastive: list[str]) -> dict[str, Any]:
    """What the result's `meta["contrast"]` records: per step (1-based keys, as shown) the target and the foil, and
    the methods that cannot be contrastive."""
    steps = {
        str(k + 1): {
            "target_id": int(attr.generated_token_ids[k]),
            "target": attr.generated_tokens[k],
            "foil_id": int(f),
            "foil": bundle.readable([f])[0],
        }
        for k, f in sorted(foils.items())
    }
    return {"steps": steps, "not_contrastive": list(not_contrastive)}


def contrasted_steps(attr: Any) -> dict[int, dict]:
    """{0-based step: its record} of a result's contrasted steps (empty for an ordinary result)."""
    steps = (attr.meta.get("contrast") or {}).get("steps") or {}
    return {int(k) - 1: v for k, v in steps.items()}


def is_blank(attr: Any, method: str, step: int) -> bool:
    """Whether a view shows no map for `method` at `step`: a contrasted step of a method that cannot be contrastive."""
    contrast = attr.meta.get("contrast") or {}
    return method in contrast.get("not_contrastive", ()) and step in contrasted_steps(attr)


def foil_vector(foils: dict[int, int] | None, num_steps: int, device: torch.device) -> torch.Tensor | None:
    """(K,) long: the foil id at each contrasted step, -1 elsewhere; None without contrast."""
    if not foils:
        return None
    out = torch.full((num_steps,), -1, dtype=torch.long, device=device)  # (K,)
    for k, f in foils.items():
        out[k] = f
    return out


def foil_values(values: torch.Tensor, foils: torch.Tensor | None) -> torch.Tensor | None:
    """(..., K) the foil's entry of each step's distribution in `values` (..., K, V) (logits or log-probabilities),
    0 at steps without a foil; None without contrast."""
    if foils is None:
        return None
    foils = foils.to(values.device)
    idx = foils.clamp(min=0).view(*(1,) * (values.dim() - 2), -1, 1).expand(*values.shape[:-1], 1)  # (..., K, 1)
    picked = values.gather(-1, idx)[..., 0]  # (..., K)
    return torch.where(foils >= 0, picked, torch.zeros_like(picked))
