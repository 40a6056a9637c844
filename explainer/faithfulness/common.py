"""What removal curves and pi-Soft share: the evaluated positions, checks, rankings and batching."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..errors import InputError
from ..models.loading import ModelBundle
from ..result.attribution import Attribution, zscore

RANDOM = "random"


def evaluated_positions(attr: Attribution, positions: Sequence[int] | None) -> np.ndarray:
    """(n,) prompt positions that may be perturbed: the given ones, else the user's text, else the whole prompt."""
    pos = np.asarray(list(positions) if positions is not None else (attr.user_positions or []), dtype=np.int64)
    if positions is None and pos.size == 0:
        pos = np.arange(attr.num_prompt_tokens)
    if pos.size == 0:
        raise InputError("No prompt positions to evaluate.")
    if pos.min() < 0 or pos.max() >= attr.num_prompt_tokens:
        raise InputError("Evaluated positions must lie inside the prompt.")
    return pos


def check_result(attr: Attribution, methods: Sequence[str], image_inputs: bool = False) -> None:
    if attr.num_steps == 0:
        raise InputError("The result has no generated tokens to evaluate.")
    if attr.image is not None and not image_inputs:
        raise InputError(
            "This result has an image: removal curves need the image's inputs (`image_inputs`), and pi-Soft is "
            "measured on text prompts only."
        )
    missing = [m for m in methods if m != RANDOM and m not in attr.methods]
    if missing:
        raise InputError(f"The result has no scores for {', '.join(missing)}; available: {', '.join(attr.methods)}.")


RANKED = ("image", "image+question")  # what an image result's removal curves rank and remove


def image_ranked_positions(attr: Attribution, ranked: str = "image") -> list[int]:
    """The prompt positions an image result's removal curves rank: its image tokens, or those and the question's.

    Raises:
        InputError: not an image result, or an unknown choice.
    """
    if attr.image is None:
        raise InputError("This result has no image; its removal curves rank the prompt's text.")
    if ranked not in RANKED:
        raise InputError(f"Unknown choice {ranked!r}; rank one of: {', '.join(RANKED)}.")
    image = attr.image_token_positions  # every image's
    return image if ranked == "image" else sorted(set(image) | set(attr.user_positions))


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


def decode(bundle: ModelBundle, ids: Sequence[int]) -> str:
    return bundle.tokenizer.decode(list(ids), skip_special_tokens=True)
