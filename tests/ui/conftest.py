"""Fakes for the UI's handlers: no model is loaded, the library's streams are replaced by ones that hand out every
update (the real streams, their merging and cancellation are tested in `test_session.py` and `test_stream.py`).
The handlers are async generators, as Gradio runs them; `collect` drives one to the end."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from explainer.errors import InputError
from explainer.result.attribution import Attribution, MethodScores
from ui import models, stream

ANSWER = [" It", " is", " Paris", "<|im_end|>"]


class FakeModel:
    """Stands for a loaded model: only its identity (the library's per-model lock) is used."""


class FakeBundle:
    name = "fake-tiny"
    max_prompt_tokens = 32
    byte_level = True  # the answer budget is the answer's UTF-8 bytes + 1
    model = FakeModel()


class FakeStream:
    """The part of `explainer.runtime.session.WorkerStream` the UI uses, over a plain iterator, one item per call."""

    def __init__(self, items, on_cancel=None):
        self._items = iter(items)
        self.cancelled = False
        self._on_cancel = on_cancel

    def latest(self, timeout):
        return next(self._items)

    def cancel(self, reason=None):
        self.cancelled = True
        if self._on_cancel:
            self._on_cancel()


def collect(agen) -> list:
    """Run an async generator handler to its end (as Gradio would) and return what it yielded."""

    async def run():
        return [item async for item in agen]

    return asyncio.run(run())


def first_then_close(agen, n: int = 1) -> list:
    """Take `n` updates, then close the handler as Gradio does when the visitor cancels or leaves."""

    async def run():
        out = [await agen.__anext__() for _ in range(n)]
        await agen.aclose()
        return out

    return asyncio.run(run())


def request_fields(request) -> dict:
    """What a test reads of the `ExplainRequest` that reached the library, as `stream_explain`'s keywords (lists for
    tuples, `image` one image or a list), and the request itself."""
    answer = list(request.answer) if isinstance(request.answer, tuple) else request.answer
    return {
        "prompt": request.prompt, "methods": list(request.methods), "max_new_tokens": request.max_new_tokens,
        "chat_template": request.chat_template, "method_options": request.method_options, "answer": answer,
        "image": request.image, "max_image_tokens": request.max_image_tokens, "contrast": dict(request.contrast),
        "request": request,
    }  # fmt: skip


class FakeLibrary:
    """Records calls; streams one `Attribution` per answer token, like the real `stream_request`."""

    def __init__(self):
        self.loads = 0
        self.calls: list[dict] = []
        self.closed = False
        self.cancelled = False
        self.fail_after: int | None = None

    def load_model(self, name=None, **kwargs):
        self.loads += 1
        self.load_options = kwargs
        return FakeBundle()

    def stream_request(self, bundle, request, progress=None, cancel=None):
        if progress is not None:
            progress(0.5, "fake post-hoc method halfway")
        self.calls.append({"bundle": bundle, **request_fields(request)})
        answer = request.answer
        return FakeStream(
            self._stream(request.prompt, list(request.methods), request.max_new_tokens, answer),
            on_cancel=self._cancel,
        )

    def _cancel(self):
        self.cancelled = True

    def _stream(self, prompt, methods, max_new_tokens, given=None):
        try:
            if not prompt.strip():
                raise InputError("The prompt is empty: type a question first.")
            words = [" " + w for w in prompt.split()]
            tokens = ["<|im_start|>", "user", "\n", *words, "<|im_end|>"]
            n = len(tokens)
            answer = ANSWER[:max_new_tokens] if given is None else [" " + w for w in given.split()]
            if len(answer) > max_new_tokens:
                raise InputError(f"The answer has {len(answer)} tokens, more than max_new_tokens ({max_new_tokens}).")
            raw = np.random.default_rng(0).random((len(answer), n)).astype(np.float32)  # (K, N)
            for k in range(1, len(answer) + 1):
                if self.fail_after is not None and k > self.fail_after:
                    raise InputError("Out of memory on the fake device.")
                yield Attribution(
                    model="fake-tiny",
                    prompt_token_ids=list(range(n)),
                    prompt_tokens=tokens,
                    generated_token_ids=list(range(k)),
                    generated_tokens=answer[:k],
                    methods={m: MethodScores.from_raw(raw[:k], seconds=0.01 * k) for m in methods},
                    user_positions=list(range(3, 3 + len(words))),
                    meta={"status": f"fake step {k}", "answer": "generated" if given is None else "given"},
                    step_scores={"probability": [0.5 ** (i + 1) for i in range(k)], "entropy": [1.0] * k},
                )
        finally:
            self.closed = True


@pytest.fixture
def fake(monkeypatch):
    """The text tab's library replaced: `load_model` and `stream_request` record; the embedded model is chosen."""
    lib = FakeLibrary()
    monkeypatch.setattr(models, "model_ids", lambda: (None, None))
    monkeypatch.setattr(models, "load_model", lib.load_model)
    monkeypatch.setattr(stream, "stream_request", lib.stream_request)
    models.forget_models()
    yield lib
    models.forget_models()


def image_attr(k: int, methods, two_images: bool = False) -> Attribution:
    """A fake image-prompt result: 2 x 3 image tokens after two template tokens, then the question; with
    `two_images` a second image of 1 x 2 tokens (20 x 10 pixels) before the question."""
    second = ["<|vision_start|>", "<|image_pad|>", "<|image_pad|>", "<|vision_end|>"] if two_images else []
    tokens = ["<|im_start|>", "<|vision_start|>", *["<|image_pad|>"] * 6, "<|vision_end|>", *second, " What", "?"]
    raw = np.random.default_rng(0).random((k, len(tokens))).astype(np.float32)  # (K, N)
    image = {"token_positions": list(range(2, 8)), "grid": [2, 3], "size": [45, 31]}
    if two_images:
        image = {**image, "images": [image, {"token_positions": [10, 11], "grid": [1, 2], "size": [20, 10]}]}
    return Attribution(
        model="fake-vlm",
        prompt_token_ids=list(range(len(tokens))),
        prompt_tokens=tokens,
        generated_token_ids=list(range(k)),
        generated_tokens=ANSWER[:k],
        methods={m: MethodScores.from_raw(raw) for m in methods},
        user_positions=[len(tokens) - 2, len(tokens) - 1],
        meta={"status": f"fake step {k}"},
        image=image,
    )


class VLFake:
    """A vision-language bundle and stream: records what reaches the library, streams three fake image results."""

    def __init__(self):
        self.calls: list[dict] = []

    def stream(self, bundle, request, progress=None, cancel=None):
        self.calls.append(request_fields(request))
        image, methods = request.image, list(request.methods)
        return FakeStream(image_attr(k, methods, isinstance(image, list)) for k in range(1, 4))


@pytest.fixture
def vl_fake(fake, monkeypatch):
    """The image tab's library replaced: a fake vision-language model is configured and loads."""

    class VLBundle(FakeBundle):
        name = "fake-vlm"
        image_processor = object()

    lib = VLFake()
    monkeypatch.setattr(models, "model_ids", lambda: (None, "fake-vlm"))
    monkeypatch.setattr(models, "load_model", lambda name=None, **kwargs: VLBundle())
    monkeypatch.setattr(stream, "stream_request", lib.stream)
    return lib


@pytest.fixture
def no_model(monkeypatch):
    """Any request for a model fails the test: saved results and links open without one."""
    def refuse(*args, **kwargs):
        raise AssertionError("a model was asked for")

    monkeypatch.setattr(models, "get_bundle", refuse)
    monkeypatch.setattr(models, "load_model", refuse)
