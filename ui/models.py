"""The models the app runs: chosen and loaded in this one place, once per process, and shared read-only.

`EXPLAINER_MODEL` / `EXPLAINER_VLM` choose them, else Hub models chosen by the hardware's memory when the Hub answers,
else the embedded model and no image questions (`models.loading.default_model_ids`). The Hub is asked when a model is
first needed (or by `main()`), never at import. `get_bundle()` / `get_vl_bundle()` load on a tab's first request,
serialised by a lock; a page visit loads nothing, and one id is loaded once (one vision-language model may serve both
tabs). A loaded bundle is handed out without taking any lock.

On ZeroGPU, `preload` creates both at start-up in the main thread, as `spaces` requires, and nothing loads after: a
model that failed then is not tried again from a request's thread (CUDA must not be initialised there, and `spaces`
forks its GPU worker from the main process, where a lock held by another thread would stay held in the worker for
good). Its requests get a `ModelLoadError` saying it failed at start-up and why.
"""

from __future__ import annotations

import functools
import logging
import os
import threading

from explainer import load_model
from explainer.errors import ExplainerError, InputError, ModelLoadError
from explainer.methods import calibration
from explainer.models.loading import (
    EMBEDDED_MODEL,
    HUB_VISION_MODEL,
    ModelBundle,
    default_model_ids,
    load_dtype,
    parse_device_map,
)
from explainer.runtime.hardware import zero_gpu
from explainer.runtime.precision import dtype_name, model_dtype, precision_label

from .guards.errors import user_errors
from .guards.markup import markdown_code, markdown_text

# No angle brackets: the page draws Markdown as HTML, where "<hub id>" was read as a tag and cut the line short.
NO_VLM = (
    f"**Image questions are off:** they need a vision-language model. The default, {HUB_VISION_MODEL}, comes from the "
    "Hugging Face Hub and is used only when `EXPLAINER_VLM` is unset and the Hub is reachable. To turn them on, "
    "restart the app with `EXPLAINER_VLM` set to a Hub id or a local folder of any Qwen2.5-VL or Qwen2-VL size, e.g. "
    f"`EXPLAINER_VLM={HUB_VISION_MODEL} python app.py`."
)
_load_lock = threading.Lock()  # serialises loading; never taken to hand out a loaded bundle (see `_bundle`)
logger = logging.getLogger(__name__)


@functools.cache
def model_ids() -> tuple[str | None, str | None]:
    """(text model, vision-language model) ids; None: the embedded text model, or no image questions. Decided once."""
    return default_model_ids()


_bundles: dict[str | None, ModelBundle] = {}  # model id -> its bundle, loaded once
_failed: dict[str | None, str] = {}  # model id -> why its preload failed (ZeroGPU, where nothing loads later)


def _options() -> dict:
    """`load_model`'s options from the environment.

    EXPLAINER_DTYPE: auto (bfloat16 on a GPU and on a CPU with native bf16, else float32), float32, bfloat16 or
    float16; EXPLAINER_DEVICE_MAP=auto spreads a model too big for one GPU over all of them (accelerate's dispatch);
    on ZeroGPU the model goes to "cuda" in the main thread (`preload`), where `spaces` intercepts the move.
    """
    return {
        "device": "cuda" if zero_gpu() else None,
        "dtype": os.environ.get("EXPLAINER_DTYPE") or None,
        "device_map": parse_device_map(os.environ.get("EXPLAINER_DEVICE_MAP")),
    }


def _load(model_id: str | None) -> ModelBundle:
    """The bundle of `model_id`, loaded on first use; the caller holds `_load_lock`."""
    if model_id not in _bundles:
        _bundles[model_id] = load_model(model_id, **_options())
        _failed.pop(model_id, None)
    return _bundles[model_id]


def preload() -> None:
    """Load both models now, in the calling thread: on ZeroGPU `spaces` intercepts `.to("cuda")` only in the thread
    that imported it, so, as its examples do, the models are created at start-up in the main thread. A model that
    fails to load is logged and its reason kept: its tab's requests report it (`_bundle`), and it is not tried again."""
    text, vision = model_ids()
    for model_id in dict.fromkeys([text] if vision is None else [text, vision]):
        try:
            with _load_lock:  # before the server starts: no request, so no GPU worker is forked while it is held
                _load(model_id)
        except ExplainerError as e:
            _failed[model_id] = str(e)
            logger.warning("Could not preload %s", model_id or EMBEDDED_MODEL, exc_info=True)


def _bundle(model_id: str | None) -> ModelBundle:
    """The bundle of `model_id`. A loaded one is a plain dict read, without a lock: `spaces` forks its GPU worker
    from the main process while other threads run, and a lock one of them held at that moment would stay held in
    the worker. On ZeroGPU nothing loads after start-up (`preload`).

    Raises:
        ModelLoadError: on ZeroGPU, the model failed to load at start-up (the message says why), or a loading error.
    """
    bundle = _bundles.get(model_id)
    if bundle is not None:
        return bundle
    if zero_gpu():
        raise ModelLoadError(_not_loaded(model_id))
    with _load_lock:
        return _load(model_id)


def _not_loaded(model_id: str | None) -> str:
    """Why a model is missing on ZeroGPU, where models load only at start-up."""
    name = model_id or EMBEDDED_MODEL
    what = "was not loaded at start-up."
    if model_id in _failed:
        what = f"failed to load when the Space started: {_failed[model_id]}"
    return (
        f"The model {name!r} {what} On ZeroGPU the models load only at start-up, so fix the cause (the model id, "
        "EXPLAINER_* variables, the hardware) and restart the Space."
    )


def _precision(bundle: ModelBundle) -> str:
    """The precision for the model lines, e.g. " · bfloat16 on cpu", " · bfloat16 on ZeroGPU" (whose GPU is
    attached per request: in the main process the weights report the CPU); "" for a model without weights."""
    label = precision_label(bundle.model)
    if label and zero_gpu():
        label = f"{label.partition(' on ')[0]} on ZeroGPU"
    return f" · {label}" if label else ""


def get_bundle() -> ModelBundle:
    """The process-wide text model bundle: loaded on first use, then shared read-only (see `_bundle`)."""
    return _bundle(model_ids()[0])


def get_vl_bundle() -> ModelBundle:
    """The process-wide vision-language bundle, loaded on first use like `get_bundle`.

    Raises:
        InputError: no vision-language model is configured (the message says how to set one).
        ModelLoadError: as `get_bundle`.
    """
    vlm = model_ids()[1]
    if vlm is None:
        raise InputError(NO_VLM.replace("**", "").replace("`", ""))
    return _bundle(vlm)


def loaded_models() -> int:
    """How many bundles this process has loaded."""
    return len(_bundles)


def loaded_bundles() -> list[ModelBundle]:
    """The bundles this process has loaded, each once."""
    return list({id(b): b for b in _bundles.values()}.values())


def forget_models() -> None:
    """Drop the loaded bundles (the next request loads again); for tests and for a process that switches models."""
    with _load_lock:
        _bundles.clear()
        _failed.clear()


@user_errors
def model_info() -> str:
    """Markdown line naming the text model; a page visit loads nothing (the model loads with the first request)."""
    model_id = model_ids()[0]
    bundle = _bundles.get(model_id)
    if bundle is None and model_id in _failed:
        name, why = markdown_code(model_id or EMBEDDED_MODEL), markdown_text(_failed[model_id])
        return f"**Model:** {name} · failed to load at start-up: {why}"
    if bundle is None:
        return f"**Model:** {markdown_code(model_id or EMBEDDED_MODEL)} · loads with the first request"
    name = markdown_code(bundle.name)
    return f"**Model:** {name}{markdown_text(_precision(bundle))} · prompts up to {bundle.max_prompt_tokens} tokens"


@functools.cache
def _config(model_id: str | None):
    """A model's configuration, read once without its weights (`calibration.model_config`)."""
    return calibration.model_config(model_id)


def calibrated(vision: bool = False) -> tuple[str, bool] | None:
    """(the text or vision-language model's name, whether `macs_calibrated` has weights for it), from the loaded
    model, else from its configuration (a page visit loads no model); None when there is no such model or its
    configuration cannot be read (a request then says why)."""
    text, vlm = model_ids()
    if vision and vlm is None:
        return None
    model_id = vlm if vision else text
    bundle = _bundles.get(model_id)
    model = getattr(bundle, "model", None)
    try:
        source = model if hasattr(model, "config") else _config(model_id)
    except ExplainerError:
        return None
    return model_id or EMBEDDED_MODEL, calibration.available(source)


def vlm_configured() -> bool:
    """Whether the app has a vision-language model (the image tab's controls are shown only then)."""
    return model_ids()[1] is not None


@user_errors
def vlm_info() -> str:
    """Markdown line on the image tab: the vision-language model, or why there is none and how to set one."""
    vlm = model_ids()[1]
    if vlm is None:
        return NO_VLM
    bundle = _bundles.get(vlm)
    if bundle is None and vlm in _failed:
        why = markdown_text(_failed[vlm])
        return f"**Vision-language model:** {markdown_code(vlm)} · failed to load at start-up: {why}"
    if bundle is None:
        return f"**Vision-language model:** {markdown_code(vlm)} · loads with the first image question"
    if getattr(bundle, "image_processor", None) is None:
        return f"**{markdown_code(bundle.name)} reads text only.** {NO_VLM}"
    return (
        f"**Vision-language model:** {markdown_code(bundle.name)}{markdown_text(_precision(bundle))} · the image is "
        "resized to a bounded number of image tokens"
    )


def _summary(model_id: str | None) -> str:
    name = model_id or EMBEDDED_MODEL
    bundle = _bundles.get(model_id)
    if bundle is not None:
        dtype = model_dtype(bundle.model)
        return f"{name} ({dtype_name(dtype) if dtype else 'no weights'}, loaded)"
    if model_id in _failed:
        return f"{name} (failed to load: {_failed[model_id]})"
    options = _options()
    try:
        dtype = dtype_name(load_dtype(options["dtype"], options["device"]))
    except ExplainerError:
        dtype = f"unknown dtype {options['dtype']!r}"
    return f"{name} ({dtype}, loads with its tab's first request)"


def summary() -> str:
    """The models for the start-up log: each with its dtype and whether it is loaded (or why it failed to load)."""
    text, vision = model_ids()
    if vision is not None and vision == text:
        return f"one model for both tabs: {_summary(text)}"
    return f"text model {_summary(text)}; image model {_summary(vision) if vision else 'none'}"
