"""macs_calibrated: MACS with fitted layer weights. Weights of 1 give MACS to the bit; other weights equal a plain loop
over layers; the fit recovers planted weights; weights files round-trip and are refused for another model; a model
without weights gets the command that makes them."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from explainer import InputError, bundle_from_objects, explain
from explainer.eval.calibrate import fit_weights
from explainer.methods.calibration import CalibrationWeights, config_fingerprint, find_weights

from ...conftest import TINY_CALIBRATION, build_model, eager_attentions

PROMPT = "Question: What is the capital of France? Context: Paris is the capital of France."


@pytest.fixture(scope="module")
def bundle(tokenizer):
    return bundle_from_objects(build_model("llama"), tokenizer, name="tiny-llama")


@pytest.fixture
def calibrated(tmp_path, monkeypatch):
    """Give a model these weights in a user calibration folder of this test's own."""

    def give(model, weights) -> None:
        fingerprint = config_fingerprint(model)
        CalibrationWeights(fingerprint, "tiny", list(weights), {"data": "test"}).save(tmp_path / f"{fingerprint}.json")
        monkeypatch.setenv("EXPLAINER_CALIBRATION", str(tmp_path))

    return give


def test_weights_of_one_give_macs_exactly_in_the_same_pass(bundle, calibrated):
    calibrated(bundle.model, [1.0, 1.0, 1.0])
    attr = explain(bundle, PROMPT, methods=["macs", "macs_calibrated"], max_new_tokens=6)
    macs, calibrated = attr.methods["macs"], attr.methods["macs_calibrated"]
    np.testing.assert_array_equal(calibrated.raw, macs.raw)
    np.testing.assert_array_equal(calibrated.z, macs.z)
    assert calibrated.meta["calibration"]["fingerprint"] == config_fingerprint(bundle.model)


def reference_weighted(attentions, n, k_steps, weights, alpha=0.8):
    """Plain loops: prod over layers of (alpha * max over heads of the redistributed row + 1 - alpha) ** w_l."""
    raws = []
    for k in range(k_steps):
        q = n - 1 + k
        c = [1.0] * n
        for layer, att in enumerate(attentions):
            a = att[0].double()  # (H, T, T)
            for i in range(n):
                spill = [sum(float(a[h, q, n + p]) for p in range(k)) / n for h in range(a.shape[0])]
                heads = [float(a[h, q, i]) + spill[h] for h in range(a.shape[0])]
                c[i] *= (alpha * max(heads) + 1 - alpha) ** weights[layer]
        raws.append(c)
    return np.array(raws)


@pytest.mark.parametrize("weights", [(0.5, 1.0, 1.5), (2.0, 0.0, -0.5)])
def test_weighted_scores_equal_a_plain_loop_over_layers(bundle, calibrated, weights):
    calibrated(bundle.model, weights)
    attr = explain(bundle, PROMPT, methods=["macs_calibrated"], max_new_tokens=5,
                   method_options={"macs_calibrated": {"keep_layers": True}})  # fmt: skip
    ids = torch.tensor([attr.prompt_token_ids + attr.generated_token_ids])
    attentions, _ = eager_attentions(bundle.model, ids)
    got = attr.methods["macs_calibrated"]
    ref = reference_weighted(attentions, attr.num_prompt_tokens, attr.num_steps, weights)
    np.testing.assert_allclose(got.raw, ref, rtol=1e-4)
    np.testing.assert_allclose(got.layers.prod(axis=1), got.raw, rtol=1e-4)  # kept factors are f_l ** w_l
    assert got.meta["rescaled_steps"] == [] and got.meta["calibration"]["fit"] == {"data": "test"}


def synthetic(weights, rows=24, k=3, p=20, s=5, m=32, seed=0):
    rng = np.random.default_rng(seed)
    w = torch.as_tensor(weights, dtype=torch.float64)
    out = []
    for _ in range(rows):
        e = {"features": np.log(rng.uniform(0.2, 1.0, (k, len(weights), p))).astype(np.float32),
             "source": rng.integers(0, s, p), "masks": rng.random((m, s)) < 0.5}  # fmt: skip
        t = {"features": torch.as_tensor(e["features"], dtype=torch.float64), "source": torch.as_tensor(e["source"]),
             "masks": torch.as_tensor(e["masks"], dtype=torch.float64)}  # fmt: skip
        z = torch.einsum("klp,l->kp", t["features"], w)
        tokens = torch.exp(z).sum(0)
        scores = torch.zeros(s, dtype=torch.float64).index_add(0, t["source"], tokens)
        e["actual"] = (3.0 * (t["masks"] @ scores) - 7.0).numpy()  # any increasing affine map: Pearson ignores it
        out.append(e)
    return out


def test_the_fit_recovers_planted_weights():
    planted = [0.3, 1.8, 1.0, 2.5]
    fit = fit_weights(synthetic(planted), l2=0.0, iterations=200)
    np.testing.assert_allclose(fit["weights"], planted, atol=0.02)
    assert fit["pearson"] > 0.9999 > fit["pearson_macs"]
    assert fit["rows"] == 24


def test_the_pull_towards_macs_keeps_weights_of_one_when_nothing_is_learnt():
    fit = fit_weights(synthetic([1.0, 1.0, 1.0]), l2=0.01)
    np.testing.assert_allclose(fit["weights"], 1.0, atol=1e-3)
    assert fit["pearson_macs"] == pytest.approx(1.0, abs=1e-9)


def test_a_weights_file_round_trips_and_is_refused_for_another_model(tmp_path):
    model = build_model("qwen2")
    path = tmp_path / "w.json"
    made = CalibrationWeights(config_fingerprint(model), "tiny-qwen2", [0.1, 0.2, 0.3], {"seed": 3, "data": "x"})
    made.save(path)
    assert CalibrationWeights.load(path) == made
    assert find_weights(model, path) == made
    other = build_model("llama")
    with pytest.raises(InputError, match=r"fitted for another model.*explainer calibrate --model"):
        find_weights(other, path)
    deeper = build_model("qwen2", num_hidden_layers=4)
    with pytest.raises(InputError, match="fitted for another model"):
        find_weights(deeper, path)
    path.write_text(json.dumps({"format": "something else"}))
    with pytest.raises(InputError, match="not a calibration weights file"):
        CalibrationWeights.load(path)


def test_a_model_without_weights_is_told_how_to_make_them(tokenizer):
    bundle = bundle_from_objects(build_model("llama", num_hidden_layers=2), tokenizer, name="tiny-2")
    with pytest.raises(InputError, match=r"no weights for .*Make them with: explainer calibrate --model .*--data"):
        explain(bundle, PROMPT, methods=["macs_calibrated"], max_new_tokens=2)
    assert bundle.model.config._attn_implementation == "sdpa"


def test_the_user_folder_weights_are_found_by_fingerprint(bundle, tiny_calibration):
    found = find_weights(bundle.model)
    assert found.layer_weights == list(TINY_CALIBRATION)
    assert (tiny_calibration / f"{config_fingerprint(bundle.model)}.json").is_file()


def test_the_fingerprint_ignores_names_and_precision():
    a, b = build_model("llama"), build_model("llama", seed=1).to(torch.bfloat16)
    b.config.name_or_path = "somewhere/else"
    assert config_fingerprint(a) == config_fingerprint(b)
    assert config_fingerprint(a) != config_fingerprint(build_model("qwen2"))


def test_the_cli_runs_it_and_says_how_to_calibrate_a_model_without_weights(tiny_model_dir, tmp_path, monkeypatch,
                                                                           capsys):  # fmt: skip
    from explainer.cli import main

    base = ["explain", "--model", str(tiny_model_dir), "--prompt", "Paris is", "--max-new-tokens", "2", "--methods",
            "macs_calibrated"]  # fmt: skip
    assert main(base) == 0
    monkeypatch.setenv("EXPLAINER_CALIBRATION", str(tmp_path))  # an empty folder: no weights for the tiny model
    assert main(base) == 2
    err = capsys.readouterr().err
    assert "no weights" in err and f"explainer calibrate --model {tiny_model_dir}" in err


def test_the_embedded_models_weights_ship_and_say_how_they_were_made():
    from explainer.methods.calibration import shipped_files, training_ids

    files = shipped_files()
    assert [f.name for f in files] == ["7a1b7e37769d640b.json"]  # SmolLM2-135M-Instruct's config fingerprint
    w = CalibrationWeights.load(files[0])
    assert w.fingerprint == "7a1b7e37769d640b" and len(w.layer_weights) == 30
    assert all(np.isfinite(w.layer_weights))
    for key in ("data", "seed", "row_ids", "masks", "fit_seconds", "ablation_seconds", "created", "objective"):
        assert key in w.fit, key
    ids = training_ids()
    assert ids == {str(i) for i in w.fit["row_ids"]} and ids


def test_calibrate_writes_weights_for_the_model_and_resumes_from_its_cache(tiny_model_dir, tmp_path, monkeypatch):
    from explainer.cli import main
    from explainer.eval import calibrate as calibrate_module

    context = "Paris is the capital of France. Berlin is the capital of Germany. The quick brown fox jumps."
    rows = [{"id": f"r{i}", "question": q, "context": context, "answers": [{"text": "Paris", "answer_start": 0}]}
            for i, q in enumerate(["What is the capital of France?", "What is the capital of Germany?"])]  # fmt: skip
    data = tmp_path / "train.json"
    data.write_text(json.dumps(rows))
    out, cache = tmp_path / "w.json", tmp_path / "cache"
    args = ["calibrate", "--model", str(tiny_model_dir), "--data", str(data), "--out", str(out), "--cache", str(cache),
            "--masks", "8", "--max-new-tokens", "3", "--quiet", "--dtype", "float32"]  # fmt: skip
    assert main(args) == 0
    first = CalibrationWeights.load(out)
    assert first.fingerprint == config_fingerprint(build_model("llama")) and len(first.layer_weights) == 3
    assert first.fit["row_ids"] == ["r0", "r1"] and first.fit["seed"] == 0 and first.fit["masks"] == 8
    assert "train.json rows 0-1" in first.fit["data"] and first.fit["fit_seconds"] >= 0

    def measured_again(*_args, **_kwargs):
        raise AssertionError("a cached row was measured again")

    monkeypatch.setattr(calibrate_module, "collect_row", measured_again)
    assert main(args) == 0
    assert CalibrationWeights.load(out).layer_weights == first.layer_weights


def test_evaluations_leave_out_the_rows_the_shipped_weights_were_fitted_on():
    from explainer.cli.options import held_out
    from explainer.methods.calibration import training_ids

    fitted = sorted(training_ids())[0]
    assert held_out([{"id": fitted}, {"id": "unseen"}]) == [{"id": "unseen"}]
