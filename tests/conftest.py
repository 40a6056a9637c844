"""Seeded tiny random models and an offline tokenizer, built from configs (no network)."""

from __future__ import annotations

import contextlib
import os

# No test touches the network: the app's Hub check (models.hub_reachable) answers False without asking, here and in
# the app and CLI processes tests start. tests/test_space.py covers the online branch with a fake opener.
os.environ["HF_HUB_OFFLINE"] = "1"

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from explainer.methods import MACS

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Paris is the capital of France, and Berlin is the capital of Germany.",
    "Question: What is the capital of France? Context: France is a country in Europe.",
    "Attention consistency scores explain which input tokens a language model used.",
    "Numbers 0123456789 and punctuation: ,.;:!?()[]{}'\"-\n",
]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
VOCAB = 320


def make_tokenizer(special: list[str] | None = None, corpus: list[str] | None = None) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained offline on `corpus` with the chat template; `special[3:]` (beyond the
    three chat tokens) are registered as additional special tokens."""
    special = special or ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus or CORPUS, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    if special[3:]:
        fast.add_special_tokens({"additional_special_tokens": special[3:]})
    fast.chat_template = CHAT_TEMPLATE
    assert len(fast) <= VOCAB
    return fast


class FailingMACS(MACS):
    """MACS that raises after its first step: a method failing in the middle of a generation."""

    def step(self, rows):
        if rows.shape[-1] > self.n + 1:
            raise RuntimeError("method failed")
        return super().step(rows)


_COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=3,
    max_position_embeddings=512,
    initializer_range=0.2,  # large weights give peaked, non-uniform attention: references can tell rows apart
    eos_token_id=2,
    pad_token_id=0,
    bos_token_id=None,
)


def _llama(**overrides):
    return LlamaForCausalLM(LlamaConfig(num_attention_heads=4, num_key_value_heads=2, **{**_COMMON, **overrides}))


def _qwen2(**overrides):
    return Qwen2ForCausalLM(Qwen2Config(num_attention_heads=4, num_key_value_heads=1, **{**_COMMON, **overrides}))


def _qwen2_sliding(**overrides):
    cfg = Qwen2Config(
        num_attention_heads=4,
        num_key_value_heads=2,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        sliding_window=6,
        use_sliding_window=True,
        **{**_COMMON, **overrides},
    )
    return Qwen2ForCausalLM(cfg)


BUILDERS = {"llama": _llama, "qwen2": _qwen2, "qwen2_sliding": _qwen2_sliding}


def build_model(kind: str, seed: int = 0, **overrides):
    """A seeded tiny model of `kind`; `overrides` change its config (num_hidden_layers, max_position_embeddings...)."""
    torch.manual_seed(seed)
    model = BUILDERS[kind](**overrides)
    model.set_attn_implementation("sdpa")
    return model.eval()


QA_ROW = {
    "id": "q1",
    "question": "What is the capital of France?",
    "context": "Paris is the capital of France.",
    "answers": [{"text": "Paris", "answer_start": 0}],
}  # one SQuAD-style row for evaluation tests


@pytest.fixture(scope="session")
def tokenizer():
    return make_tokenizer()


@pytest.fixture(scope="session", params=list(BUILDERS))
def tiny_model(request):
    return build_model(request.param)


@pytest.fixture(scope="session")
def llama():
    return build_model("llama")


@contextlib.contextmanager
def eager(model):
    """Temporarily switch a model to eager attention for reference computations."""
    model.set_attn_implementation("eager")
    try:
        yield model
    finally:
        model.set_attn_implementation("sdpa")


def eager_attentions(model, input_ids, attention_mask=None):
    """Full attention matrices from eager attention: tuple over layers of (B, H, T, T)."""
    with eager(model), torch.no_grad():
        out = model(input_ids=input_ids, attention_mask=attention_mask, output_attentions=True)
    return out.attentions, out.logits


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tokenizer):
    """A tiny Llama and the test tokenizer saved as a local model folder (what `--model PATH` loads)."""
    path = tmp_path_factory.mktemp("tiny-llama")
    build_model("llama").save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def _cuda_param():
    return pytest.param(
        "cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: runs on a GPU machine")
    )


# Device parametrisation (tests/explainer/test_on_device.py): DEVICES for behaviour that must hold everywhere,
# ACCELERATORS for comparisons of an accelerator run against the same call on the CPU. Where torch sees no CUDA
# device the `cuda` cases are skipped with the reason; select them alone with `-k cuda`.
DEVICES = ["cpu", _cuda_param()]
ACCELERATORS = [_cuda_param()]


CPU_FLAGS = "flags\t\t: fpu sse2 avx2 avx512f"  # a CPU without native bf16 (no avx512_bf16, no amx_bf16)


@pytest.fixture(scope="session", autouse=True)
def plain_cpu(tmp_path_factory):
    """The CPU flags `precision.default_dtype` reads, the same on every machine and for fixtures of every scope: no
    native bf16, so `auto` is float32 on the CPU. Yields the file (`cpu_flags` rewrites it for one test)."""
    from explainer.runtime import precision

    path = tmp_path_factory.mktemp("cpuinfo") / "cpuinfo"
    path.write_text(f"processor\t: 0\n{CPU_FLAGS}\n")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(precision, "CPUINFO", str(path))
        yield path


@pytest.fixture
def cpu_flags(plain_cpu):
    """Give this test's CPU more flags, e.g. `cpu_flags(" avx512_bf16")`; the plain flags come back after it."""

    def write(extra: str = "") -> None:
        plain_cpu.write_text(f"processor\t: 0\n{CPU_FLAGS}{extra}\n")

    yield write
    write()


TINY_CALIBRATION = (0.5, 1.0, 1.5)  # macs_calibrated's layer weights for every tiny model of BUILDERS (3 layers)


@pytest.fixture(scope="session", autouse=True)
def tiny_calibration(tmp_path_factory):
    """A user calibration folder ($EXPLAINER_CALIBRATION) with weights for the tiny models of BUILDERS and the tiny
    Qwen2.5-VL (their default configs), so that macs_calibrated runs through every test parametrised over the
    registry, image prompts included; a model built with other settings has none. Yields the folder."""
    from explainer.methods.calibration import CalibrationWeights, config_fingerprint

    from .vl_tiny import make_vl_tokenizer, vl_config  # it imports this module: here, not at the top

    folder = tmp_path_factory.mktemp("calibration")
    configs = {kind: build_model(kind).config for kind in BUILDERS} | {"qwen2.5-vl": vl_config(make_vl_tokenizer())}
    for kind, config in configs.items():
        fingerprint = config_fingerprint(config)
        CalibrationWeights(fingerprint, kind, list(TINY_CALIBRATION), {"data": "tests"}).save(
            folder / f"{fingerprint}.json"
        )
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("EXPLAINER_CALIBRATION", str(folder))
        yield folder


@pytest.fixture(autouse=True)
def _library_defaults(monkeypatch):
    """Every test starts with the library's own defaults, whatever an import of `app` (which turns the batched decode
    on for its visitors) did before: a test that wants the batched decode turns it on itself."""
    from explainer.decoding import choice

    monkeypatch.setattr(choice, "_batching", False)
    monkeypatch.delenv(choice.DECODE_ENV, raising=False)
