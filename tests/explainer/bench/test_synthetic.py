"""Random-weight models from the shipped configurations (`explainer/bench/synthetic.py`): the offline tokenizer's
special ids reach every configuration it sets, the reductions apply to the language model and the vision tower, an
unknown model is refused, and the machine line names the CPU here."""

from __future__ import annotations

import pytest
import torch

from explainer.bench import synthetic


def test_a_reduced_vision_model_config_carries_the_tokenizers_ids():
    tok = synthetic.offline_tokenizer()
    config = synthetic.random_config("Qwen/Qwen2.5-VL-3B-Instruct", tok, layers=1, vision_depth=1, vocab=2048)
    text = config.get_text_config()
    assert text.num_hidden_layers == 1 and text.vocab_size == 2048 and config.vision_config.depth == 1
    assert text.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>") and text.bos_token_id is None
    assert config.image_token_id == tok.convert_tokens_to_ids("<|image_pad|>")
    assert "<|im_start|>assistant" in tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                                              add_generation_prompt=True)  # fmt: skip


def test_tiny_and_longer_positions():
    model, _ = synthetic.random_model("meta-llama/Llama-3.1-8B-Instruct", torch.float32, "meta", tiny=True,
                                      positions=65_536)  # fmt: skip
    assert model.config.hidden_size == synthetic.TINY["hidden_size"] and model.config.num_hidden_layers == 2
    assert model.config.max_position_embeddings == 65_536


def test_an_unknown_model_is_refused():
    with pytest.raises(ValueError, match="no shipped configuration"):
        synthetic.random_config("nobody/no-such-model", synthetic.offline_tokenizer())


def test_the_machine_line_names_the_cpu():
    assert synthetic.machine_label(torch.device("cpu")).startswith("CPU: ")
    assert synthetic.machine(torch.device("cpu"))["torch_threads"] == torch.get_num_threads()
