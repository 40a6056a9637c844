"""Several images in one question, on the tiny Qwen2.5-VL: each image's tokens where the processor puts them, the
tokens of Hugging Face's own `generate` (its mRoPE positions for two images), every image method over both images,
removal curves ranking both, the shared budget, the JSON record and the CLI's repeated --image."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from explainer import explain
from explainer.cli import main
from explainer.errors import InputError
from explainer.faithfulness import RemovalConfig, removal_curves
from explainer.faithfulness.common import image_ranked_positions
from explainer.methods import method_choices
from explainer.models.vision import encode_image_prompt
from explainer.result.attribution import Attribution

from ...vl_tiny import build_vl_model, make_vl_tokenizer, vl_bundle

QUESTION = "What is in the image?"


@pytest.fixture(scope="module")
def setup():
    tokenizer = make_vl_tokenizer()
    model = build_vl_model(tokenizer)
    return model, tokenizer, vl_bundle(model, tokenizer, max_image_tokens=24)


def _image(w: int, h: int, seed: int) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8))


IMAGES = [_image(120, 70, 1), _image(56, 84, 2)]


def test_each_image_gets_its_own_run_of_tokens_grid_and_size(setup):
    model, _, bundle = setup
    enc = encode_image_prompt(bundle, IMAGES, QUESTION)
    one, two = enc.images
    processor, cfg = bundle.image_processor, model.config
    for record, img in zip(enc.images, IMAGES, strict=True):
        alone = processor(
            images=[img], return_tensors="pt", size={"shortest_edge": 4 * 28**2, "longest_edge": 12 * 28**2}
        )
        _, gh, gw = (int(v) for v in alone["image_grid_thw"][0])
        assert record["grid"] == [gh // 2, gw // 2] and record["size"] == list(img.size)
        assert len(record["token_positions"]) == gh * gw // 4 <= 12
    ids = enc.input_ids[0].tolist()
    assert all(ids[p] == cfg.image_token_id for p in enc.image_positions)
    assert enc.image_positions == one["token_positions"] + two["token_positions"]
    between = ids[one["token_positions"][-1] + 1 : two["token_positions"][0]]
    assert between == [cfg.vision_end_token_id, cfg.vision_start_token_id]  # the second image follows the first
    assert enc.prefill_inputs["image_grid_thw"].shape == (2, 3)
    assert enc.record()["images"] == enc.images and enc.record()["grid"] == one["grid"]
    assert bundle.tokenizer(enc.expanded_text(), add_special_tokens=False)["input_ids"] == ids


def test_greedy_tokens_equal_generate_with_two_images(setup):
    model, _, bundle = setup
    attr = explain(bundle, QUESTION, image=IMAGES, methods=["macs"], max_new_tokens=6)
    enc = encode_image_prompt(bundle, IMAGES, QUESTION)
    n = enc.input_ids.shape[1]
    try:
        generated = model.generate(
            input_ids=enc.input_ids, pixel_values=enc.prefill_inputs["pixel_values"],
            image_grid_thw=enc.prefill_inputs["image_grid_thw"],
            mm_token_type_ids=(enc.input_ids == model.config.image_token_id).int(), max_new_tokens=6, do_sample=False,
        )  # fmt: skip
    finally:
        model.model.rope_deltas = None  # generate caches it on the model
    assert attr.generated_token_ids == generated[0, n:].tolist()[: attr.num_steps]
    assert attr.images == enc.images and attr.image_token_positions == enc.image_positions


def test_every_image_method_explains_both_images(setup):
    _, _, bundle = setup
    methods = method_choices(image=True)
    assert {"macs", "rollout", "atman", "attnlrp", "grad_ellm", "input_x_gradient", "random"} <= set(methods)
    attr = explain(bundle, QUESTION, image=IMAGES, methods=methods, max_new_tokens=3)
    for name, scores in attr.methods.items():
        for record in attr.images:
            block = scores.raw[:, record["token_positions"]]  # (K, tokens of this image)
            assert np.isfinite(block).all() and np.ptp(block) > 0, name  # scored, and not all equal
    again = Attribution.from_dict(json.loads(json.dumps(attr.to_dict())))
    assert again.images == attr.images and again.image == attr.image


def test_removal_curves_rank_the_tokens_of_every_image(setup):
    _, _, bundle = setup
    attr = explain(bundle, QUESTION, image=IMAGES, methods=["macs"], max_new_tokens=3)
    enc = encode_image_prompt(bundle, IMAGES, QUESTION, max_new_tokens=3)
    positions = image_ranked_positions(attr, "image")
    assert positions == attr.image_token_positions and len(positions) == len(enc.image_positions)
    report = removal_curves(
        bundle, attr, ["macs"], positions, RemovalConfig(fractions=(0.0, 0.2)), image_inputs=enc.prefill_inputs
    )
    assert set(report.auc) == {"macs", "random"}
    single = encode_image_prompt(bundle, IMAGES[0], QUESTION, max_new_tokens=3)
    with pytest.raises(InputError, match="image tokens"):
        removal_curves(bundle, attr, ["macs"], positions, RemovalConfig(), image_inputs=single.prefill_inputs)


def test_the_budget_is_shared_and_refused_when_the_images_do_not_fit(setup):
    _, _, bundle = setup
    enc = encode_image_prompt(bundle, IMAGES, QUESTION, max_image_tokens=16)
    assert all(len(r["token_positions"]) <= 8 for r in enc.images)
    with pytest.raises(InputError, match="3 images do not fit in 8 image tokens"):
        encode_image_prompt(bundle, [*IMAGES, IMAGES[0]], QUESTION, max_image_tokens=8)
    with pytest.raises(InputError, match="No image"):
        encode_image_prompt(bundle, [], QUESTION)


def test_the_cli_takes_repeated_images(tmp_path, setup, capsys):
    model, tokenizer, _ = setup
    folder = tmp_path / "tiny-vl"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    paths = [tmp_path / "a.png", tmp_path / "b.png"]
    for img, path in zip(IMAGES, paths, strict=True):
        img.save(path)
    out = tmp_path / "out.json"
    args = ["explain", "--model", str(folder), "--image", str(paths[0]), "--image", str(paths[1]), "--prompt",
            QUESTION, "--max-new-tokens", "2", "--methods", "macs,random", "--max-pixels", str(24 * 28**2)]  # fmt: skip
    assert main([*args, "--json", str(out)]) == 0, capsys.readouterr().err
    data = json.loads(out.read_text())
    assert [r["size"] for r in data["image"]["images"]] == [[120, 70], [56, 84]]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "image 1: 120x70 px" in printed and "image 2: 56x84 px" in printed
