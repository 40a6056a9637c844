"""One explain request as one object: what to explain and how, validated once, when it is built.

Every front end builds an `ExplainRequest` (the friendly `explain(bundle, prompt, ...)`, the app's tabs, the CLI) and
hands it whole to the library (`explain.stream_request`), which runs it in the model's worker thread and drives the
decode loop from it. Everything that can be checked without the model is checked here, in `__post_init__`, so a bad
field fails at once with a message a user can act on, before any model work. The checks that need the model (token
ids inside its vocabulary, prompt plus answer within its context and memory, a text answer's length in tokens) are
made in one place, when the request meets the bundle (`explain.py`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .errors import InputError
from .methods import AttributionMethod, get_method, method_class, method_config
from .models.answer import MAX_NEW_TOKENS_LIMIT, answer_budget
from .models.tokens import check_encodable
from .result.spans import GRANULARITIES

Method = str | AttributionMethod
Answer = str | tuple[int, ...] | None


@dataclass(frozen=True)
class ExplainRequest:
    """An explain request, validated when built (`InputError` or `UnknownMethodError` say what is wrong).

    Attributes:
        prompt: the user's text (for an image prompt, the question about the images).
        methods: registered method names (canonical, each once, in order) or method instances used as they are.
        method_options: {method name: {option: value}} of the named methods, converted and validated by the method's
            config (`methods.method_config`); options of methods not chosen are dropped.
        max_new_tokens: the answer's length bound, 1 to `MAX_NEW_TOKENS_LIMIT` (greedy decoding stops earlier at an
            end-of-sequence token); a given answer is explained in full: `fit_answer` raises the bound to hold it.
        chat_template: wrap the prompt in the tokenizer's chat template (when it has one).
        images: the images the prompt asks about, in order (paths or PIL images); empty for a text prompt.
        max_image_tokens: with images, at most this many merged image tokens in all (None: the bundle's budget).
        answer: None to generate; else the answer to explain, teacher-forced: text (never blank: blank is None) or
            token ids (a tuple of whole numbers, at most `MAX_NEW_TOKENS_LIMIT` of them).
        contrast: {0-based step: foil (token id or one-token text)}: there the contrastive methods explain
            "why this token rather than the foil?" (`explainer/contrast.py`).
        unit: the prompt units the views group scores by: "token", "word" or "sentence" (the library ignores it).
        reliance: for an image prompt, measure how much each answer token relied on the image after the methods
            (`Attribution.reliance`, `explainer/reliance.py`: one extra batched pass over the answer).
    """

    prompt: str
    methods: tuple[Method, ...] = ("macs",)
    method_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    max_new_tokens: int = 64
    chat_template: bool = True
    images: tuple[Any, ...] = ()
    max_image_tokens: int | None = None
    answer: Answer = None
    contrast: Mapping[int, str | int] = field(default_factory=dict)
    unit: str = "token"
    reliance: bool = True

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # frozen: each field is normalised once, here
        new = self.max_new_tokens
        if isinstance(new, bool) or not isinstance(new, int) or not 1 <= new <= MAX_NEW_TOKENS_LIMIT:
            raise InputError(f"max_new_tokens must be between 1 and {MAX_NEW_TOKENS_LIMIT}, got {new!r:.40}.")
        set_(self, "images", _images(self.images))
        _check_prompt(self.prompt, bool(self.images))
        set_(self, "chat_template", bool(self.chat_template))
        set_(self, "methods", _methods(self.methods, bool(self.images)))
        set_(self, "method_options", _options(self.method_options, self.methods))
        if self.max_image_tokens is not None and (
            isinstance(self.max_image_tokens, bool) or not isinstance(self.max_image_tokens, int)
            or self.max_image_tokens < 1
        ):  # fmt: skip
            raise InputError(f"max_image_tokens must be a positive integer, got {self.max_image_tokens!r:.40}.")
        set_(self, "answer", _answer(self.answer))
        set_(self, "contrast", _contrast(self.contrast, self.num_steps))
        set_(self, "reliance", bool(self.reliance))
        if self.unit not in GRANULARITIES:
            raise InputError(f"Prompt units must be one of {', '.join(GRANULARITIES)}, got {self.unit!r:.40}.")

    @classmethod
    def build(
        cls,
        prompt: str,
        methods: Sequence[Method] | Method = ("macs",),
        max_new_tokens: int = 64,
        chat_template: bool = True,
        method_options: Mapping[str, Mapping[str, Any]] | None = None,
        image: Any = None,
        max_image_tokens: int | None = None,
        answer: str | Sequence[int] | None = None,
        contrast: Mapping[int, str | int] | None = None,
        unit: str = "token",
        reliance: bool = True,
    ) -> ExplainRequest:
        """A request from `stream_explain`'s keywords: `image` is None, one image, or a list of them in order."""
        if image is not None and isinstance(image, list | tuple) and not image:
            raise InputError("No image given: upload at least one.")
        images = () if image is None else tuple(image) if isinstance(image, list | tuple) else (image,)
        return cls(
            prompt, methods, {} if method_options is None else method_options, max_new_tokens, chat_template, images,
            max_image_tokens, answer, {} if contrast is None else contrast, unit, reliance,
        )  # fmt: skip

    def replace(self, **changes: Any) -> ExplainRequest:
        """A copy with `changes`, validated again."""
        return dataclasses.replace(self, **changes)

    @property
    def image(self) -> Any:
        """The images as `models.vision.encode_image_prompt` takes them: None, one image, or a list in order."""
        if not self.images:
            return None
        return self.images[0] if len(self.images) == 1 else list(self.images)

    @property
    def method_names(self) -> tuple[str, ...]:
        """The methods' names, in order."""
        return tuple(_name(m) for m in self.methods)

    @property
    def num_steps(self) -> int:
        """The most answer tokens the request can explain: a given answer's ids, else `max_new_tokens`."""
        return len(self.answer) if isinstance(self.answer, tuple) else self.max_new_tokens

    def instances(self) -> list[AttributionMethod]:
        """The methods as instances for one run: a new instance of each named method (they keep per-run state)."""
        return [
            m if isinstance(m, AttributionMethod) else get_method(m, **self.method_options.get(m, {}))
            for m in self.methods
        ]


def fit_answer(bundle: Any, request: ExplainRequest) -> ExplainRequest:
    """The one rule for a given answer's length, which every front end follows (`explain.stream_request` applies
    it; the app applies it before it sizes the request): a given answer is explained in full, its request's
    `max_new_tokens` raised to hold it (`models.answer.answer_budget`: the ids' count, a text's bound before it is
    tokenised), never lowered, up to `MAX_NEW_TOKENS_LIMIT`; an answer beyond the limit is refused
    (`answer_too_long`). `bundle`: the `ModelBundle` whose tokenizer reads a text answer."""
    fitted = answer_budget(bundle, request.answer, request.max_new_tokens)
    return request if fitted == request.max_new_tokens else request.replace(max_new_tokens=fitted)


def answer_too_long(tokens: int, max_new_tokens: int) -> InputError:
    """The error of an answer with more tokens than `max_new_tokens` (ids here, text once it is tokenised)."""
    if max_new_tokens >= MAX_NEW_TOKENS_LIMIT:  # nothing to raise (the app raises it to fit an answer, up to here)
        return InputError(
            f"The answer has {tokens} tokens; at most {MAX_NEW_TOKENS_LIMIT} answer tokens can be explained. Shorten "
            "the answer."
        )
    return InputError(
        f"The answer has {tokens} tokens, more than max_new_tokens ({max_new_tokens}). Raise max new tokens (at most "
        f"{MAX_NEW_TOKENS_LIMIT}, and prompt plus answer must fit the model's context) or shorten the answer."
    )


def check_vocabulary(ids: Sequence[int], vocab_size: int) -> None:
    """Refuse answer ids outside the model's embedding (an InputError, never an index error on the device)."""
    for t in ids:
        if t >= vocab_size:
            raise InputError(f"Answer token ids must be whole numbers from 0 to {vocab_size - 1}, found {t!r:.40}.")


def _images(images: Any) -> tuple[Any, ...]:
    if not isinstance(images, tuple | list):
        raise InputError(f"images must be a list of images (paths or PIL images), got {type(images).__name__}.")
    if any(one is None for one in images):
        raise InputError("No image given: upload at least one.")
    return tuple(images)


def _check_prompt(prompt: Any, image: bool) -> None:
    what = "The question" if image else "The prompt"
    if prompt is not None and not isinstance(prompt, str):
        raise InputError(f"{what} must be text, got {type(prompt).__name__}.")
    if prompt is None or not prompt.strip():
        empty = "ask something about the image" if image else "type a question or some text to continue"
        raise InputError(f"{what} is empty: {empty}.")
    check_encodable(prompt, what)


def _methods(methods: Any, image: bool) -> tuple[Method, ...]:
    """Canonical names (each once, in order) and instances; with images, only methods that explain them."""
    given = [methods] if isinstance(methods, str | AttributionMethod) else list(methods or ())
    out: list[Method] = []
    for m in given:
        if not isinstance(m, AttributionMethod | str):
            raise InputError(f"A method is a registered name or an AttributionMethod, got {type(m).__name__}.")
        name = m.name if isinstance(m, AttributionMethod) else method_class(m).name
        if name not in {x if isinstance(x, str) else x.name for x in out}:
            out.append(m if isinstance(m, AttributionMethod) else name)
    if not out:
        raise InputError("Choose at least one attribution method.")
    if image:
        refused = [_name(m) for m in out if not _explains_images(m)]
        if refused:
            raise InputError(f"{', '.join(refused)} cannot explain image prompts; choose other methods.")
    return tuple(out)


def _name(m: Method) -> str:
    return m if isinstance(m, str) else m.name


def _explains_images(m: Method) -> bool:
    cls = method_class(m) if isinstance(m, str) else m
    return bool(getattr(cls, "explains_images", cls.streaming))


def _options(options: Any, methods: tuple[Method, ...]) -> dict[str, dict[str, Any]]:
    """The named methods' options, converted by their configs: {name: {option: value}}."""
    if not isinstance(options, Mapping) or not all(isinstance(v, Mapping) for v in options.values()):
        raise InputError("method_options must map method names to dicts of options, e.g. {'macs': {'alpha': 0.5}}.")
    named = {m for m in methods if isinstance(m, str)}
    out: dict[str, dict[str, Any]] = {}
    for key, raw in options.items():
        name = method_class(str(key)).name  # an unknown name is an error, not silently dropped
        if name in named:
            config = method_config(name, **raw)
            out[name] = {k: getattr(config, k) for k in raw}
    return out


def _answer(answer: Any) -> Answer:
    """None (also for blank text), the text as given, or the ids as a tuple of whole numbers that fits."""
    if answer is None:
        return None
    if isinstance(answer, str):
        check_encodable(answer, "The answer")
        return answer if answer.strip() else None
    ids = _token_ids(answer)
    if len(ids) > MAX_NEW_TOKENS_LIMIT:  # within it, `fit_answer` raises the bound to hold them
        raise answer_too_long(len(ids), MAX_NEW_TOKENS_LIMIT)
    return ids


def _token_ids(ids: Any) -> tuple[int, ...]:
    if isinstance(ids, bytes) or not isinstance(ids, Sequence | np.ndarray | torch.Tensor):
        raise InputError(f"Answer token ids must be a list of whole numbers, got {type(ids).__name__}.")
    out = []
    for t in list(ids.tolist() if isinstance(ids, np.ndarray | torch.Tensor) else ids):
        if isinstance(t, bool) or not isinstance(t, int | np.integer) or int(t) < 0:
            raise InputError(f"Answer token ids must be whole numbers of at least 0, found {t!r:.40}.")
        out.append(int(t))
    if not out:
        raise InputError("The answer has no tokens: give at least one token id, or no answer to generate one.")
    return tuple(out)


def _contrast(contrast: Any, steps: int) -> dict[int, str | int]:
    """{step: foil} with each step inside the answer's bound and each foil a token id or a non-empty text."""
    if not isinstance(contrast, Mapping):
        raise InputError("contrast maps steps to foils, e.g. {0: ' London'}.")
    for step, foil in contrast.items():
        if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < steps:
            raise InputError(
                f"Contrast step {step!r:.40} is not a step of the answer (at most {steps} steps: 0 to {steps - 1}, "
                "0-based in Python; 1-based in the CLI and the app)."
            )
        if isinstance(foil, bool) or not isinstance(foil, int | str):
            raise InputError(f"A foil is a token id or a token's text, got {type(foil).__name__}.")
        if isinstance(foil, int) and foil < 0:
            raise InputError(f"Foil id {foil} is outside the vocabulary.")
        if foil == "":
            raise InputError("The foil is empty: pick one of the model's alternatives or type a token.")
    return dict(contrast)
