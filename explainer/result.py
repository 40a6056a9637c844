"""The one result type every attribution method produces and every view consumes.

An `Attribution` holds the prompt and generated tokens of one generation and, per method, a `[K steps x N prompt
tokens]` score matrix: row k explains generated token k over all N prompt tokens.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np


def zscore(raw: np.ndarray, positions: np.ndarray | list[int] | None = None) -> np.ndarray:
    """Per-row z-scores (MACS paper Eq. 8), optionally over a subset of columns.

    Args:
        raw: (K, N) scores.
        positions: columns to standardise over; the others are returned as NaN. None means all columns.

    Returns:
        (K, N) float32. A row with zero spread gets zeros (every token is equally important).
    """
    raw = np.asarray(raw, dtype=np.float64)  # (K, N)
    if raw.ndim != 2:
        raise ValueError(f"expected a (K, N) matrix, got shape {raw.shape}")
    cols = np.arange(raw.shape[1]) if positions is None else np.asarray(positions, dtype=np.int64)
    out = np.full(raw.shape, np.nan, dtype=np.float64)
    if raw.shape[0] == 0 or cols.size == 0:
        return out.astype(np.float32)
    sub = raw[:, cols]  # (K, n)
    mean = sub.mean(axis=1, keepdims=True)
    std = sub.std(axis=1, keepdims=True)
    safe = np.where(std > 0, std, 1.0)
    out[:, cols] = np.where(std > 0, (sub - mean) / safe, 0.0)
    return out.astype(np.float32)


@dataclass
class MethodScores:
    """Scores of one method for one generation.

    Attributes:
        raw: (K, N) float32, the method's own scores (see each method's docstring for their scale).
        z: (K, N) float32, per-step z-scores of `raw` over all N prompt tokens.
        seconds: wall time the method added, including its share of generation when it streams.
        meta: method options and anything else worth keeping (plain JSON-able values).
    """

    raw: np.ndarray
    z: np.ndarray
    seconds: float = 0.0
    meta: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_raw(cls, raw: np.ndarray, seconds: float = 0.0, meta: dict[str, Any] | None = None) -> MethodScores:
        raw = np.asarray(raw, dtype=np.float32)
        return cls(raw=raw, z=zscore(raw), seconds=float(seconds), meta=dict(meta or {}))


@dataclass
class Attribution:
    """Tokens of one generation and the attribution maps of every method run on it.

    Attributes:
        model: model id or path.
        prompt_token_ids: the N ids fed to the model (chat template included).
        prompt_tokens: N readable strings.
        generated_token_ids: the K generated ids (an end-of-sequence token, when produced, is the last one).
        generated_tokens: K readable strings.
        methods: method name -> its scores, each (K, N).
        user_positions: prompt positions holding the user's own text (not template or system tokens).
        meta: generation settings and timings.
        image: for image prompts, `{"token_positions": [...], "grid": [h, w], "size": [W, H]}`: the prompt positions
            of the image tokens (row-major over the merged patch grid) and the image's size, so a step's image map
            is `scores[k, token_positions].reshape(h, w)`; None for text prompts.
    """

    model: str
    prompt_token_ids: list[int]
    prompt_tokens: list[str]
    generated_token_ids: list[int] = field(default_factory=list)
    generated_tokens: list[str] = field(default_factory=list)
    methods: dict[str, MethodScores] = field(default_factory=dict)
    user_positions: list[int] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    image: dict[str, list[int]] | None = None

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_steps(self) -> int:
        return len(self.generated_token_ids)

    @property
    def generated_text(self) -> str:
        return "".join(self.generated_tokens)

    def snapshot(self) -> Attribution:
        """A copy that later changes to this result do not reach (lists and dicts copied; score arrays, which are
        replaced rather than changed, shared)."""
        return dataclasses.replace(
            self,
            generated_token_ids=list(self.generated_token_ids),
            generated_tokens=list(self.generated_tokens),
            methods=dict(self.methods),
            user_positions=list(self.user_positions),
            meta=dict(self.meta),
        )

    def top_tokens(self, method: str, step: int, k: int = 5) -> list[tuple[int, str, float]]:
        """The k prompt positions with the highest z-score at `step`: (position, token, z)."""
        z = self.methods[method].z[step]  # (N,)
        order = np.argsort(-np.nan_to_num(z, nan=-np.inf), kind="stable")[:k]
        return [(int(i), self.prompt_tokens[i], float(z[i])) for i in order]

    def to_dict(self) -> dict[str, Any]:
        """JSON layout of the CLI: `methods: {name: {"raw": [[...]], "z": [[...]], "seconds": s}}`."""
        return {
            "model": self.model,
            "prompt_token_ids": list(map(int, self.prompt_token_ids)),
            "prompt_tokens": list(self.prompt_tokens),
            "generated_token_ids": list(map(int, self.generated_token_ids)),
            "generated_tokens": list(self.generated_tokens),
            "user_positions": list(map(int, self.user_positions)),
            "methods": {
                name: {
                    "raw": s.raw.astype(float).tolist(),
                    "z": s.z.astype(float).tolist(),
                    "seconds": float(s.seconds),
                    "meta": s.meta,
                }
                for name, s in self.methods.items()
            },
            "meta": self.meta,
            **({"image": {k: list(map(int, v)) for k, v in self.image.items()}} if self.image else {}),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Attribution:
        n = len(d["prompt_token_ids"])
        methods = {}
        for name, m in d.get("methods", {}).items():
            raw = np.asarray(m["raw"], dtype=np.float32).reshape(-1, n)  # (K, N)
            z = np.asarray(m["z"], dtype=np.float32).reshape(-1, n)
            methods[name] = MethodScores(raw=raw, z=z, seconds=float(m.get("seconds", 0.0)), meta=m.get("meta", {}))
        return cls(
            model=d["model"],
            prompt_token_ids=list(d["prompt_token_ids"]),
            prompt_tokens=list(d["prompt_tokens"]),
            generated_token_ids=list(d.get("generated_token_ids", [])),
            generated_tokens=list(d.get("generated_tokens", [])),
            methods=methods,
            user_positions=list(d.get("user_positions", [])),
            meta=dict(d.get("meta", {})),
            image={k: list(map(int, v)) for k, v in d["image"].items()} if d.get("image") else None,
        )

    def save_json(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict()), encoding="utf-8")

    @classmethod
    def load_json(cls, path: str | Path) -> Attribution:
        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))
