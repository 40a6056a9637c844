"""Image reliance per answer token: did the token come from the image, or from the text (a language prior)?

An image question's result carries, for every answer token k (`Attribution.reliance`, `reliance` in the JSON):

- `logprob[k]` and `image_hidden_logprob[k]`: the log-probability of token k with the image visible, and with every
  image token hidden from the positions that predict the answer (an attention knockout: the image's keys get a large
  negative pre-softmax bias in every layer and head for those queries only, as Sources' scope "answer" hides a
  sentence; Geva et al., 2023, block edges the same way). `drop` = logprob - image_hidden_logprob, in nats: > 0, the
  token needed to read the image (hiding it lowers the token's probability by a factor e^drop); about 0, the text
  alone gives it; < 0, the image argued against it. The question's own tokens still read the image, so this is the
  answer's *direct* reliance: what reached the question's tokens from the image is kept. Both log-probabilities
  come from one batched pass over the answer (`explainer/reliance.py`), in the same layout, so their difference
  has no rounding floor from a different computation.
- `image_share[method][k]`: the share of each method's evidence for token k on the image against the question's
  text, in [0, 1]:

      share_k = sum_{i in image} e_ki / sum_{i in image or text} e_ki,   e_ki = max(raw_ki - floor_k, 0)

  `floor` is the raw score a method gives a token it found no evidence for: (1 - alpha)^L for MACS (Eq. 6's floor
  multiplied over the L layers: a token no layer attends to; without it every token would count and the share
  would be the image's token count), 0 for the others (AtMan's loss change, the gradient methods' relevance,
  Rollout's attention flow, Random's noise). Only the positive part counts: a negative AtMan or gradient score is
  evidence against the token, not for it. Z-scores are not used: their zero is the row's mean, so half of every map
  would count as evidence whatever the method saw.
  The positions compared (`image_positions`, `text_positions`): every image token against the user's question
  tokens. The chat template (system prompt, role markers, the vision start and end markers) is left out: it is the
  same for every question and says nothing about image against text. Attention sinks (`meta["sinks"]`) are left out
  on both sides: they draw attention whatever the query (the first token; in VLMs a few image tokens, Kang et al.,
  2025), so MACS and Rollout would credit their mass to the image or the text for no reason to do with the question.
  Every method uses the same positions, so their shares compare.
  The share is a mass, not a density: a map spread evenly gives `even_share` = n_image / (n_image + n_text) (where
  Random lands), which is high because an image has many more tokens than a question; a share far above it means
  the method concentrates on the image. NaN: no positive evidence on either side, or a MACS step whose row was
  rescaled (`rescaled_steps`: its floor is then unknown).

Pure data and numpy: no model. The knockout pass and the hook of the request are `explainer/reliance.py`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np


def image_share(
    raw: np.ndarray, image: Sequence[int], text: Sequence[int], floor: float | np.ndarray = 0.0
) -> np.ndarray:
    """Each step's share of a method's positive evidence on `image` against `text` (see the module docstring).

    Args:
        raw: (K, N) the method's raw scores.
        image: prompt positions of the image tokens compared.
        text: prompt positions of the text tokens compared.
        floor: the raw score of no evidence, a number or (K,) per step (NaN: unknown at that step).

    Returns:
        (K,) float32 in [0, 1]; NaN where no position has positive evidence or the floor is unknown.
    """
    raw = np.asarray(raw, dtype=np.float64)  # (K, N)
    floor = np.broadcast_to(np.asarray(floor, dtype=np.float64), raw.shape[:1])[:, None]  # (K, 1)
    with np.errstate(invalid="ignore"):
        excess = raw - floor  # (K, N); NaN scores are no evidence
        evidence = np.where(excess > 0, excess, 0.0)  # (K, N)
        on_image = evidence[:, list(image)].sum(axis=1)  # (K,)
        total = on_image + evidence[:, list(text)].sum(axis=1)  # (K,)
        ok = (total > 0) & np.isfinite(total) & np.isfinite(floor[:, 0])
        share = np.where(ok, on_image / np.where(ok, total, 1.0), np.nan)
    return np.clip(share, 0.0, 1.0).astype(np.float32)


def share_positions(
    image_positions: Iterable[int], user_positions: Iterable[int], sinks: Iterable[int] = ()
) -> tuple[list[int], list[int]]:
    """The positions `image_share` compares: (every image token, the question's text tokens), sinks left out of both
    and image tokens out of the text."""
    image, left_out = sorted(set(image_positions)), set(sinks)
    text = sorted(set(user_positions) - set(image) - left_out)
    return [p for p in image if p not in left_out], text


def _floats(values: Iterable[float]) -> np.ndarray:
    return np.asarray(list(values), dtype=np.float32)


@dataclass(frozen=True)
class Reliance:
    """How much each answer token relied on the image (see the module docstring).

    Attributes:
        logprob: (K,) float32, log p of each answer token with the image visible (nats).
        image_hidden_logprob: (K,) float32, log p with every image token hidden from the answer's positions.
        image_share: method -> (K,) float32 share of its positive evidence on the image, in [0, 1] or NaN.
        image_positions: the image positions the shares compare (sinks left out).
        text_positions: the text positions they compare (the question's tokens, sinks left out).
        share_floor: method -> the raw score of no evidence subtracted before the share (MACS: (1 - alpha)^L).
    """

    logprob: np.ndarray
    image_hidden_logprob: np.ndarray
    image_share: dict[str, np.ndarray] = field(default_factory=dict)
    image_positions: list[int] = field(default_factory=list)
    text_positions: list[int] = field(default_factory=list)
    share_floor: dict[str, float] = field(default_factory=dict)

    @property
    def num_steps(self) -> int:
        return int(self.logprob.shape[0])

    @property
    def drop(self) -> np.ndarray:
        """(K,) float32 logprob - image_hidden_logprob: > 0 where the token needed the image (nats)."""
        return (self.logprob - self.image_hidden_logprob).astype(np.float32)

    @property
    def even_share(self) -> float:
        """The share of a map spread evenly over the compared positions: n_image / (n_image + n_text); NaN if none."""
        n = len(self.image_positions) + len(self.text_positions)
        return len(self.image_positions) / n if n else float("nan")

    def to_dict(self) -> dict[str, Any]:
        """The JSON layout (`result.schema.RelianceRecord`): plain floats (NaN stays NaN) and ints."""
        return {
            "logprob": [float(v) for v in self.logprob],
            "image_hidden_logprob": [float(v) for v in self.image_hidden_logprob],
            "image_share": {name: [float(v) for v in s] for name, s in self.image_share.items()},
            "image_positions": [int(p) for p in self.image_positions],
            "text_positions": [int(p) for p in self.text_positions],
            "share_floor": {name: float(v) for name, v in self.share_floor.items()},
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Reliance:
        """A record checked by the schema (`to_dict`'s layout) back to arrays."""
        return cls(
            logprob=_floats(d["logprob"]),
            image_hidden_logprob=_floats(d["image_hidden_logprob"]),
            image_share={name: _floats(s) for name, s in (d.get("image_share") or {}).items()},
            image_positions=[int(p) for p in d.get("image_positions") or []],
            text_positions=[int(p) for p in d.get("text_positions") or []],
            share_floor={name: float(v) for name, v in (d.get("share_floor") or {}).items()},
        )
