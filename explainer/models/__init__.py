"""The model layer: loading a model (hub id, folder or the embedded GGUF) into a `ModelBundle`, the app's default
models, prompt and answer tokenisation, readable tokens, and Qwen2.5-VL / Qwen2-VL image prompts (`vision`)."""

from .loading import ModelBundle, load_model

__all__ = ["ModelBundle", "load_model"]
