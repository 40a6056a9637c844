"""Image reliance per answer token (`explainer/reliance.py`, `explainer/result/reliance.py`) on a tiny random
Qwen2.5-VL: the knockout's log-probabilities against one full eager forward with the image's columns masked for the
answer's queries (scores edited in a plain loop), the shares against a plain loop over steps and tokens, the JSON
round trip and its checks, and `explain --image ... --json` with `reliance` for every step."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from PIL import Image

import explainer.reliance as reliance_module
from explainer import explain
from explainer.capture import registered_names
from explainer.cli import main as cli_main
from explainer.errors import InputError
from explainer.methods import get_method
from explainer.models.vision import encode_image_prompt, full_sequence_inputs
from explainer.reliance import image_knockout
from explainer.result.attribution import load_result, result_json
from explainer.result.reliance import Reliance, image_share, share_positions
from explainer.result.sinks import sink_positions

from ..conftest import build_model
from ..reference import suppressed_eager_attention
from ..vl_tiny import MERGE, PATCH, build_vl_model, make_vl_tokenizer, vl_bundle

QUESTION = "What is in the image?"
METHODS = ["macs", "rollout", "atman", "random"]
K = 4


def _image(seed: int = 0) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (60, 100, 3), dtype=np.uint8))


@pytest.fixture(scope="module")
def setup():
    tokenizer = make_vl_tokenizer()
    model = build_vl_model(tokenizer)
    bundle = vl_bundle(model, tokenizer)
    attr = explain(bundle, QUESTION, image=_image(), methods=METHODS, max_new_tokens=K)
    enc = encode_image_prompt(bundle, _image(), QUESTION)
    return model, bundle, attr, enc


def _reference_logprobs(model, ids: torch.Tensor, n: int, extra: dict, hidden: list[int]) -> np.ndarray:
    """(K,) log p of each answer token from one full forward (vision tower included, no cache) with eager attention
    whose scores to the `hidden` keys are masked, in a plain loop, for the queries from N - 1 on."""
    with torch.no_grad(), suppressed_eager_attention(model.config.text_config, from_query=n - 1) as edits:
        edits.update({j: 0.0 for j in hidden})  # factor 0: masked
        logp = torch.log_softmax(model(input_ids=ids, **extra).logits[0].double(), dim=-1)  # (T, V)
    targets = ids[0, n:].tolist()
    return np.array([float(logp[n - 1 + k, targets[k]]) for k in range(len(targets))])


def _assert_clean(model) -> None:
    assert registered_names() == []
    assert model.config.text_config._attn_implementation == "sdpa"
    assert model.model.rope_deltas is None


@pytest.mark.parametrize("cache", [True, False])
def test_knockout_equals_a_full_eager_forward_with_the_image_masked_for_the_answer(setup, cache, monkeypatch):
    model, _, attr, enc = setup
    if not cache:  # a cache that cannot be sliced: one full forward of batch 2, the bias on the answer's queries
        monkeypatch.setattr(reliance_module, "reusable", lambda *args: False)
    ids = torch.tensor([attr.prompt_token_ids + attr.generated_token_ids])  # (1, N + K)
    n, extra = attr.num_prompt_tokens, full_sequence_inputs(enc.prefill_inputs, attr.num_steps)
    visible, hidden = image_knockout(model, ids, n, enc.image_positions, extra)
    expected_visible = _reference_logprobs(model, ids, n, extra, [])
    expected_hidden = _reference_logprobs(model, ids, n, extra, enc.image_positions)
    np.testing.assert_allclose(visible, expected_visible, atol=1e-4)
    np.testing.assert_allclose(hidden, expected_hidden, atol=1e-4)
    assert np.abs(expected_hidden - expected_visible).max() > 0.05  # the knockout changes something to compare
    # hiding the image from every later query (the prompt's question included) is another quantity: the bias must
    # reach the answer's queries only
    with torch.no_grad(), suppressed_eager_attention(model.config.text_config) as edits:
        edits.update({j: 0.0 for j in enc.image_positions})
        removed = torch.log_softmax(model(input_ids=ids, **extra).logits[0].double(), dim=-1)
    removed = np.array([float(removed[n - 1 + k, t]) for k, t in enumerate(attr.generated_token_ids)])
    assert np.abs(removed - expected_hidden).max() > 1e-3
    _assert_clean(model)


def test_the_result_holds_the_knockout_and_the_decode_loops_log_probabilities(setup):
    model, _, attr, enc = setup
    rel = attr.reliance
    assert isinstance(rel, Reliance) and rel.num_steps == attr.num_steps == K
    ids = torch.tensor([attr.prompt_token_ids + attr.generated_token_ids])
    extra = full_sequence_inputs(enc.prefill_inputs, attr.num_steps)
    n = attr.num_prompt_tokens
    np.testing.assert_allclose(rel.image_hidden_logprob, _reference_logprobs(model, ids, n, extra, enc.image_positions),
                               atol=1e-4)  # fmt: skip
    # the baseline is recomputed in the knockout's pass; in float32 on a CPU it is the decode loop's log p
    np.testing.assert_allclose(rel.logprob, np.log(attr.step_scores["probability"]), atol=1e-4)
    np.testing.assert_allclose(rel.drop, rel.logprob - rel.image_hidden_logprob, atol=1e-6)
    assert attr.meta["status"] == "done" and attr.meta["reliance_seconds"] > 0


def _plain_share(raw: np.ndarray, image: list[int], text: list[int], floor: list[float]) -> list[float]:
    out = []
    for k in range(raw.shape[0]):
        on_image = on_text = 0.0
        for i in image:
            on_image += max(float(raw[k, i]) - floor[k], 0.0) if not math.isnan(raw[k, i]) else 0.0
        for i in text:
            on_text += max(float(raw[k, i]) - floor[k], 0.0) if not math.isnan(raw[k, i]) else 0.0
        total = on_image + on_text
        out.append(on_image / total if total > 0 and not math.isnan(floor[k]) else math.nan)
    return out


def test_shares_equal_a_plain_loop():
    rng = np.random.default_rng(1)
    raw = rng.normal(size=(5, 12)).astype(np.float32)  # signed, as AtMan's and the gradients' scores
    raw[1, 3] = np.nan  # no score: no evidence
    raw[2] = -1.0  # no positive evidence anywhere: NaN
    image, text = [2, 3, 4, 5, 6], [8, 9, 11]
    for floor in ([0.0] * 5, [0.3, -0.2, 0.0, math.nan, 0.1]):  # per step; NaN: unknown (a rescaled MACS step)
        got = image_share(raw, image, text, np.array(floor))
        np.testing.assert_allclose(got, _plain_share(raw, image, text, floor), atol=1e-6)
        assert math.isnan(got[2]) and got.dtype == np.float32
    assert math.isnan(image_share(raw, image, text, np.array([0.0, 0, 0, math.nan, 0]))[3])
    assert np.all(image_share(np.ones((2, 12)), image, text) == np.float32(5 / 8))  # even: the token count share


def test_positions_leave_out_the_template_and_sinks():
    image, text = share_positions([5, 6, 7, 8], [1, 2, 10, 11], sinks=[0, 6, 11])
    assert image == [5, 7, 8] and text == [1, 2, 10]


def test_the_results_shares_use_each_methods_floor_over_the_question_and_the_image(setup):
    model, _, attr, enc = setup
    rel = attr.reliance
    assert set(rel.image_share) == set(METHODS)
    sinks = set(sink_positions(attr))
    image = [p for p in enc.image_positions if p not in sinks]
    text = [p for p in enc.user_positions if p not in sinks]
    assert rel.image_positions == image and rel.text_positions == text and text
    layers = model.config.text_config.num_hidden_layers
    floors = {"macs": (1 - 0.8) ** layers}  # Eq. 6's floor over L layers; 0 for the others
    assert rel.share_floor == pytest.approx({m: floors.get(m, 0.0) for m in METHODS})
    for name in METHODS:
        expected = _plain_share(attr.methods[name].raw, image, text, [floors.get(name, 0.0)] * K)
        np.testing.assert_allclose(rel.image_share[name], expected, atol=1e-6)
        assert np.all((rel.image_share[name] >= 0) & (rel.image_share[name] <= 1))
    assert rel.even_share == pytest.approx(len(image) / (len(image) + len(text)))


def test_a_rescaled_macs_step_has_no_floor():
    macs = get_method("macs", alpha=0.5)
    macs.rescaled_steps = [1]
    floor = macs.raw_floor(3, 4)
    assert floor[0] == floor[2] == 0.5**4 and math.isnan(floor[1])
    assert np.all(get_method("atman").raw_floor(3, 4) == 0)


def test_the_json_round_trip_keeps_every_value(setup):
    attr = setup[2]
    again = load_result(result_json(attr).encode())
    a, b = attr.reliance, again.reliance
    np.testing.assert_array_equal(a.logprob, b.logprob)
    np.testing.assert_array_equal(a.image_hidden_logprob, b.image_hidden_logprob)
    for name in METHODS:
        np.testing.assert_array_equal(a.image_share[name], b.image_share[name])
    assert (a.image_positions, a.text_positions, a.share_floor) == (b.image_positions, b.text_positions, b.share_floor)
    nan = json.loads(result_json(attr))
    nan["reliance"]["image_share"]["macs"][0] = float("nan")  # no evidence at that step: kept as NaN
    assert math.isnan(load_result(json.dumps(nan).encode()).reliance.image_share["macs"][0])


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda r: r["logprob"].pop(), r"reliance\.logprob must be a list of 4 log-probabilities"),
        (lambda r: r["image_hidden_logprob"].__setitem__(0, 0.5), r"image_hidden_logprob must hold log-probab"),
        (lambda r: r["image_share"]["macs"].__setitem__(1, 1.5), r"image_share\['macs'\] must hold shares"),
        (lambda r: r["image_positions"].append(10**6), r"reliance\.image_positions must hold prompt positions"),
        (lambda r: r.pop("logprob"), r"reliance\.logprob is missing"),
    ],
)
def test_a_malformed_reliance_is_refused_naming_the_field(setup, edit, message):
    data = json.loads(result_json(setup[2]))
    edit(data["reliance"])
    with pytest.raises(InputError, match=message):
        load_result(json.dumps(data).encode())


def test_off_on_request_and_for_text_prompts(setup, tokenizer):
    _, bundle, _, _ = setup
    off = explain(bundle, QUESTION, image=_image(), methods=["macs"], max_new_tokens=2, reliance=False)
    assert off.reliance is None and "reliance_seconds" not in off.meta
    from explainer import bundle_from_objects

    text = bundle_from_objects(build_model("llama"), tokenizer, name="tiny")
    attr = explain(text, "the cat sat", methods=["macs"], max_new_tokens=2)
    assert attr.reliance is None and "reliance" not in json.loads(result_json(attr))


def test_a_model_whose_attention_cannot_be_edited_keeps_its_maps(setup, monkeypatch):
    from explainer.errors import UnsupportedModelError

    def refuse(*args, **kwargs):
        raise UnsupportedModelError("no attention layer to edit")

    monkeypatch.setattr(reliance_module, "image_knockout", refuse)
    attr = explain(setup[1], QUESTION, image=_image(), methods=["macs"], max_new_tokens=2)
    assert attr.reliance is None and attr.meta["reliance_error"] == "no attention layer to edit"
    assert attr.meta["status"] == "done" and attr.methods["macs"].raw.shape[0] == attr.num_steps


@pytest.fixture(scope="module")
def vl_model_dir(tmp_path_factory, setup):
    model, bundle = setup[0], setup[1]
    path = tmp_path_factory.mktemp("tiny-qwen2.5-vl")
    model.save_pretrained(path)
    bundle.tokenizer.save_pretrained(path)
    return path


def test_explain_image_json_has_reliance_for_every_step_and_prints_it(tmp_path, vl_model_dir, capsys):
    img_path, out = tmp_path / "shape.png", tmp_path / "out.json"
    _image(3).save(img_path)
    args = ["explain", "--model", str(vl_model_dir), "--image", str(img_path), "--prompt", QUESTION,
            "--max-new-tokens", "3", "--max-pixels", str(12 * (PATCH * MERGE) ** 2),
            "--methods", "macs,random"]  # fmt: skip
    assert cli_main([*args, "--json", str(out)]) == 0, capsys.readouterr().err
    data = json.loads(out.read_text())
    k = len(data["generated_token_ids"])
    rel = data["reliance"]
    assert k >= 1 and len(rel["logprob"]) == len(rel["image_hidden_logprob"]) == k
    assert {name: len(v) for name, v in rel["image_share"].items()} == {"macs": k, "random": k}
    assert all(v <= 0 for v in rel["logprob"] + rel["image_hidden_logprob"])
    assert cli_main(args) == 0
    printed = capsys.readouterr().out
    assert "image reliance: log p" in printed and printed.count("| share macs") == k
    assert cli_main([*args, "--json", str(out), "--no-reliance"]) == 0
    assert "reliance" not in json.loads(out.read_text())
