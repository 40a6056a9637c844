"""The saved result's file format, declared once: what `explain --json` and the app's download write, and what every
reader checks before a view may show it (`result.Attribution.from_dict`).

A file is one JSON object:

    {"format_version": 1, "model": str, "prompt_token_ids": [N ids], "prompt_tokens": [N str],
     "generated_token_ids": [K ids], "generated_tokens": [K str], "user_positions": [prompt positions],
     "methods": {name: {"raw": K x N numbers, "z": K x N numbers, "seconds": s, "meta": {...}}},
     "meta": {...}, "step_scores": {"probability": [K], "entropy": [K]}, "image": {...} (image prompts only),
     "reliance": {"logprob": [K], "image_hidden_logprob": [K], "image_share": {method: [K]}, ...} (image prompts)}

Scores may be NaN (no score) and are read as float32. Keys a reader does not know are ignored. A method may also
carry `"layers"`: K x L x N numbers, its per-layer scores (MACS's factors of Eq. 6 with `keep_layers`, written only
on request: `--macs-layers`); a reader that does not know them ignores them.

Format versions:
    0: no `format_version` field: files written before it existed, by `explain --json` (float64 digits) and by the
       app's download (float32 shortest digits); the layout is that of version 1.
    1: adds `format_version`; the CLI and the app write the same text (`result.result_json`).

`reliance` (how much each answer token relied on the image, `result/reliance.py`) was added within version 1: it is
optional, and a reader that does not know it ignores it.

Every field's constraint lives in its type below; a file that breaks one is refused with an `InputError` that names
the field (`parse_saved`). Constraints that depend on N and K read them from the validation context.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from ..errors import InputError
from ..models.tokens import encoding_problem

FORMAT_VERSION = 1  # written by this version; files of versions 0..FORMAT_VERSION are read


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "true/false", type(None): "null"}.get(
        type(value), "a number"
    )


def _fail(message: str, sub: str = "") -> PydanticCustomError:
    return PydanticCustomError("saved_result", "{message}", {"message": message, "sub": sub})


_BOUNDS = {"greater_than", "greater_than_equal", "less_than", "less_than_equal"}


def _described(
    tp: Any, shape: str, items: str | None = None, bounds: str | None = None, check: Any = None, item_check: Any = None
) -> Any:
    """`tp` with errors that read "<field> <message>": `shape` when the value itself is wrong (its type, or
    `check(value, context)` returns it), `items` when one of its items is (its type, or `item_check(value, context)`
    returns it; `bounds` instead when it is of the right type but out of bounds). A message may name {found} (the
    offending item, shortened), {kind} (the value's JSON kind), and the context's {n}, {k} and {last} (N - 1)."""

    def validate(value: Any, handler: ValidatorFunctionWrapHandler, info: ValidationInfo) -> Any:
        context = {"n": 0, "k": 0, **(info.context or {})}
        try:
            out = handler(value)
        except ValidationError as e:
            error = e.errors()[0]
            if error["type"] == "saved_result":  # an item's own check (e.g. a token's text): keep its place
                raise _fail(error["msg"], _where(error["loc"]) + error["ctx"]["sub"]) from None
            found, message = error.get("input", value), shape
            if error["loc"]:
                message = (bounds if error["type"] in _BOUNDS else None) or items or shape
        else:
            found, message = (None, shape) if check is None else (check(out, context), shape)
            if found is None and item_check is not None:
                found, message = item_check(out, context), items or shape
            if found is None:
                return out
        raise _fail(message.format(found=f"{found!r:.40}", kind=_kind(value), last=context["n"] - 1, **context))

    return Annotated[tp, WrapValidator(validate)]


def _encodable(text: str) -> str:
    problem = encoding_problem(text)  # the views show it; the page must be valid UTF-8
    if problem is not None:
        raise _fail(problem)
    return text


def _beyond(limit: str) -> Any:
    """A check that finds the first item of a list at or beyond the context's `limit` (n or k)."""
    return lambda values, context: next((v for v in values if v >= context[limit]), None)


def _length(limit: str) -> Any:
    """A check that finds a list whose length is not the context's `limit` (n or k)."""
    return lambda values, context: None if len(values) == context[limit] else values


def _table(rows: list[list[float]], context: dict) -> Any:
    return None if len(rows) == context["k"] and all(len(row) == context["n"] for row in rows) else rows


Text = Annotated[str, AfterValidator(_encodable)]
Finite = Annotated[float, Field(allow_inf_nan=False)]  # ints are numbers too; true/false and strings are not
TokenIds = _described(
    list[Annotated[int, Field(ge=0, lt=2**31)]],
    "must be a list of token ids, got {kind}.",
    "must hold token ids (whole numbers from 0), found {found}.",
)
PromptIds = _described(
    TokenIds, "must hold at least one token id: a result explains a prompt.", check=lambda ids, _: None if ids else ids
)
PromptTokens = _described(list[Text], "must be {n} strings, one per token id.", check=_length("n"))
GeneratedTokens = _described(list[Text], "must be {k} strings, one per generated token id.", check=_length("k"))
Positions = _described(
    list[Annotated[int, Field(ge=0)]],
    "must be a list of prompt positions, got {kind}.",
    "must hold prompt positions from 0 to {last}, found {found}.",
    item_check=_beyond("n"),
)
Scores = _described(
    list[list[float]],  # NaN: no score; beyond float32's range: inf (as any score too large to show)
    "must be a {k} x {n} table of numbers (a row per answer token, a column per prompt token).",
    check=_table,
)


def _layer_tables(blocks: list[list[list[float]]], context: dict) -> Any:
    layers = len(blocks[0]) if blocks else 0
    same = all(len(b) == layers and all(len(row) == context["n"] for row in b) for b in blocks)
    return None if len(blocks) == context["k"] and (layers or not blocks) and same else blocks


LayerScores = _described(
    list[list[list[float]]],
    "must be {k} tables (one per answer token) of L rows (one per layer, the same L in each) of {n} numbers.",
    check=_layer_tables,
)
Seconds = _described(Annotated[float, Field(ge=0, lt=1e15, allow_inf_nan=False)], "is a time in seconds, got {found}.")
PositiveInts = _described(
    list[Annotated[int, Field(ge=1, lt=2**31)]], "must be a list, got {kind}.", "must hold positive whole numbers."
)


def _step_series(bounds: str | None = None, item: Any = Finite) -> Any:
    return _described(
        list[item],
        "must be a list of {k} numbers, one per answer token.",
        "must hold finite numbers, found {found}.",
        bounds,
        check=_length("k"),
    )


Probability = Annotated[Finite, Field(ge=0, le=1)]
Entropy = Annotated[Finite, Field(ge=0)]  # nats
Probabilities = _step_series("must hold probabilities from 0 to 1, found {found}.", Probability)
Entropies = _step_series("must hold entropies of 0 or more (nats), found {found}.", Entropy)
Version = _described(
    Annotated[int, Field(ge=0, le=FORMAT_VERSION)],
    f"is {{found}}: this file was written by a newer version of the explainer (this one reads formats 0 to "
    f"{FORMAT_VERSION}); update it to open the file.",
)


class _Record(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)


class MethodRecord(_Record):
    """One method's scores; `z` is recomputed from `raw` when absent; `layers` only where they were written."""

    raw: Scores
    z: Scores | None = None
    seconds: Seconds = 0.0
    meta: dict[str, Any] = {}
    layers: LayerScores | None = None  # (K, L, N) per-layer scores, when written


class ImageRecord(_Record):
    """Where an image prompt's image tokens are: `scores[k, token_positions].reshape(grid)` is a step's image map."""

    token_positions: Positions
    grid: PositiveInts
    size: PositiveInts
    images: list[ImageRecord] | None = None  # several images: each one (the first is also the record itself)

    @model_validator(mode="after")
    def _grid_holds_the_tokens(self) -> ImageRecord:
        h, w = self.grid if len(self.grid) == 2 else (0, 0)
        if len(self.size) != 2 or h * w != len(self.token_positions):
            raise _fail(
                f"grid must be [h, w] with h * w = {len(self.token_positions)} image tokens, and size [width, height]."
            )
        return self


class StepScores(_Record):
    """Per answer token: the model's probability of it, the entropy (nats) of its step's next-token distribution,
    and any further series."""

    model_config = ConfigDict(strict=True, extra="allow", frozen=True)
    __pydantic_extra__: dict[str, _step_series()] = Field(init=False)

    probability: Probabilities | None = None
    entropy: Entropies | None = None


def _share_out_of_range(values: list[float], _: dict) -> Any:
    return next((v for v in values if not (v != v or 0 <= v <= 1)), None)  # NaN: no evidence at that step


LogProbs = _described(
    list[float],  # NaN: the model gave no number; -inf: probability 0
    "must be a list of {k} log-probabilities, one per answer token.",
    "must hold log-probabilities (0 or less), found {found}.",
    check=_length("k"),
    item_check=lambda values, _: next((v for v in values if v > 0), None),
)
Shares = _described(
    list[float],
    "must be a list of {k} shares, one per answer token.",
    "must hold shares from 0 to 1 (or NaN), found {found}.",
    check=_length("k"),
    item_check=_share_out_of_range,
)


class RelianceRecord(_Record):
    """How much each answer token relied on the image (`result/reliance.py`): log p with the image visible and
    hidden from the answer, and each method's share of its evidence on the image against the question's text."""

    logprob: LogProbs
    image_hidden_logprob: LogProbs
    image_share: dict[Text, Shares] = {}
    image_positions: Positions = []
    text_positions: Positions = []
    share_floor: dict[Text, float] = {}


class SavedResult(_Record):
    """A saved result, as `result.result_json` writes it (and, without `format_version`, older versions did)."""

    format_version: Version = 0
    model: str
    prompt_token_ids: PromptIds
    prompt_tokens: PromptTokens
    generated_token_ids: TokenIds = []
    generated_tokens: GeneratedTokens = Field(default=[], validate_default=True)  # K ids need K strings
    user_positions: Positions = []
    methods: dict[Text, MethodRecord] = {}
    meta: dict[str, Any] = {}
    step_scores: StepScores = StepScores()
    image: ImageRecord | None = None
    reliance: RelianceRecord | None = None


_DICT_FIELDS = {"methods", "step_scores", "image_share", "share_floor"}  # their keys are names, shown as ['name']
_GENERIC = {"missing": "is missing.", "string_type": "must be a string", "dict_type": "must be an object",
            "model_type": "must be an object", "list_type": "must be a list", "int_type": "must be a whole number",
            "float_type": "must be a number", "bool_type": "must be true or false"}  # fmt: skip


def _where(loc: tuple) -> str:
    out, parent = "", None
    for part in loc:
        if isinstance(part, int) or (parent in _DICT_FIELDS and part != "[key]"):
            out += f"[{part!r}]"
        elif part == "[key]":
            out += " (a name)"
        else:
            out += f".{part}" if out else part
        parent = part
    return out


def _message(error: dict) -> str:
    where, kind = _where(error["loc"]), error["type"]
    if kind == "saved_result":
        text = error["msg"]
        where += error["ctx"]["sub"]
    elif kind in _GENERIC:
        text = _GENERIC[kind] + ("" if kind == "missing" else f", got {_kind(error.get('input'))}.")
    else:
        text = f"is not valid: {error['msg']}."
    return f"Saved result: {where} {text}" if where else f"Saved result: {text}"


def parse_saved(data: Any) -> SavedResult:
    """Check a parsed JSON value against the format.

    Raises:
        InputError: not an object, or naming the first field that is missing or malformed.
    """
    if not isinstance(data, dict):
        raise InputError(f"A saved result is a JSON object (as `explain --json` writes), got {_kind(data)}.")
    ids, generated = data.get("prompt_token_ids"), data.get("generated_token_ids", [])
    context = {"n": len(ids) if isinstance(ids, list) else 0, "k": len(generated) if isinstance(generated, list) else 0}
    try:
        return SavedResult.model_validate(data, context=context)
    except ValidationError as e:
        raise InputError(_message(e.errors(include_url=False)[0])) from None
    except RecursionError:
        raise InputError("A saved result is nested too deeply.") from None
