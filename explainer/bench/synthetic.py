"""Models with random weights from a default model's real configuration, for measuring cost where its weights cannot
be downloaded (CI, a lent GPU without the Hub): cost depends only on the shape.

- `offline_tokenizer`: a tiny byte-level BPE with the default models' special tokens and a chat template: token ids
  only set the cost through the prompt's length.
- `random_config`: the shipped configuration (`explainer/data/configs`) with the offline tokenizer's special ids,
  optionally reduced (fewer layers, a shallower vision tower, a smaller vocabulary, `TINY` dimensions for CPU dry
  runs) or with a longer position limit.
- `random_model`: a causal LM of that configuration built on the device (seconds for 8B on a GPU, nothing through
  the host); `bench_model`: that, or a saved model, as the bench scripts and `explainer crowd` take it.
- `machine`: the device a figure was measured on, with the GPU's name and memory.

Front ends: `scripts/gpu_bench.py`, `scripts/real_size.py`, `scripts/step_ops.py`, `explainer crowd`.
"""

from __future__ import annotations

from typing import Any

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|image_pad|>", "<|vision_end|>",
           "<|video_pad|>"]  # fmt: skip
TOKEN_IDS = (("image_token_id", "<|image_pad|>"), ("video_token_id", "<|video_pad|>"),
             ("vision_start_token_id", "<|vision_start|>"), ("vision_end_token_id", "<|vision_end|>"))  # fmt: skip
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for c in m['content'] %}"
    "{% if c['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>{% else %}{{ c['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
WORDS = "the lighthouse keeper wrote about storms ships harbours and the long winter nights on the island".split()
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, vocab_size=512)  # fmt: skip  # a CPU dry run's dimensions


def offline_tokenizer():
    """A byte-level BPE of 400 tokens trained on `WORDS`, with `SPECIAL` and `CHAT_TEMPLATE` (no download)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    tok.train_from_iterator([" ".join(WORDS)] * 20, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.add_special_tokens({"additional_special_tokens": SPECIAL[3:]})
    fast.chat_template = CHAT_TEMPLATE
    return fast


def random_config(
    model_id: str, tokenizer, *, tiny: bool = False, positions: int | None = None, layers: int | None = None,
    vision_depth: int | None = None, vocab: int | None = None,
) -> Any:  # fmt: skip
    """`model_id`'s shipped configuration with `tokenizer`'s special ids (end of sequence, padding, image tokens; no
    beginning-of-sequence token), reduced as asked.

    Args:
        tiny: the language model's dimensions set to `TINY`.
        positions: its position limit raised to this (the rotary embedding is computed from the positions, so the
            work is the same model's with a longer context).
        layers, vision_depth, vocab: fewer decoder layers, a shallower vision tower, a smaller vocabulary.

    Raises:
        ValueError: no configuration ships for `model_id`.
    """
    from ..runtime.fit import bundled_config

    config = bundled_config(model_id)
    if config is None:
        raise ValueError(f"no shipped configuration for {model_id!r} (explainer/data/configs)")
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL}
    text = config.get_text_config()
    for c in {id(config): config, id(text): text}.values():
        c.eos_token_id, c.pad_token_id, c.bos_token_id = ids["<|im_end|>"], ids["<|endoftext|>"], None
        for key, token in TOKEN_IDS:
            if hasattr(c, key):
                setattr(c, key, ids[token])
        if layers:
            c.num_hidden_layers = layers
            if hasattr(c, "layer_types"):
                c.layer_types = c.layer_types[:layers]
        if vocab:
            c.vocab_size = vocab
    for key, value in (TINY if tiny else {}).items():
        setattr(text, key, value)
    if positions:
        text.max_position_embeddings = positions
    vision = getattr(config, "vision_config", None)
    if vision is not None and vision_depth:
        vision.depth = vision_depth
        if hasattr(vision, "fullatt_block_indexes"):
            vision.fullatt_block_indexes = [vision_depth - 1]
    return config


def random_model(model_id: str, dtype, device: str, tiny: bool = False, positions: int | None = None):
    """(model, tokenizer): a causal LM of `random_config(model_id)` with random weights (seed 0) made on `device`,
    SDPA attention, in eval mode; the tokenizer is `offline_tokenizer()`."""
    import torch
    from transformers import AutoModelForCausalLM

    tok = offline_tokenizer()
    config = random_config(model_id, tok, tiny=tiny, positions=positions)
    torch.manual_seed(0)
    with torch.device(device):  # initialised where it runs
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.set_attn_implementation("sdpa")
    return model.eval(), tok


def bench_model(model_id: str | None = None, folder: str | None = None, dtype: str = "bfloat16",
                device: str | None = None, tiny: bool = False, positions: int | None = None) -> tuple:  # fmt: skip
    """(model, tokenizer, name, device): a saved model (`folder`: a path, or "embedded") loaded as the app loads it,
    else `model_id`'s configuration with random weights on `device` (default: CUDA when there is one)."""
    import torch

    from ..models.loading import load_model
    from ..runtime.precision import parse_dtype

    if folder:
        bundle = load_model(None if folder == "embedded" else folder, device=device, dtype=dtype)
        return bundle.model, bundle.tokenizer, bundle.name, bundle.device
    if not model_id:
        raise ValueError("give a model id or a folder")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    model, tok = random_model(model_id, parse_dtype(dtype), device, tiny, positions)
    return model, tok, f"{model_id} ({'tiny ' if tiny else ''}random weights)", torch.device(device)


def machine(device) -> dict[str, Any]:
    """`runner.machine_info` of `device` (a torch.device) with this process's torch threads, and on CUDA the GPU's
    name and memory."""
    import torch

    from .runner import machine_info

    info = machine_info(str(device), torch.get_num_threads())
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["gpu_memory_gib"] = round(torch.cuda.get_device_properties(device).total_memory / 2**30, 1)
    return info


def machine_label(device) -> str:
    """One line for a row: the GPU's name, else "CPU: <model>"."""
    info = machine(device)
    return info.get("gpu") or f"CPU: {info['cpu_model']}"
