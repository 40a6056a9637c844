"""A seeded tiny random Qwen2.5-VL (or Qwen2-VL, `kind="qwen2_vl"`), its image processor and an offline tokenizer
with the vision special tokens."""

from __future__ import annotations

import torch
from transformers import (
    PreTrainedTokenizerFast,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
)

from explainer.models.loading import bundle_from_objects
from explainer.models.vision import load_image_processor

from .conftest import CORPUS, make_tokenizer

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|image_pad|>", "<|vision_end|>",
           "<|video_pad|>"]  # fmt: skip
VOCAB = 320
PATCH, MERGE = 14, 2  # the tiny vision tower's patch side and spatial merge (Qwen2.5-VL's real values)


def make_vl_tokenizer() -> PreTrainedTokenizerFast:
    return make_tokenizer(SPECIAL, CORPUS + ["What is in the image? A red square on a blue background."])


def vl_config(tokenizer) -> Qwen2_5_VLConfig:
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL}
    text = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        initializer_range=0.2,  # peaked attention, so references can tell rows apart
        rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]},  # sums to head_dim / 2 = 8
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
        bos_token_id=None,
    )
    vision = dict(
        depth=2,
        hidden_size=32,
        intermediate_size=64,
        num_heads=2,
        patch_size=PATCH,
        spatial_merge_size=MERGE,
        temporal_patch_size=2,
        out_hidden_size=64,  # = text hidden size
        window_size=PATCH * MERGE * 2,
        fullatt_block_indexes=[1],
    )
    return Qwen2_5_VLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
        bos_token_id=None,
    )


def qwen2_vl_config(tokenizer) -> Qwen2VLConfig:
    """Qwen2-VL's tiny twin of `vl_config`: the same text model, Qwen2-VL's vision tower (no window attention)."""
    base = vl_config(tokenizer)
    vision = dict(depth=2, embed_dim=32, hidden_size=64, mlp_ratio=2, num_heads=2, patch_size=PATCH,
                  spatial_merge_size=MERGE, temporal_patch_size=2)  # fmt: skip
    tokens = {k: getattr(base, k) for k in ("image_token_id", "video_token_id", "vision_start_token_id",
                                            "vision_end_token_id")}  # fmt: skip
    return Qwen2VLConfig(text_config=base.text_config.to_dict(), vision_config=vision, **tokens)


def build_vl_model(tokenizer, seed: int = 0, kind: str = "qwen2_5_vl"):
    """The tiny Qwen2.5-VL (`kind` "qwen2_5_vl") or Qwen2-VL ("qwen2_vl"), seeded, with SDPA attention."""
    torch.manual_seed(seed)
    if kind == "qwen2_vl":
        model = Qwen2VLForConditionalGeneration(qwen2_vl_config(tokenizer))
    else:
        model = Qwen2_5_VLForConditionalGeneration(vl_config(tokenizer))
    model.set_attn_implementation("sdpa")
    return model.eval()


def vl_bundle(model, tokenizer, max_image_tokens: int = 24, **kwargs):
    """The tiny model as a bundle; the pixel budget keeps image prompts to at most `max_image_tokens` tokens."""
    factor = PATCH * MERGE
    processor = load_image_processor(None, model.config, 4 * factor**2, max_image_tokens * factor**2)
    return bundle_from_objects(model, tokenizer, name="tiny-qwen2.5-vl", image_processor=processor, **kwargs)
