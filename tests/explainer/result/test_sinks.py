"""Attention sinks: a sink planted in a tiny model is found (and nothing on the same model unplanted), the tracker
changes neither the generated tokens nor the host reads per step and leaves no hook behind, the record survives the
JSON round trip (and old files load without one), and the rule and the masking are checked on plain arrays."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from explainer import explain
from explainer.decoding import DecodeJob, generate_steps
from explainer.explain import decode_choice
from explainer.methods import get_method
from explainer.models.loading import bundle_from_objects
from explainer.result.attribution import Attribution, load_result, result_json, zscore
from explainer.result.image_maps import image_sinks
from explainer.result.sinks import SinkConfig, SinkTracker, detect_sinks, leave_out_sinks, sink_positions

from ...conftest import build_model
from ...vl_tiny import build_vl_model, make_vl_tokenizer, vl_bundle
from ..test_host_syncs import reads_per_step

PROMPT = "Paris is the capital of France, and Berlin is the capital of Germany. What is the capital of France?"
DATA = Path(__file__).resolve().parents[2] / "data"


def plant_sink(model: torch.nn.Module, token_id: int, scale: float = 1000.0) -> None:
    """Make `token_id` an attention sink in every layer and head of a Qwen2-style model (query biases): its embedding
    grows to a massive norm along its own direction e, and `attend_to` makes every query seek e."""
    embedding = model.get_input_embeddings().weight
    with torch.no_grad():
        e = embedding[token_id] / embedding[token_id].norm()  # (D,)
        embedding[token_id] = scale * e
    attend_to(model, e)


def attend_to(model: torch.nn.Module, e: torch.Tensor) -> None:
    """Every key projection reads the direction e (D,) into the slowest rotary dimension j (which barely turns over a
    short prompt), and every query gets a large bias at j: any query then scores a hidden state along e far above
    all others."""
    with torch.no_grad():
        for layer in model.get_decoder().layers:
            attn = layer.self_attn
            hd = attn.head_dim
            j = hd // 2 - 1  # the last rotary frequency, the slowest
            for h in range(attn.q_proj.out_features // hd):
                attn.q_proj.bias[h * hd + j] = 10.0
            for h in range(attn.k_proj.out_features // hd):
                attn.k_proj.weight[h * hd + j] = 5.0 * e / layer.input_layernorm.weight
                attn.k_proj.bias[h * hd + j] = 0.0


@pytest.fixture(scope="module")
def tokenizer_():
    from ...conftest import make_tokenizer

    return make_tokenizer()


@pytest.mark.parametrize("kind", ["qwen2", "qwen2_sliding"])
def test_a_planted_sink_is_found_and_an_unplanted_model_has_none(tokenizer_, kind):
    model = build_model(kind)
    bundle = bundle_from_objects(model, tokenizer_, name=kind)
    control = explain(bundle, PROMPT, methods=["macs"], max_new_tokens=6)
    assert control.meta["sinks"]["positions"] == [] and control.meta["sinks"]["steps"] == 6
    target = control.prompt_token_ids[7]
    assert control.prompt_token_ids.count(target) == 1
    plant_sink(model, target)
    planted = explain(bundle, PROMPT, methods=["macs"], max_new_tokens=6)
    record = planted.meta["sinks"]
    assert record["positions"] == [7]
    (evidence,) = record["evidence"]
    assert evidence["by"] == ["share", "norm"] and evidence["min_share"] > 0.9 and evidence["norm_ratio"] > 10
    assert record["rule"] == {"mad_factor": 6.0, "min_share_ratio": 5.0, "min_norm_ratio": 5.0}
    assert sink_positions(planted) == [7]


def test_a_sink_planted_in_an_image_prompt_is_found():
    tokenizer = make_vl_tokenizer()
    model = build_vl_model(tokenizer)
    bundle = vl_bundle(model, tokenizer)
    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (84, 112, 3)).astype(np.uint8))
    control = explain(bundle, "What is in the image?", image=image, methods=["macs"], max_new_tokens=3)
    assert control.meta["sinks"]["positions"] == [] and control.meta["sinks"]["norm_layer"] == 1
    start = tokenizer.convert_tokens_to_ids("<|vision_start|>")  # just before the image tokens
    plant_sink(model, start)
    planted = explain(bundle, "What is in the image?", image=image, methods=["macs", "atman"], max_new_tokens=3)
    assert sink_positions(planted) == [planted.prompt_token_ids.index(start)]
    assert sink_positions(planted)[0] + 1 == planted.image["token_positions"][0]


def test_a_sink_planted_on_an_image_token_is_found_in_its_grid_cell():
    tokenizer = make_vl_tokenizer()
    model = build_vl_model(tokenizer)
    bundle = vl_bundle(model, tokenizer)
    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (84, 112, 3)).astype(np.uint8))
    e = torch.nn.functional.normalize(torch.randn(model.config.text_config.hidden_size), dim=0)  # (D,)
    attend_to(model, e)

    def massive(module, args, output):  # the merged patch features of image token 4: a massive activation along e
        output.pooler_output[4] = 1000.0 * e

    handle = model.model.visual.register_forward_hook(massive)
    try:
        attr = explain(bundle, "What is in the image?", image=image, methods=["rollout"], max_new_tokens=3)
    finally:
        handle.remove()
    assert sink_positions(attr) == [attr.image["token_positions"][4]]
    assert attr.meta["sinks"]["evidence"][0]["by"] == ["share", "norm"]
    h, w = attr.image["grid"]
    assert np.flatnonzero(image_sinks(attr)).tolist() == [4] and image_sinks(attr).shape == (h, w)


def _tokens(model, ids, methods, sinks=None):
    job = DecodeJob(ids, [get_method(m) for m in methods], 8)
    return [s.token_id for s in generate_steps(model, job, decode_choice(model, job), sinks=sinks)]


@pytest.mark.parametrize("kind", ["llama", "qwen2_sliding"])
def test_tracking_changes_no_token_no_host_read_and_leaves_no_hook(kind):
    model = build_model(kind)
    ids = torch.arange(3, 40)[None] % model.config.vocab_size  # (1, 37)
    plain = _tokens(model, ids, [])
    tracker = SinkTracker(ids.shape[1], model)
    assert _tokens(model, ids, ["macs"], tracker) == plain == _tokens(model, ids, ["macs"])
    assert tracker.steps == 8 and tracker.norms.shape == (37,) and tracker.record()["steps"] == 8
    assert all(not layer._forward_pre_hooks for layer in model.get_decoder().layers)
    counts = reads_per_step(model, ids.shape[1], ["macs"], sinks=SinkTracker(ids.shape[1], model))
    assert counts[1:] == [2] * (len(counts) - 1)  # the token's read and MACS's, as without tracking


def test_the_norm_hook_is_removed_after_a_failed_pass():
    model = build_model("llama")
    tracker = SinkTracker(4, model)
    with pytest.raises(RuntimeError, match="boom"):
        with tracker.probing_norms(model):
            assert any(layer._forward_pre_hooks for layer in model.get_decoder().layers)
            raise RuntimeError("boom")
    assert all(not layer._forward_pre_hooks for layer in model.get_decoder().layers)


def test_without_captured_attention_nothing_is_recorded(tokenizer_):
    bundle = bundle_from_objects(build_model("llama"), tokenizer_, name="llama")
    attr = explain(bundle, PROMPT, methods=["atman"], max_new_tokens=2)  # no streaming method: no rows
    assert "sinks" not in attr.meta and sink_positions(attr) == []


def test_the_record_survives_the_json_round_trip_and_old_files_have_none(tokenizer_, tmp_path):
    model = build_model("qwen2")
    bundle = bundle_from_objects(model, tokenizer_, name="qwen2")
    plant_sink(model, bundle.encode(PROMPT).input_ids[0, 7].item())
    attr = explain(bundle, PROMPT, methods=["macs"], max_new_tokens=3)
    back = load_result(result_json(attr).encode())
    assert back.meta["sinks"] == json.loads(json.dumps(attr.meta["sinks"])) and sink_positions(back) == [7]
    attr.save_json(tmp_path / "r.json")
    assert Attribution.load_json(tmp_path / "r.json").meta["sinks"]["positions"] == [7]
    for name in ("result-v0-cli.json", "result-v0-app.json"):
        assert sink_positions(load_result(DATA / name)) == []


def test_malformed_records_give_no_sinks():
    attr = Attribution(model="m", prompt_token_ids=[1, 2, 3], prompt_tokens=["a", "b", "c"])
    for record in (None, [], {"positions": "0"}, {"positions": [True, -1, 3, "1", 1.0]}):
        attr.meta["sinks"] = record
        assert sink_positions(attr) == []
    attr.meta["sinks"] = {"positions": [2, 0, 2]}
    assert sink_positions(attr) == [0, 2]


# --- the rule and the masking on plain arrays ------------------------------------------------------------------


def test_the_rule_on_plain_arrays():
    rng = np.random.default_rng(0)
    share = rng.uniform(0.5, 1.5, 100).astype(np.float32) / 100  # uneven, no sink
    assert detect_sinks(share) == []
    share[0] = 0.4  # the first token takes 40%
    (sink,) = detect_sinks(share)
    assert sink["position"] == 0 and sink["by"] == ["share"] and sink["norm_ratio"] is None
    # large on average but small at some step: query-dependent, not a sink
    assert detect_sinks(share, min_share=np.full(100, 0.001, dtype=np.float32)) == []
    norms = rng.uniform(9, 11, 100).astype(np.float32)
    norms[42] = 800.0  # a massive activation
    found = detect_sinks(share, norms)
    assert [s["position"] for s in found] == [0, 42] and found[1]["by"] == ["norm"] and found[1]["norm_ratio"] > 70
    norms[42] = 40.0  # an outlier, but under 5x the median
    assert [s["position"] for s in detect_sinks(share, norms)] == [0]
    assert [s["position"] for s in detect_sinks(share, norms, SinkConfig(min_norm_ratio=3.0))] == [0, 42]
    assert detect_sinks(np.full(10, 0.1, dtype=np.float32)) == []  # all equal: MAD 0, nothing above the median
    assert detect_sinks(np.array([np.nan, 0.5], dtype=np.float32)) == [] and detect_sinks(np.ones(1)) == []


def test_leave_out_sinks_standardises_the_rest_and_blanks_the_sinks():
    rng = np.random.default_rng(1)
    raw = rng.normal(size=(3, 8)).astype(np.float32)
    raw[:, 0] = 100.0  # the sink dominates every step
    z = leave_out_sinks(raw, [0])
    assert z.dtype == np.float32 and np.isnan(z[:, 0]).all()
    np.testing.assert_allclose(z[:, 1:], zscore(raw[:, 1:]), atol=1e-6)
    assert np.allclose(np.nanmean(z, axis=1), 0, atol=1e-6) and np.allclose(np.nanstd(z, axis=1), 1, atol=1e-5)
    z = leave_out_sinks(raw, [0, 5], positions=[0, 2, 3, 5, 6])  # within a subset (the user's tokens)
    assert np.isfinite(z[:, [2, 3, 6]]).all() and np.isnan(z[:, [0, 1, 4, 5, 7]]).all()
    np.testing.assert_allclose(z[:, [2, 3, 6]], zscore(raw[:, [2, 3, 6]]), atol=1e-6)
    np.testing.assert_array_equal(leave_out_sinks(raw, []), zscore(raw))
