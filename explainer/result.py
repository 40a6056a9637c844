"""The one result type every attribution method produces and every view consumes.

An `Attribution` holds the prompt and generated tokens of one generation and, per method, a `[K steps x N prompt
tokens]` score matrix: row k explains generated token k over all N prompt tokens. Its step scores say how sure the
model was of each answer token.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .errors import InputError
from .tokens import check_encodable

STEP_SCORES = ("probability", "entropy")  # the keys of `Attribution.step_scores` (see there)


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
    with np.errstate(invalid="ignore", over="ignore"):  # a row with inf or NaN scores gets NaN z-scores (no score)
        mean = sub.mean(axis=1, keepdims=True)
        std = sub.std(axis=1, keepdims=True)
        safe = np.where(std > 0, std, 1.0)
        # zero spread: every token equally important (0); inf or NaN spread: no score (NaN)
        out[:, cols] = np.where(std > 0, (sub - mean) / safe, np.where(np.isfinite(std), 0.0, np.nan))
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
        step_scores: per answer token (K values each): "probability", the softmax probability the model gave that
            token at its step (teacher-forced tokens included), and "entropy", the entropy in nats of that step's
            next-token distribution (0: certain; ln V at most). Empty for results saved before they existed.
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
    step_scores: dict[str, list[float]] = field(default_factory=dict)

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
            step_scores={key: list(values) for key, values in self.step_scores.items()},
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
            "step_scores": {key: [float(v) for v in values] for key, values in self.step_scores.items()},
            **({"image": {k: list(map(int, v)) for k, v in self.image.items()}} if self.image else {}),
        }

    @classmethod
    def from_dict(cls, d: Any) -> Attribution:
        """A result from the JSON layout of `to_dict` (a saved result), checked field by field so that every view
        can show what it returns.

        Raises:
            InputError: naming the first field that is missing or malformed.
        """
        if not isinstance(d, dict):
            raise InputError(f"A saved result is a JSON object (as `explain --json` writes), got {_kind(d)}.")
        model = _field(d, "model", str)
        ids = _token_ids(d, "prompt_token_ids")
        n = len(ids)
        if n == 0:
            raise InputError("Saved result: prompt_token_ids is empty; a result explains at least one prompt token.")
        tokens = _strings(d, "prompt_tokens", n)
        generated_ids = _token_ids(d, "generated_token_ids", required=False)
        k = len(generated_ids)
        generated = _strings(d, "generated_tokens", k, required=False)
        methods = {}
        for name, m in _field(d, "methods", dict, {}).items():
            where = f"methods[{name!r}]"
            check_encodable(name, f"Saved result: the method name {where}")
            if not isinstance(m, dict):
                raise InputError(f"Saved result: {where} is an object with raw, z and seconds, got {_kind(m)}.")
            raw = _matrix(m, "raw", where, k, n)
            z = _matrix(m, "z", where, k, n) if "z" in m else zscore(raw)
            seconds = _field(m, "seconds", (int, float), 0.0, where)
            if isinstance(seconds, bool) or not 0 <= seconds < 1e15:  # not NaN, inf, or an int past float range
                raise InputError(f"Saved result: {where}.seconds is a time in seconds, got {seconds!r:.40}.")
            methods[name] = MethodScores(raw=raw, z=z, seconds=float(seconds), meta=_field(m, "meta", dict, {}, where))
        return cls(
            model=model,
            prompt_token_ids=ids,
            prompt_tokens=tokens,
            generated_token_ids=generated_ids,
            generated_tokens=generated,
            methods=methods,
            user_positions=_positions(d, "user_positions", n),
            meta=_field(d, "meta", dict, {}),
            image=_image_record(d.get("image"), n),
            step_scores=_step_scores(d, k),
        )

    def save_json(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict()), encoding="utf-8")

    @classmethod
    def load_json(cls, path: str | Path) -> Attribution:
        """A result saved by `save_json` (or `explain --json`).

        Raises:
            InputError: the file is missing, unreadable, not JSON, or not a saved result (see `from_dict`).
        """
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise InputError(f"Saved result {str(path)!r} does not exist.") from None
        except (OSError, UnicodeDecodeError) as e:
            raise InputError(f"Cannot read the saved result {str(path)!r}: {e}") from e
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise InputError(f"Saved result {str(path)!r} is not valid JSON: {e}") from e
        except RecursionError as e:
            raise InputError(f"Saved result {str(path)!r} is nested too deeply to be a saved result.") from e
        return cls.from_dict(data)


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "true/false", type(None): "null"}.get(
        type(value), "a number"
    )


_MISSING = object()


def _field(d: dict, key: str, types: type | tuple[type, ...], default: Any = _MISSING, where: str = "") -> Any:
    name = f"{where}.{key}" if where else key
    if key not in d:
        if default is _MISSING:
            raise InputError(f"Saved result: {name} is missing.")
        return default
    value = d[key]
    if not isinstance(value, types):
        want = {str: "a string", dict: "an object", list: "a list"}.get(types, "a number")
        raise InputError(f"Saved result: {name} must be {want}, got {_kind(value)}.")
    return value


def _ints(d: dict, key: str, lo: int, hi: int, what: str, required: bool = True, where: str = "") -> list[int]:
    values = _field(d, key, list, _MISSING if required else [], where)
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v < hi:
            raise InputError(f"Saved result: {where + '.' if where else ''}{key} must hold {what}, found {v!r:.40}.")
    return list(values)


def _token_ids(d: dict, key: str, required: bool = True) -> list[int]:
    return _ints(d, key, 0, 2**31, "token ids (whole numbers from 0)", required)


def _positions(d: dict, key: str, n: int) -> list[int]:
    return _ints(d, key, 0, n, f"prompt positions from 0 to {n - 1}", required=False)


def _strings(d: dict, key: str, count: int, required: bool = True) -> list[str]:
    values = _field(d, key, list, _MISSING if required else [])
    if len(values) != count or not all(isinstance(v, str) for v in values):
        raise InputError(f"Saved result: {key} must be {count} strings, one per token id.")
    for i, v in enumerate(values):
        check_encodable(v, f"Saved result: {key}[{i}]")  # the views show it; the page must be valid UTF-8
    return list(values)


def _matrix(m: dict, key: str, where: str, k: int, n: int) -> np.ndarray:
    """A (k, n) float32 score matrix; numbers only (NaN marks no score)."""
    values = _field(m, key, list, _MISSING, where)
    try:
        with np.errstate(over="ignore"):  # beyond float32: inf, like any score too large to show
            a = np.asarray(values, dtype=np.float32)
    except (TypeError, ValueError, OverflowError):
        raise InputError(f"Saved result: {where}.{key} must be a {k} x {n} table of numbers.") from None
    if a.size == 0 and k == 0:
        a = a.reshape(0, n)  # (0, N): no generated tokens
    if a.shape != (k, n):
        raise InputError(f"Saved result: {where}.{key} must be a {k} x {n} table of numbers, got shape {a.shape}.")
    return a


def _finite(v: int | float) -> bool:
    try:
        return math.isfinite(v)
    except OverflowError:  # an int past float range
        return False


def _step_scores(d: dict, k: int) -> dict[str, list[float]]:
    """`step_scores` (optional): K finite numbers per key, probabilities in [0, 1], entropies from 0."""
    scores = _field(d, "step_scores", dict, {})
    out = {}
    for key, values in scores.items():
        check_encodable(key, "Saved result: a step_scores key")
        where = f"step_scores[{key!r}]"
        if not isinstance(values, list) or len(values) != k:
            raise InputError(f"Saved result: {where} must be a list of {k} numbers, one per answer token.")
        for v in values:
            if isinstance(v, bool) or not isinstance(v, int | float) or not _finite(v):
                raise InputError(f"Saved result: {where} must hold finite numbers, found {v!r:.40}.")
            if key == "probability" and not 0 <= v <= 1:
                raise InputError(f"Saved result: {where} must hold probabilities from 0 to 1, found {v!r:.40}.")
            if key == "entropy" and v < 0:
                raise InputError(f"Saved result: {where} must hold entropies of 0 or more (nats), found {v!r:.40}.")
        out[key] = [float(v) for v in values]
    return out


def _image_record(image: Any, n: int) -> dict[str, list[int]] | None:
    if image is None:
        return None
    if not isinstance(image, dict):
        raise InputError(f"Saved result: image must be an object or null, got {_kind(image)}.")
    positions = _ints(image, "token_positions", 0, n, f"prompt positions from 0 to {n - 1}", where="image")
    grid = _ints(image, "grid", 1, 2**31, "positive whole numbers", where="image")
    size = _ints(image, "size", 1, 2**31, "positive whole numbers", where="image")
    if len(grid) != 2 or len(size) != 2 or grid[0] * grid[1] != len(positions):
        raise InputError(
            f"Saved result: image.grid must be [h, w] with h * w = {len(positions)} image tokens, and image.size "
            "[width, height]."
        )
    return {"token_positions": positions, "grid": grid, "size": size}
