"""Image + question inputs for vision-language models (Qwen2.5-VL, Qwen2-VL), without torchvision.

MACS paper, Appendix B: the image is split into patches that enter the language model as ordinary prompt tokens, so
the per-step [K x N] maps of every method cover them; an image map is that row restricted to the image tokens and
reshaped to the merged patch grid.

`Qwen2_5_VLProcessor` needs torchvision in transformers 5.x, so the prompt is built from its two halves: the
PIL/numpy image processor gives `pixel_values` and `image_grid_thw`, the tokenizer the text, in which the single
image placeholder is expanded to `grid_t * grid_h * grid_w / merge_size**2` tokens. Qwen's 3D rotary positions
(mRoPE) are computed once for the prompt with the model's own `get_rope_index` and passed explicitly, so the model's
cached `rope_deltas` attribute is never written; decode steps continue from the last prompt position (see
`decoding.generate_steps`).

Per-architecture facts live in `VISION_ADAPTERS` (one entry per `model_type`); token ids, patch and merge sizes come
from the model's config and the image processor.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from ..errors import InputError, ModelLoadError, UnsupportedModelError
from .images import data_url_bytes as data_url_bytes  # re-exported: the image tab imports it from here
from .images import load_image
from .tokens import check_encodable

MIN_TOKENS_PER_IMAGE = 4  # merged tokens: several images share one budget, and each needs a readable map
DEFAULT_MAX_IMAGE_TOKENS = 256  # default pixel budget, in merged image tokens: keeps CPU prompts short
DEFAULT_MIN_IMAGE_TOKENS = 4


@dataclass(frozen=True)
class VisionAdapter:
    """What differs between vision-language architectures.

    Attributes:
        model_class: transformers class name of the image-text-to-text model.
        image_processor_class: (module, class) of the PIL/numpy image processor (works without torchvision).
        rope_index: returns the method computing (3, B, N) multimodal positions for a loaded model.
    """

    model_class: str
    image_processor_class: tuple[str, str]
    rope_index: Callable[[Any], Callable[..., tuple[torch.Tensor, torch.Tensor]]]


_QWEN_PROCESSOR = ("transformers.models.qwen2_vl.image_processing_pil_qwen2_vl", "Qwen2VLImageProcessorPil")
VISION_ADAPTERS: dict[str, VisionAdapter] = {
    "qwen2_5_vl": VisionAdapter(
        "Qwen2_5_VLForConditionalGeneration", _QWEN_PROCESSOR, lambda m: m.model.get_rope_index
    ),
    "qwen2_vl": VisionAdapter("Qwen2VLForConditionalGeneration", _QWEN_PROCESSOR, lambda m: m.model.get_rope_index),
}


def adapter_for(config: Any) -> VisionAdapter | None:
    """The adapter of a model config, or None for text-only architectures."""
    return VISION_ADAPTERS.get(getattr(config, "model_type", None))


def pixel_factor(image_processor: Any) -> int:
    """Side in pixels of one merged image token (patch_size * merge_size)."""
    return int(image_processor.patch_size) * int(image_processor.merge_size)


def load_image_processor(
    source: str | None, config: Any, min_pixels: int | None = None, max_pixels: int | None = None
) -> Any:
    """The adapter's image processor from `source`, with the pixel budget bounded.

    Args:
        source: hub id or folder (its preprocessor_config.json is used when present); None: the class defaults.
        config: the model config (selects the adapter, checks the merge size).
        min_pixels, max_pixels: resized-image area bounds; default `DEFAULT_MIN/MAX_IMAGE_TOKENS` merged tokens.
    """
    adapter = adapter_for(config)
    if adapter is None:
        raise UnsupportedModelError(f"{getattr(config, 'model_type', '?')} is not a supported vision-language model.")
    module, name = adapter.image_processor_class
    cls = getattr(importlib.import_module(module), name)
    try:
        processor = cls.from_pretrained(source) if source is not None else cls()
    except (OSError, ValueError):  # no preprocessor_config.json: the class defaults are Qwen's
        processor = cls()
    merge = getattr(config.vision_config, "spatial_merge_size", None)
    if merge is not None:
        processor.merge_size = int(merge)
    patch = getattr(config.vision_config, "patch_size", None)
    if patch is not None:
        processor.patch_size = int(patch)
    factor = pixel_factor(processor)
    lo = min_pixels if min_pixels is not None else DEFAULT_MIN_IMAGE_TOKENS * factor**2
    hi = max_pixels if max_pixels is not None else DEFAULT_MAX_IMAGE_TOKENS * factor**2
    if not 0 < lo <= hi:
        raise InputError(f"Need 0 < min_pixels <= max_pixels, got min_pixels={lo}, max_pixels={hi}.")
    processor.size = {"shortest_edge": int(lo), "longest_edge": int(hi)}
    return processor


@dataclass
class ImagePrompt:
    """A tokenised question about one or more images.

    Attributes:
        input_ids: (1, N) token ids, image placeholders expanded.
        user_positions: positions of the question's text tokens.
        image_positions: the prompt positions of every image token, image after image, each row-major over its grid.
        grid: (h, w) merged patch grid of the first image.
        size: (W, H) of the first image as loaded (before the processor's resize).
        prefill_inputs: extra keyword inputs of the prefill forward: pixel_values (P, C*t*p*p), image_grid_thw
            (I, 3) for I images and position_ids (3, 1, N).
        text: the string that was tokenised, with one placeholder per image (see `expanded_text`).
        images: per image, in order, `{"token_positions", "grid": [h, w], "size": [W, H]}`.
        pad: the image placeholder token.
    """

    input_ids: torch.Tensor
    user_positions: list[int]
    image_positions: list[int]
    grid: tuple[int, int]
    size: tuple[int, int]
    prefill_inputs: dict[str, torch.Tensor]
    text: str
    images: list[dict] = None  # type: ignore[assignment]
    pad: str = ""

    def record(self) -> dict:
        """The `Attribution.image` record: the first image's keys (readers of single-image results keep working)
        and, for several images, `images` listing each."""
        first = {"token_positions": list(self.image_positions), "grid": list(self.grid), "size": list(self.size)}
        if self.images and len(self.images) > 1:
            first = {**self.images[0], "images": [dict(i) for i in self.images]}
        return first

    def expanded_text(self) -> str:
        """`text` with each image's placeholder repeated once per image token, as it was tokenised."""
        counts = [len(i["token_positions"]) for i in self.images or [{"token_positions": self.image_positions}]]
        return _expand(self.text, self.pad, counts)


def _expand(text: str, pad: str, counts: list[int]) -> str:
    """`text` with its i-th `pad` repeated counts[i] times."""
    parts = text.split(pad)
    if len(parts) != len(counts) + 1:
        raise UnsupportedModelError(f"The chat template changed the number of image placeholders {pad!r}.")
    return parts[0] + "".join(pad * n + rest for n, rest in zip(counts, parts[1:], strict=True))


def _token(tokenizer: Any, token_id: int) -> str:
    tok = tokenizer.convert_ids_to_tokens(int(token_id))
    if tok is None:
        raise UnsupportedModelError(f"The tokenizer has no token with id {token_id} that the model config names.")
    return tok


def _preprocess(processor: Any, img: Image.Image, max_image_tokens: int | None) -> Any:
    """The processor's output for one image, resized to at most `max_image_tokens` merged tokens when given."""
    size = None
    factor = pixel_factor(processor)
    if max_image_tokens is not None:
        if not isinstance(max_image_tokens, int) or max_image_tokens < 1:
            raise InputError(f"max_image_tokens must be a positive integer, got {max_image_tokens!r}.")
        hi = max_image_tokens * factor**2
        size = {"shortest_edge": min(int(processor.size["shortest_edge"]), hi), "longest_edge": hi}

    def run(size: dict[str, int] | None) -> Any:
        try:
            return processor(images=[img], return_tensors="pt", **({"size": size} if size else {}))
        except (ValueError, RuntimeError) as e:
            raise InputError(f"The image processor refused the image: {e}") from e

    out = run(size)
    merge = int(processor.merge_size)
    if size is not None and int(out["image_grid_thw"].prod()) // merge**2 > max_image_tokens:
        # Qwen's resizer rounds an upscaled small image up on both sides, which can pass the budget: upscale no
        # further than one merged token (elongated images may still need one token per side)
        out = run({"shortest_edge": factor**2, "longest_edge": size["longest_edge"]})
    return out


def _tokenize(bundle: Any, question: str, counts: list[int], chat_template: bool):
    """The prompt text (one `<|image_pad|>` per image), its ids with image i's placeholder expanded to counts[i]
    tokens, the image tokens' positions, the question's positions and the placeholder."""
    tok, cfg = bundle.tokenizer, bundle.model.config
    pad, start, end = (_token(tok, i) for i in (cfg.image_token_id, cfg.vision_start_token_id, cfg.vision_end_token_id))
    content = f"{start}{pad}{end}" * len(counts) + question
    if chat_template and bundle.has_chat_template:
        text = tok.apply_chat_template(
            [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
        )
    else:
        text = content
    q_start = text.rfind(question)
    expanded = _expand(text, pad, counts)
    shift = len(pad) * (sum(counts) - len(counts))  # every placeholder comes before the question
    enc = tok(expanded, add_special_tokens=False, return_offsets_mapping=True)
    ids = list(enc["input_ids"])
    image_positions = [i for i, v in enumerate(ids) if v == cfg.image_token_id]
    if len(image_positions) != sum(counts):
        raise UnsupportedModelError(
            f"The tokenizer split the image placeholders {pad!r} into {len(image_positions)} image tokens instead of "
            f"{sum(counts)}; tokenizer and model config disagree."
        )
    q_lo, q_hi = q_start + shift, q_start + shift + len(question)
    user_positions = [i for i, (s, e) in enumerate(enc["offset_mapping"]) if e > s and s < q_hi and e > q_lo]
    return text, ids, image_positions, user_positions, pad


def images_budget(processor: Any, count: int, max_image_tokens: int | None) -> int | None:
    """Each image's share of the merged-token budget when `count` images share it (one image: the budget as given).

    Raises:
        InputError: the share would fall below `MIN_TOKENS_PER_IMAGE`.
    """
    if count == 1:
        return max_image_tokens
    total = max_image_tokens
    if total is None:  # the processor's own budget, shared
        total = int(processor.size["longest_edge"]) // pixel_factor(processor) ** 2
    each = int(total) // count
    if each < MIN_TOKENS_PER_IMAGE:
        raise InputError(
            f"{count} images do not fit in {total} image tokens (each needs at least {MIN_TOKENS_PER_IMAGE}): raise "
            "the image detail (max_image_tokens) or give fewer images."
        )
    return each


def _pixels(processor: Any, image: Any, max_image_tokens: int | None) -> tuple[list, torch.Tensor, torch.Tensor]:
    """The loaded images (one, or a list in order), their (I, 3) grids (t, h, w in patches) and their pixel values
    (P, C * t_patch * p * p), image after image, each resized to its share of the budget."""
    given = list(image) if isinstance(image, list | tuple) else [image]
    if not given:
        raise InputError("No image given: upload at least one.")
    named = len(given) > 1 and not isinstance(given[0], str | os.PathLike)  # paths name themselves
    imgs = [load_image(one, f"#{i + 1}" if named else None) for i, one in enumerate(given)]
    each = images_budget(processor, len(imgs), max_image_tokens)
    outs = [_preprocess(processor, img, each) for img in imgs]
    return imgs, torch.cat([o["image_grid_thw"] for o in outs]), torch.cat([o["pixel_values"] for o in outs])


def _records(imgs: list, grid_thw: torch.Tensor, counts: list[int], positions: list[int], merge: int) -> list[dict]:
    """Each image's `{"token_positions", "grid": [h, w] merged, "size": [W, H]}`, its tokens the next run of
    `positions`."""
    records, start = [], 0
    for img, row, count in zip(imgs, grid_thw, counts, strict=True):
        grid = [int(row[1]) // merge, int(row[2]) // merge]
        records.append({"token_positions": positions[start : start + count], "grid": grid, "size": list(img.size)})
        start += count
    return records


def encode_image_prompt(
    bundle: Any,
    image: str | Path | Image.Image | list,
    question: str,
    chat_template: bool = True,
    max_new_tokens: int = 0,
    max_image_tokens: int | None = None,
) -> ImagePrompt:
    """Preprocess one image, or several in order (a list), and a question for the bundle's vision-language model.

    `max_image_tokens` lowers or raises the pixel budget for this request only: the images are resized to at most
    that many merged image tokens in all, shared equally (default: the budget the image processor was loaded with).

    Raises:
        UnsupportedModelError: the bundle's model is text-only.
        InputError: bad image, empty question, or prompt too long.
    """
    model = bundle.model
    adapter = adapter_for(model.config)
    processor = getattr(bundle, "image_processor", None)
    if adapter is None or processor is None:
        raise UnsupportedModelError(
            f"{bundle.name!r} is a text-only model. Image questions need a vision-language model such as "
            "Qwen/Qwen2.5-VL-3B-Instruct: pass --model ID_OR_FOLDER (CLI) or set EXPLAINER_VLM (app)."
        )
    if question is None or not str(question).strip():
        raise InputError("The question is empty: ask something about the image.")
    question = str(question)
    check_encodable(question, "The question")
    imgs, grid_thw, pixel_values = _pixels(processor, image, max_image_tokens)
    merge = int(processor.merge_size)
    counts = [int(row.prod()) // merge**2 for row in grid_thw]
    text, ids, image_positions, user_positions, pad = _tokenize(bundle, question, counts, chat_template)
    what = f"The image{'s' * (len(imgs) > 1)} and question take {{n}} tokens ({sum(counts)} for the image tokens)"
    bundle.check_length(len(ids), max_new_tokens, what, "Lower the image detail (max_pixels) or shorten the question.")
    records = _records(imgs, grid_thw, counts, image_positions, merge)
    device = bundle.device
    input_ids = torch.tensor([ids], dtype=torch.long, device=device)  # (1, N)
    mm_token_type_ids = (input_ids == model.config.image_token_id).int()  # (1, N): 1 marks image tokens
    grid_thw = grid_thw.to(device)
    position_ids, _ = adapter.rope_index(model)(
        input_ids, mm_token_type_ids=mm_token_type_ids, image_grid_thw=grid_thw
    )  # (3, 1, N)
    dtype = next(model.parameters()).dtype
    prefill = {"pixel_values": pixel_values.to(device=device, dtype=dtype), "image_grid_thw": grid_thw,
               "position_ids": position_ids}  # fmt: skip
    return ImagePrompt(
        input_ids=input_ids, user_positions=user_positions, image_positions=image_positions,
        grid=tuple(records[0]["grid"]), size=tuple(records[0]["size"]), prefill_inputs=prefill, text=text,
        images=records, pad=pad,
    )  # fmt: skip


def continue_positions(position_ids: torch.Tensor, steps: int) -> torch.Tensor:
    """Positions of `steps` tokens following a prompt: each one more than the prompt's last, in every rope axis.

    Args:
        position_ids: (..., N) prompt positions (1D or Qwen's (3, B, N)).
        steps: number of following tokens.

    Returns:
        (..., steps) positions.
    """
    offsets = torch.arange(1, steps + 1, device=position_ids.device, dtype=position_ids.dtype)  # (steps,)
    return position_ids[..., -1:] + offsets


def full_sequence_inputs(prefill_inputs: dict[str, torch.Tensor], num_generated: int) -> dict[str, torch.Tensor]:
    """Prefill inputs extended to a forward over prompt + `num_generated` tokens (for post-hoc methods)."""
    out = dict(prefill_inputs)
    if "position_ids" in out:
        pos = out["position_ids"]  # (..., N)
        out["position_ids"] = torch.cat([pos, continue_positions(pos, num_generated)], dim=-1)  # (..., N + K)
    return out


def vision_model_class(config: Any) -> type | None:
    """The transformers model class to load a config with, or None when it is not a vision-language model."""
    adapter = adapter_for(config)
    if adapter is None:
        return None
    import transformers

    return getattr(transformers, adapter.model_class)


def check_vision_model(model: Any) -> None:
    """Refuse a loaded model without the config fields image prompts need."""
    cfg = model.config
    missing = [k for k in ("image_token_id", "vision_start_token_id", "vision_end_token_id") if not hasattr(cfg, k)]
    if missing or not hasattr(cfg, "vision_config"):
        raise ModelLoadError(f"The vision-language config lacks {', '.join(missing) or 'vision_config'}.")
