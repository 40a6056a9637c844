"""macs_calibrated on image prompts, on the tiny random Qwen2.5-VL: weights of 1 give MACS's ranking exactly; the
image regions partition the image tokens; the batched knockout of many ablations equals a full eager forward with
each row's sources masked for the answer's queries; calibrating on image questions runs end to end (resumable), its
fit recovers weights planted in the measured image features, and the fitted method runs on an image prompt."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from explainer import InputError, explain
from explainer.eval import calibrate as calibrate_module
from explainer.eval.calibrate import CalibrateConfig, calibrate, collect_image_row, fit_weights, image_regions
from explainer.methods.calibration import CalibrationWeights, config_fingerprint, find_weights
from explainer.models.vision import encode_image_prompt, full_sequence_inputs
from explainer.reliance import knockout_logprobs

from ...reference import suppressed_eager_attention
from ...vl_tiny import build_vl_model, make_vl_tokenizer, vl_bundle

QUESTION = "What is in the image?"


def _image(seed: int = 0) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (60, 100, 3), dtype=np.uint8))


@pytest.fixture(scope="module")
def bundle():
    tokenizer = make_vl_tokenizer()
    return vl_bundle(build_vl_model(tokenizer), tokenizer)


@pytest.fixture
def weights_folder(tmp_path, monkeypatch):
    """Give the tiny VLM these layer weights in a user calibration folder of this test's own."""

    def give(model, weights) -> None:
        fingerprint = config_fingerprint(model)
        CalibrationWeights(fingerprint, "tiny-vl", list(weights), {"data": "test"}).save(
            tmp_path / f"{fingerprint}.json"
        )
        monkeypatch.setenv("EXPLAINER_CALIBRATION", str(tmp_path))

    return give


def test_weights_of_one_give_macs_ranking_exactly_on_an_image_prompt(bundle, weights_folder):
    weights_folder(bundle.model, [1.0, 1.0, 1.0])
    attr = explain(bundle, QUESTION, image=_image(), methods=["macs", "macs_calibrated"], max_new_tokens=4)
    macs, calibrated = attr.methods["macs"], attr.methods["macs_calibrated"]
    assert attr.image_token_positions and attr.num_steps > 0
    np.testing.assert_array_equal(calibrated.raw, macs.raw)
    np.testing.assert_array_equal(calibrated.z, macs.z)
    for k in range(attr.num_steps):  # the ranking of every token, image tokens included
        assert (
            np.argsort(-macs.raw[k], kind="stable").tolist() == np.argsort(-calibrated.raw[k], kind="stable").tolist()
        )
    assert attr.reliance is not None and set(attr.reliance.image_share) == {"macs", "macs_calibrated"}


def test_a_vision_model_without_weights_is_told_to_calibrate_on_images(bundle, tmp_path, monkeypatch):
    monkeypatch.setenv("EXPLAINER_CALIBRATION", str(tmp_path))  # an empty folder
    with pytest.raises(InputError, match=r"no weights for .*Make them with: explainer calibrate --model .* --images "):
        explain(bundle, QUESTION, image=_image(), methods=["macs_calibrated"], max_new_tokens=2)


def test_image_regions_partition_each_images_token_grid():
    one = {"token_positions": list(range(10, 22)), "grid": [3, 4]}
    regions = image_regions(one, 2)
    assert regions == [[10, 11, 14, 15], [12, 13, 16, 17], [18, 19], [20, 21]]
    two = {**one, "images": [one, {"token_positions": [30, 31], "grid": [1, 2]}]}
    regions = image_regions(two, 4)  # a grid smaller than the cells: one region per token
    assert len(regions) == 12 + 2 and sorted(p for r in regions for p in r) == list(range(10, 22)) + [30, 31]


def _reference(model, ids: torch.Tensor, n: int, extra: dict, hidden: list[int]) -> np.ndarray:
    """(K,) log p of each answer token from one full eager forward with the `hidden` keys masked, in a plain loop, for
    the queries from N - 1 on."""
    with torch.no_grad(), suppressed_eager_attention(model.config.text_config, from_query=n - 1) as edits:
        edits.update({j: 0.0 for j in hidden})
        logp = torch.log_softmax(model(input_ids=ids, **extra).logits[0].double(), dim=-1)  # (T, V)
    return np.array([float(logp[n - 1 + k, t]) for k, t in enumerate(ids[0, n:].tolist())])


def test_the_batched_knockout_of_many_ablations_equals_a_masked_eager_forward_per_row(bundle):
    attr = explain(bundle, QUESTION, image=_image(1), methods=["macs"], max_new_tokens=3, reliance=False)
    n, k = attr.num_prompt_tokens, attr.num_steps
    ids = torch.tensor([attr.prompt_token_ids + attr.generated_token_ids])  # (1, N + K)
    extra = full_sequence_inputs(encode_image_prompt(bundle, _image(1), QUESTION).prefill_inputs, k)
    regions = image_regions(attr.image, 2)
    rng = np.random.default_rng(0)
    hidden = np.zeros((5, n), dtype=bool)  # (R, N): row 0 hides nothing
    for row in hidden[1:]:
        for region in regions:
            row[region] = rng.random() < 0.5
    got = knockout_logprobs(bundle.model, ids, n, hidden, extra, batch_size=2)  # three forwards: 2, 2, 1 rows
    assert got.shape == (5, k)
    for r in range(5):
        np.testing.assert_allclose(got[r], _reference(bundle.model, ids, n, extra, np.flatnonzero(hidden[r]).tolist()),
                                   atol=1e-4)  # fmt: skip
    assert np.abs(got[1:] - got[0]).max() > 0.01  # hiding regions changes the answer's log-probabilities


ROWS = [{"id": f"img{i}", "image": _image(10 + i), "question": QUESTION} for i in range(3)]


def test_calibrating_on_image_questions_runs_end_to_end_and_the_method_runs_on_an_image_prompt(
    bundle, tmp_path, monkeypatch
):
    cfg = CalibrateConfig(max_new_tokens=3, masks=8, image_cells=2)
    weights = calibrate(bundle, ROWS, cfg, tmp_path / "cache", "three random images", progress=False, images=True)
    assert weights.fingerprint == config_fingerprint(bundle.model) and len(weights.layer_weights) == 3
    assert all(np.isfinite(weights.layer_weights)) and weights.fit["image_cells"] == 2
    assert weights.fit["row_ids"] == ["img0", "img1", "img2"] and "image regions" in weights.fit["sources"]

    def measured_again(*_args, **_kwargs):
        raise AssertionError("a cached row was measured again")

    monkeypatch.setattr(calibrate_module, "collect_image_row", measured_again)
    again = calibrate(bundle, ROWS, cfg, tmp_path / "cache", "three random images", progress=False, images=True)
    assert again.layer_weights == weights.layer_weights  # resumed from the cache
    monkeypatch.setenv("EXPLAINER_CALIBRATION", str(tmp_path / "weights"))
    weights.save(tmp_path / "weights" / f"{weights.fingerprint}.json")
    assert find_weights(bundle.model) == weights
    attr = explain(bundle, QUESTION, image=_image(), methods=["macs_calibrated"], max_new_tokens=3,
                   method_options={"macs_calibrated": {"keep_layers": True}})  # fmt: skip
    got = attr.methods["macs_calibrated"]
    assert got.meta["calibration"]["fingerprint"] == weights.fingerprint
    image = attr.image_token_positions
    assert np.isfinite(got.z[:, image]).all() and np.ptp(got.z[:, image]) > 0
    np.testing.assert_allclose(got.layers.prod(axis=1), got.raw, rtol=1e-4)  # the kept factors are f_l ** w_l


def test_the_fit_recovers_weights_planted_in_measured_image_features(bundle):
    cfg = CalibrateConfig(max_new_tokens=3, masks=16, image_cells=2)
    examples = [collect_image_row(bundle, row, cfg) for row in ROWS]
    for e in examples:
        n_sources = e["masks"].shape[1]
        assert n_sources >= 4 and e["features"].shape[1] == 3  # four regions or more, then the question
        assert np.isfinite(e["features"]).all() and np.isfinite(e["actual"]).all()
    planted = torch.tensor([0.4, 1.7, 0.9], dtype=torch.float64)
    for e in examples:  # the measured log-probabilities replaced by what the planted weights predict
        t = {"features": torch.as_tensor(e["features"], dtype=torch.float64), "source": torch.as_tensor(e["source"]),
             "masks": torch.as_tensor(e["masks"], dtype=torch.float64)}  # fmt: skip
        e["actual"] = (2.0 * calibrate_module.predictions(planted, t) - 5.0).numpy()
    fit = fit_weights(examples, l2=0.0, iterations=300)
    np.testing.assert_allclose(fit["weights"], planted.numpy(), atol=0.05)
    assert fit["pearson"] > 0.9999


def test_the_cli_calibrates_a_vision_model_on_a_folder_of_images(bundle, tmp_path):
    from explainer.cli import main

    model_dir, images, out = tmp_path / "vlm", tmp_path / "images", tmp_path / "w.json"
    bundle.model.save_pretrained(model_dir)
    bundle.tokenizer.save_pretrained(model_dir)
    images.mkdir()
    for i in range(2):
        _image(20 + i).save(images / f"{i}.png")
    (images / "notes.txt").write_text("not an image")
    args = ["calibrate", "--model", str(model_dir), "--images", str(images), "--out", str(out), "--cache",
            str(tmp_path / "cache"), "--masks", "8", "--max-new-tokens", "3", "--quiet", "--dtype", "float32",
            "--device", "cpu"]  # fmt: skip
    assert main(args) == 0
    weights = CalibrationWeights.load(out)
    assert weights.fingerprint == config_fingerprint(bundle.model) and len(weights.layer_weights) == 3
    assert weights.fit["row_ids"] == ["0.png", "1.png"] and "each asked 'What is in the image?'" in weights.fit["data"]
    assert main([*args[:3], "--images", str(tmp_path / "nowhere"), *args[5:]]) == 2  # a folder that is not there
