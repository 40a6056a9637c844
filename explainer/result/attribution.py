"""The one result type every attribution method produces and every view consumes, and its saved file.

An `Attribution` holds the prompt and generated tokens of one generation and, per method, a `[K steps x N prompt
tokens]` score matrix: row k explains generated token k over all N prompt tokens. Its step scores say how sure the
model was of each answer token.

Saving and opening: `result_json` / `Attribution.save_json` write the one file format (`result_schema`, with its
`format_version`) that `explain --json` and the app's download both write; `load_result` / `Attribution.load_json`
read it, and files of earlier versions, turning every way a file can be wrong into an `InputError`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError
from .reliance import Reliance
from .schema import FORMAT_VERSION, parse_saved

STEP_SCORES = ("probability", "entropy")  # the keys of `Attribution.step_scores` (see there)
# A saved result of the app's largest usual request (2,000 prompt tokens x 200 steps x 4 methods, raw and z) is
# about 35 MB in `result_json`'s compact form and 60 MB as float64 digits; parsing holds about five times the file in
# Python objects, so 64 MiB (~350 MB while loading) stays well within a Space's memory and refuses anything larger.
MAX_RESULT_BYTES = 64 * 2**20


# How a result draws itself in a notebook (`Attribution._repr_html_`). The views sit above the results, which may not
# import them: the library's front end (`explainer/__init__.py`) sets the HTML report's notebook view here.
_notebook_view: Callable[[Attribution], str] | None = None


def set_notebook_view(view: Callable[[Attribution], str] | None) -> Callable[[Attribution], str] | None:
    """Set the function that turns a result into the HTML a notebook shows for it (None: the plain `repr`); returns
    the one set before."""
    global _notebook_view
    previous, _notebook_view = _notebook_view, view
    return previous


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
        layers: (K, L, N) float32 per-layer scores when the method kept them, else None: MACS's floored factors
            (Eq. 6) with `keep_layers`, whose product over layers is `raw` (up to a rescaled step's constant).
    """

    raw: np.ndarray
    z: np.ndarray
    seconds: float = 0.0
    meta: dict[str, Any] = field(default_factory=dict)
    layers: np.ndarray | None = None

    def with_layers(self, layers: np.ndarray | None) -> MethodScores:
        """These scores with `layers` (K, L, N) attached; itself when None."""
        return self if layers is None else dataclasses.replace(self, layers=np.asarray(layers, dtype=np.float32))

    @classmethod
    def from_raw(cls, raw: np.ndarray, seconds: float = 0.0, meta: dict[str, Any] | None = None) -> MethodScores:
        raw = np.asarray(raw, dtype=np.float32)
        return cls(raw=raw, z=zscore(raw), seconds=float(seconds), meta=dict(meta or {}))


class ScoreRows:
    """A method's (K, N) scores built one row per generated token with O(N) host work per row.

    Rows go into preallocated arrays that double when full, and only the new row is z-scored (z-scores are per row,
    so this equals `zscore` of the whole matrix). `append` returns `MethodScores` whose arrays are views of the first
    k rows; later rows are written below them, so earlier results never change.
    """

    def __init__(self, n: int, capacity: int = 64) -> None:
        self._raw = np.zeros((max(1, capacity), n), dtype=np.float32)  # (capacity, N)
        self._z = np.zeros_like(self._raw)  # (capacity, N)
        self.k = 0

    def append(self, row: np.ndarray, seconds: float = 0.0, meta: dict[str, Any] | None = None) -> MethodScores:
        """Add row k (N,) and return the scores of rows 0..k."""
        if self.k == self._raw.shape[0]:  # full: double (amortised O(N) per row)
            self._raw = np.concatenate([self._raw, np.zeros_like(self._raw)])
            self._z = np.concatenate([self._z, np.zeros_like(self._z)])
        self._raw[self.k] = row
        self._z[self.k] = zscore(self._raw[self.k : self.k + 1])[0]
        self.k += 1
        return MethodScores(raw=self._raw[: self.k], z=self._z[: self.k], seconds=float(seconds), meta=dict(meta or {}))


def _image_json(image: dict) -> dict:
    """An image record as plain ints (numpy values are not JSON), `images` record by record."""
    out = {k: [int(x) for x in v] for k, v in image.items() if k != "images"}
    if image.get("images"):
        out["images"] = [_image_json(one) for one in image["images"]]
    return out


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
            is `scores[k, token_positions].reshape(h, w)`; None for text prompts. With several images these are the
            first image's, and `"images"` lists each image's record in order (`image_maps.image_records`).
        step_scores: per answer token (K values each): "probability", the softmax probability the model gave that
            token at its step (teacher-forced tokens included), and "entropy", the entropy in nats of that step's
            next-token distribution (0: certain; ln V at most). Empty for results saved before they existed.
        reliance: for image prompts, how much each answer token relied on the image (`result/reliance.py`): its
            log-probability with the image hidden from the answer, and each method's share on the image; None for
            text prompts, when turned off, while the answer is being generated, and in files saved before it.
        opened: True for a result read from a saved file (`from_dict`, `load_result`): its methods' seconds were
            measured where it was made, so they are shown but `estimate.calibrate` does not learn from them. Not
            saved.
    """

    model: str
    prompt_token_ids: list[int]
    prompt_tokens: list[str]
    generated_token_ids: list[int] = field(default_factory=list)
    generated_tokens: list[str] = field(default_factory=list)
    methods: dict[str, MethodScores] = field(default_factory=dict)
    user_positions: list[int] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    image: dict[str, Any] | None = None
    step_scores: dict[str, list[float]] = field(default_factory=dict)
    reliance: Reliance | None = None
    opened: bool = field(default=False, compare=False)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    def _repr_html_(self) -> str | None:
        """What Jupyter shows for a result: the HTML report with its step slider (`visuals.report.notebook_html`,
        set by `import explainer`); None (the plain repr) when no view is set."""
        return None if _notebook_view is None else _notebook_view(self)

    @property
    def images(self) -> list[dict]:
        """Each image's record (`token_positions`, `grid`, `size`) in prompt order: [] for a text prompt."""
        if not self.image:
            return []
        return list(self.image.get("images") or [self.image])

    @property
    def image_token_positions(self) -> list[int]:
        """The prompt positions of every image token, image after image (each row-major over its grid)."""
        return [int(p) for one in self.images for p in one["token_positions"]]

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

    def to_dict(self, layers: bool = False) -> dict[str, Any]:
        """The saved-result layout (`result_schema`), scores as float64 numbers; `result_json` writes it compactly.
        With `layers`, a method's per-layer scores too, where it kept them (L times the size of `raw`)."""
        return {
            "format_version": FORMAT_VERSION,
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
                    **({"layers": s.layers.astype(float).tolist()} if layers and s.layers is not None else {}),
                }
                for name, s in self.methods.items()
            },
            "meta": self.meta,
            "step_scores": {key: [float(v) for v in values] for key, values in self.step_scores.items()},
            **({"image": _image_json(self.image)} if self.image else {}),
            **({"reliance": self.reliance.to_dict()} if self.reliance is not None else {}),
        }

    @classmethod
    def from_dict(cls, d: Any) -> Attribution:
        """A result from the saved-result layout of any format version, checked against `result_schema` so that
        every view can show it.

        Raises:
            InputError: not an object, or naming the first field that is missing or malformed.
        """
        saved = parse_saved(d)
        n, k = len(saved.prompt_token_ids), len(saved.generated_token_ids)
        methods = {}
        for name, m in saved.methods.items():
            raw = _matrix(m.raw, k, n)
            z = _matrix(m.z, k, n) if m.z is not None else zscore(raw)
            methods[name] = MethodScores(raw=raw, z=z, seconds=float(m.seconds), meta=dict(m.meta))
            if m.layers is not None:
                methods[name] = methods[name].with_layers(_layers(m.layers, k, n))
        return cls(
            model=saved.model,
            prompt_token_ids=list(saved.prompt_token_ids),
            prompt_tokens=list(saved.prompt_tokens),
            generated_token_ids=list(saved.generated_token_ids),
            generated_tokens=list(saved.generated_tokens),
            methods=methods,
            user_positions=list(saved.user_positions),
            meta=dict(saved.meta),
            image=saved.image.model_dump(exclude_none=True) if saved.image is not None else None,
            step_scores={key: list(v) for key, v in saved.step_scores.model_dump(exclude_none=True).items()},
            reliance=Reliance.from_dict(saved.reliance.model_dump()) if saved.reliance is not None else None,
            opened=True,
        )

    def save_json(self, path: str | Path, layers: bool = False) -> None:
        """Write `result_json(self, layers)` to `path` (what `explain --json` and the app's download write)."""
        Path(path).write_text(result_json(self, layers), encoding="utf-8")

    @classmethod
    def load_json(cls, path: str | Path) -> Attribution:
        """A result saved by `save_json`, `explain --json` or the app's download (see `load_result`)."""
        return load_result(Path(path))


def _matrix(rows: list[list[float]], k: int, n: int) -> np.ndarray:
    """(K, N) float32 from checked rows; values beyond float32's range become inf, like any score too large to show."""
    with np.errstate(over="ignore"):
        return np.asarray(rows, dtype=np.float32).reshape(k, n)


def _layers(blocks: list[list[list[float]]], k: int, n: int) -> np.ndarray:
    """(K, L, N) float32 from checked per-layer tables (L = 0 when K = 0)."""
    with np.errstate(over="ignore"):
        return np.asarray(blocks, dtype=np.float32).reshape(k, len(blocks[0]) if blocks else 0, n)


def _compact_matrix(a: np.ndarray) -> list[list[float]]:
    """(K, N) float32 -> nested lists of floats printed with the shortest digits that read back to the same float32."""
    a = np.asarray(a, dtype=np.float32)  # (K, N)
    # numpy prints float32 with its shortest round-trip repr; parsing that text as float64 gives a float whose repr
    # is at most as long and which converts back to the same float32. Row by row: the text array is 128 bytes a cell.
    return [row.astype(str).astype(np.float64).tolist() for row in a]


def result_json(attr: Attribution, layers: bool = False, rows: dict[bytes, str] | None = None) -> str:
    """The result as one line of JSON in the saved-result format (`result_schema`), each score written as the
    shortest decimal that reads back to the same float32 (about half the size of float64 digits); NaN scores are
    written as `NaN` (Python's reader accepts it; strict JSON readers do not). With `layers`, the per-layer scores
    a method kept (MACS with `keep_layers`) are written too: the file grows by L times their `raw`.

    `load_result` / `Attribution.load_json` read it back to a result with bit-identical scores, tokens and metadata.

    `rows`, when given, keeps the JSON text of every score row written (row bytes -> text) for the next call: a
    stream of growing results (the API's) writes each row once instead of at every update; the text is the same.
    """
    if rows is not None:
        return _result_json_cached(attr, layers, rows)
    d = attr.to_dict(layers)
    for name, m in d["methods"].items():
        m["raw"] = _compact_matrix(attr.methods[name].raw)
        m["z"] = _compact_matrix(attr.methods[name].z)
        if "layers" in m:
            m["layers"] = [_compact_matrix(block) for block in attr.methods[name].layers]
    return json.dumps(d, ensure_ascii=False, separators=(",", ":"))


def _result_json_cached(attr: Attribution, layers: bool, rows: dict[bytes, str]) -> str:
    """`result_json` with each matrix written row by row from `rows` (filled as it goes), spliced into the rest."""
    d = attr.to_dict(layers)
    marks = {}  # JSON text of a placeholder string -> the matrix's JSON text
    nonce = secrets.token_hex(8)

    def mark(matrix: np.ndarray) -> str:
        key = f"\x00{nonce}:{len(marks)}"  # a string no result holds (it names this call's nonce)
        marks[json.dumps(key)] = "[" + ",".join(_row_text(row, rows) for row in np.asarray(matrix, np.float32)) + "]"
        return key

    for name, m in d["methods"].items():
        scores = attr.methods[name]
        m["raw"], m["z"] = mark(scores.raw), mark(scores.z)
        if "layers" in m:
            m["layers"] = [mark(block) for block in scores.layers]
    text = json.dumps(d, ensure_ascii=False, separators=(",", ":"))
    for key, matrix in marks.items():
        text = text.replace(key, matrix, 1)
    return text


def _row_text(row: np.ndarray, rows: dict[bytes, str]) -> str:
    """One (N,) float32 row as `result_json` writes it, from `rows` when it was written before."""
    key = row.tobytes()
    text = rows.get(key)
    if text is None:
        text = rows[key] = json.dumps(_compact_matrix(row[None])[0], separators=(",", ":"))
    return text


def _size_text(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB" if n >= 2**10 else f"{n} bytes"


def _read(source: bytes | bytearray | str | os.PathLike, max_bytes: int, name: str | None) -> tuple[bytes, str]:
    """The file's bytes and a name for messages; refuses a missing, unreadable or too large file."""
    if isinstance(source, bytes | bytearray | memoryview):
        data, what = bytes(source), name or "The uploaded file"
    elif isinstance(source, str | os.PathLike):
        path = Path(source)
        what = f"The file {path.name!r}"
        try:
            if path.is_dir():
                raise InputError(f"{str(path)!r} is a folder; choose a saved result (.json) file.")
            size = path.stat().st_size
            if size > max_bytes:
                raise InputError(
                    f"{what} is {_size_text(size)}; a saved result can be at most {_size_text(max_bytes)}."
                )
            data = path.read_bytes()
        except FileNotFoundError:
            raise InputError(f"The saved result {str(path)!r} does not exist.") from None
        except (OSError, ValueError) as e:  # ValueError: a NUL in the path
            raise InputError(f"Cannot read the saved result {str(path)!r}: {getattr(e, 'strerror', None) or e}.") from e
    else:
        raise InputError(f"A saved result is given as bytes or a file path, got {type(source).__name__}.")
    if len(data) > max_bytes:
        raise InputError(f"{what} is {_size_text(len(data))}; a saved result can be at most {_size_text(max_bytes)}.")
    if not data.strip():
        raise InputError(f"{what} is empty; choose a result saved with 'Download JSON' or `explain --json`.")
    return data, what


def load_result(
    source: bytes | bytearray | str | os.PathLike, max_bytes: int = MAX_RESULT_BYTES, name: str | None = None
) -> Attribution:
    """A saved result (`result_json`, the app's download, `explain --json`), of any format version.

    Args:
        source: the file's content as bytes, or the path of the file (str or Path; what an upload widget gives).
        max_bytes: largest file accepted (default `MAX_RESULT_BYTES`, 64 MiB).
        name: what messages call content given as bytes, e.g. "The result text" (default "The uploaded file").

    Returns:
        The result, checked against `result_schema`: every view can show it without a model.

    Raises:
        InputError: the file is missing, too large, empty, not UTF-8 text, not JSON, or not a saved result (the
            message names the field).
    """
    data, what = _read(source, max_bytes, name)
    try:
        text = data.decode("utf-8-sig")  # a byte-order mark from a Windows editor is harmless
    except UnicodeDecodeError as e:
        raise InputError(
            f"{what} is not UTF-8 text (byte {e.start + 1} is 0x{data[e.start]:02x}); a saved result is a .json file."
        ) from None
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(
            f"{what} is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg}); a saved result is the .json file "
            "that 'Download JSON' or `explain --json` writes."
        ) from None
    except RecursionError:
        raise InputError(f"{what} is nested too deeply to be a saved result.") from None
    return Attribution.from_dict(parsed)
