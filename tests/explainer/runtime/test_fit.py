"""Which models fit: parameters counted on the meta device from the default models' real configurations, the
defaults chosen by memory, and a model that does not fit refused before loading."""

from __future__ import annotations

import pytest
import torch

from explainer import load_model
from explainer.runtime import fit
from explainer.runtime.memory import BUDGET_ENV, MemoryLimitError

# Parameters of the real models (their model cards and safetensors indexes), counted here from the shipped configs.
REAL_PARAMETERS = {
    "Qwen/Qwen2.5-0.5B-Instruct": 494_032_768,
    "Qwen/Qwen2.5-1.5B-Instruct": 1_543_714_304,
    "Qwen/Qwen2.5-VL-3B-Instruct": 3_754_622_976,
    "Qwen/Qwen2-VL-2B-Instruct": 2_208_985_600,
    "meta-llama/Llama-3.1-8B-Instruct": 8_030_261_248,  # Table 3's model (issue #33)
}
GB = 10**9


@pytest.mark.parametrize("model_id", list(REAL_PARAMETERS))
def test_parameters_counted_on_the_meta_device(model_id):
    config = fit.bundled_config(model_id)
    assert fit.parameter_count(config) == REAL_PARAMETERS[model_id]
    f32, bf16 = fit.model_bytes(config, torch.float32), fit.model_bytes(config, torch.bfloat16)
    weights = 4 * REAL_PARAMETERS[model_id]
    assert f32 == int(weights * (1 + fit.ACTIVATIONS)) + fit.ALLOWANCE
    assert bf16 == int(weights / 2 * (1 + fit.ACTIVATIONS)) + fit.ALLOWANCE


def test_qwen25_vl_3b_alone_does_not_fit_a_free_cpu_space_in_float32():
    """14 GiB of weights: with the text model, 15.8 GiB before one token (the issue's count)."""
    need = fit.model_bytes(fit.bundled_config(fit.VISION_GPU), torch.float32)
    assert need > fit.ROOM * 16 * GB


def test_a_free_cpu_space_gets_both_small_models_with_room_to_spare():
    d = fit.choose_defaults(16 * GB, gpu=False)
    assert (d.text, d.vision, d.dtype) == (fit.TEXT_CPU, fit.VISION_CPU, "float32")
    total = sum(fit.model_bytes(fit.bundled_config(m), torch.float32) for m in (d.text, d.vision))
    assert 16 * GB - total > 2.5 * GB  # room to spare, beyond each model's allowance for its requests
    assert d.max_image_tokens == fit.CPU_IMAGE_TOKENS


def test_native_bf16_cpu_and_gpu_defaults():
    cpu = fit.choose_defaults(16 * GB, gpu=False, native_bf16=True)  # a free CPU Space whose CPU has native bf16
    assert (cpu.text, cpu.vision, cpu.dtype) == (fit.TEXT_CPU_BF16, fit.VISION_GPU, "bfloat16")
    assert cpu.vision == "Qwen/Qwen2.5-VL-3B-Instruct" and cpu.max_image_tokens >= 256
    assert fit.default_image_tokens(gpu=False, native_bf16=True) == cpu.max_image_tokens
    assert fit.default_image_tokens(gpu=False) == fit.CPU_IMAGE_TOKENS == 64
    d = fit.choose_defaults(40 * GB, gpu=True)
    assert (d.text, d.vision, d.dtype, d.max_image_tokens) == (fit.TEXT_GPU, fit.VISION_GPU, "bfloat16", 256)
    assert fit.choose_defaults(None, gpu=True).vision == fit.VISION_GPU  # ZeroGPU: not asked


def test_smaller_machines_share_one_model_or_drop_the_image_tab():
    vlm = fit.model_bytes(fit.bundled_config(fit.VISION_CPU), torch.float32)
    shared = fit.choose_defaults(int(vlm / fit.ROOM) + GB // 2, gpu=False)
    assert shared.text == shared.vision == fit.VISION_CPU
    small = fit.choose_defaults(4 * GB, gpu=False)
    assert (small.text, small.vision) == (fit.TEXT_CPU, None)


def test_load_model_refuses_a_model_that_does_not_fit_before_reading_weights(tiny_model_dir, monkeypatch):
    monkeypatch.setenv(BUDGET_ENV, "100MB")  # the tiny model needs its weights plus the 0.5 GB allowance
    reads = []
    import transformers

    monkeypatch.setattr(
        transformers.modeling_utils, "load_state_dict", lambda *a, **k: reads.append(a) or {}, raising=False
    )
    with pytest.raises(MemoryLimitError) as e:
        load_model(str(tiny_model_dir), device="cpu")  # "auto" is float32 there (bfloat16 on a GPU machine)
    assert reads == []
    msg = str(e.value)
    assert "needs about" in msg and "float32" in msg and "bfloat16" in msg and "smaller model" in msg
    monkeypatch.setenv(BUDGET_ENV, "20GB")
    assert load_model(str(tiny_model_dir), device="cpu").model is not None


def test_a_model_that_cannot_be_moved_to_its_device_is_a_model_load_error(tiny_model_dir, monkeypatch):
    """`model.to(device)` fails after the weights are read (the GPU is full, CUDA is refused): the caller gets a
    `ModelLoadError` naming the model, the device and the cause, not torch's bare exception."""
    from explainer.errors import ModelLoadError

    moved = torch.nn.Module.to

    def full(self, *args, **kwargs):
        if args and isinstance(args[0], torch.device):  # load_model's move; other calls (dtype casts) as they are
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore detail")
        return moved(self, *args, **kwargs)

    monkeypatch.setattr(torch.nn.Module, "to", full)
    with pytest.raises(ModelLoadError) as e:
        load_model(str(tiny_model_dir), device="cpu")
    assert str(e.value) == (
        f"Could not move model '{tiny_model_dir}' to cpu: CUDA out of memory. Tried to allocate 2.00 GiB. Choose a "
        "device this machine has (e.g. cpu), or free its memory."
    )
    assert isinstance(e.value.__cause__, torch.OutOfMemoryError)
    monkeypatch.setattr(torch.nn.Module, "to", moved)
    assert load_model(str(tiny_model_dir), device="cpu").model is not None
