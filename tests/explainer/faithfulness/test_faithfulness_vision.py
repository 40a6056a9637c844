"""Removal curves over an image prompt of a tiny random Qwen2.5-VL: the batched, prefix-reusing, departure-decoding
path equals one plain uncached run per removed set (hand-merged patch features, a 2D mask, the 3D mRoPE positions
continued over the answer), and the curves rank image tokens (or image and question tokens) as asked."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from explainer import InputError, explain
from explainer.capture import registered_names
from explainer.faithfulness import RemovalConfig, removal_curves, removal_runs
from explainer.faithfulness.common import image_ranked_positions
from explainer.faithfulness.removal import image_sequence
from explainer.models.vision import encode_image_prompt, full_sequence_inputs

from ...vl_tiny import build_vl_model, make_vl_tokenizer, vl_bundle

QUESTION = "What is in the image?"


@pytest.fixture(scope="module")
def setup():
    tokenizer = make_vl_tokenizer()
    model = build_vl_model(tokenizer)
    bundle = vl_bundle(model, tokenizer)
    image = Image.fromarray((np.random.default_rng(2).random((56, 84, 3)) * 255).astype(np.uint8))
    attr = explain(bundle, QUESTION, image=image, methods=["macs", "rollout"], max_new_tokens=4)
    enc = encode_image_prompt(bundle, image, QUESTION, max_new_tokens=4)
    assert enc.input_ids[0].tolist() == attr.prompt_token_ids
    return model, bundle, attr, enc


def _merged(model, enc, ids: torch.Tensor) -> torch.Tensor:
    """(1, T, d) token embeddings of `ids` with the merged patch features at the image positions, built by hand."""
    pv = enc.prefill_inputs
    with torch.no_grad():
        features = model.model.get_image_features(pv["pixel_values"], pv["image_grid_thw"], return_dict=True)
        embeds = model.get_input_embeddings()(ids[None]).clone()
    embeds[0, enc.image_positions] = torch.cat(features.pooler_output)
    return embeds


@torch.no_grad()
def _plain_run(model, enc, prompt, gen, keep, max_new_tokens, eos):
    """One removal run from scratch: teacher-forced mean logit and perplexity of `gen`, then greedy regeneration with
    a full forward per token; positions after the prompt advance all three mRoPE axes by one."""
    n, k = prompt.shape[0], gen.shape[0]
    prompt_pos = enc.prefill_inputs["position_ids"]  # (3, 1, N)

    def logits_of(tokens: list[int]) -> torch.Tensor:
        ids = torch.cat([prompt, torch.tensor(tokens, dtype=torch.long)])
        after = prompt_pos[:, :, -1:] + torch.arange(1, len(tokens) + 1)  # (3, 1, len)
        mask = torch.cat([keep.long(), torch.ones(len(tokens), dtype=torch.long)])[None]
        out = model(inputs_embeds=_merged(model, enc, ids), attention_mask=mask,
                    position_ids=torch.cat([prompt_pos, after], dim=-1))  # fmt: skip
        return out.logits[0].float()

    logits = logits_of(gen.tolist())[n - 1 : n + k - 1]  # (K, V)
    target = logits[torch.arange(k), gen]
    ce = torch.logsumexp(logits, dim=-1) - target
    tokens: list[int] = []
    for _ in range(max_new_tokens):
        tokens.append(int(logits_of(tokens)[-1].argmax()))
        if tokens[-1] in eos:
            break
    return float(target.mean()), float(torch.exp(ce.mean())), tokens


@pytest.mark.parametrize("answer", ["generated", "arbitrary"])
def test_image_removal_runs_equal_a_plain_loop(setup, answer):
    model, bundle, attr, enc = setup
    prompt = torch.tensor(attr.prompt_token_ids)
    gen = torch.tensor(attr.generated_token_ids if answer == "generated" else [30, 31, 32, 33])
    image_pos = list(enc.image_positions)
    n = prompt.numel()
    removed_sets = [[], image_pos[:1], image_pos[-2:], image_pos[::2], image_pos, [image_pos[0], n - 2]]
    keep = torch.ones(len(removed_sets), n, dtype=torch.bool)
    for row, removed in enumerate(removed_sets):
        keep[row, removed] = False
    fake = attr.__class__(**{**attr.__dict__, "generated_token_ids": gen.tolist()})
    image = image_sequence(bundle, fake, enc.prefill_inputs)
    eos = {int(i) for i in bundle.eos_token_ids}
    logit, ppl, regenerated, _ = removal_runs(model, prompt, gen, keep, 6, eos, 2, 3, image=image)
    for row, removed in enumerate(removed_sets):
        ref_logit, ref_ppl, ref_tokens = _plain_run(model, enc, prompt, gen, keep[row], 6, eos)
        assert regenerated[row] == ref_tokens, removed
        assert logit[row] == pytest.approx(ref_logit, rel=1e-4, abs=1e-4)
        assert ppl[row] == pytest.approx(ref_ppl, rel=1e-4)
    assert registered_names() == [] and model.model.rope_deltas is None


def test_image_removal_curves_rank_image_tokens_or_image_and_question(setup):
    _, bundle, attr, enc = setup
    image_pos = image_ranked_positions(attr, "image")
    assert image_pos == list(enc.image_positions)
    both = image_ranked_positions(attr, "image+question")
    assert set(both) == set(image_pos) | set(attr.user_positions) and len(both) > len(image_pos)
    report = removal_curves(
        bundle, attr, ["macs", "rollout"], image_pos, RemovalConfig(), image_inputs=enc.prefill_inputs
    )
    assert set(report.auc) == {"macs", "rollout", "random"}
    for curves in report.curves.values():
        assert curves["logit"]["mif"][0] == pytest.approx(1.0) and len(curves["logit"]["mif"]) == len(report.fractions)
    plain = removal_curves(bundle, attr, ["macs"], both, RemovalConfig(), image_inputs=enc.prefill_inputs)
    assert np.isfinite(plain.auc["macs"]["logit"]["srg"])


def test_image_results_need_their_image_inputs(setup):
    _, bundle, attr, enc = setup
    with pytest.raises(InputError, match="need the image's inputs"):
        removal_curves(bundle, attr, ["macs"])
    other = encode_image_prompt(bundle, Image.new("RGB", (28, 28)), QUESTION, max_new_tokens=4)
    with pytest.raises(InputError, match="image tokens"):
        removal_curves(bundle, attr, ["macs"], list(enc.image_positions), image_inputs=other.prefill_inputs)
    with pytest.raises(InputError, match="no image"):
        image_ranked_positions(attr.__class__(**{**attr.__dict__, "image": None}))
    assert full_sequence_inputs(enc.prefill_inputs, 2)["position_ids"].shape[-1] == enc.input_ids.shape[1] + 2


def test_faithfulness_command_with_an_image(tmp_path, capsys):
    import json

    from explainer.cli import main

    folder = tmp_path / "tiny-vl"
    tokenizer = make_vl_tokenizer()
    build_vl_model(tokenizer).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    image_path, out = tmp_path / "square.png", tmp_path / "f.json"
    Image.fromarray((np.random.default_rng(3).random((56, 84, 3)) * 255).astype(np.uint8)).save(image_path)
    base = ["faithfulness", "--model", str(folder), "--image", str(image_path), "--prompt", QUESTION,
            "--max-new-tokens", "3", "--methods", "macs,rollout", "--json", str(out)]  # fmt: skip
    assert main(base) == 0
    captured = capsys.readouterr()
    assert "pi-Soft is measured on text prompts only" in captured.err and "SRG logit" in captured.out
    d = json.loads(out.read_text())
    assert d["ranked"] == "image" and d["soft"] is None and set(d["removal"]["auc"]) == {"macs", "rollout", "random"}
    image_tokens = d["ranked_positions"]
    assert main([*base, "--rank", "image+question"]) == 0
    both = json.loads(out.read_text())
    assert both["ranked"] == "image+question" and set(image_tokens) < set(both["ranked_positions"])
