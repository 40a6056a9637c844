"""Models loaded with a device map (accelerate's big-model dispatch): capture, every registered method and the
faithfulness measurement give the plain CPU run's results when accelerate's hooks move weights at run time (CPU +
disk offload of the embedded model), rows of all layers are gathered on one device, and `--device-map` parses."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from explainer import explain, load_model
from explainer.capture import AttentionRecorder, registered_names
from explainer.cli import EXIT_USER_ERROR, main
from explainer.errors import InputError, ModelLoadError
from explainer.faithfulness import SoftConfig, removal_curves, soft_curves
from explainer.methods import METHODS
from explainer.models.loading import parse_device_map
from explainer.runtime.devices import input_device, parameter_value

PROMPT = "The capital of France is"
NEW_TOKENS = 6


@pytest.fixture(scope="module")
def offloaded(tmp_path_factory):
    """The embedded model with about half of its layers on disk: "auto" with a CPU budget below its 540 MB."""
    folder = tmp_path_factory.mktemp("offload")
    return load_model(None, device_map="auto", max_memory={"cpu": "300MB"}, offload_folder=str(folder))


@pytest.fixture(scope="module")
def runs(offloaded):
    plain = load_model(None, device="cpu")
    options = dict(methods=list(METHODS), max_new_tokens=NEW_TOKENS, chat_template=False,
                   method_options={"sources": {"unit": "word"}})  # one sentence: Sources fits over its words
    return plain, explain(plain, PROMPT, **options), explain(offloaded, PROMPT, **options)


def _disk_layer(bundle) -> torch.nn.Module:
    name = next(n for n, d in bundle.model.hf_device_map.items() if d == "disk" and ".layers." in n)
    return bundle.model.get_submodule(name)


def test_offloaded_model_is_really_offloaded(offloaded):
    placed = set(offloaded.model.hf_device_map.values())
    assert placed == {"cpu", "disk"}, offloaded.model.hf_device_map
    assert _disk_layer(offloaded).self_attn.q_proj.weight.device.type == "meta"  # loaded by the hooks per forward
    assert offloaded.device == torch.device("cpu")


def test_every_method_under_offload_equals_the_plain_cpu_run(runs, offloaded):
    _, plain, off = runs
    assert off.generated_token_ids == plain.generated_token_ids and len(plain.generated_token_ids) == NEW_TOKENS
    assert set(off.methods) == set(plain.methods) == set(METHODS)
    for name in METHODS:
        np.testing.assert_allclose(off.methods[name].raw, plain.methods[name].raw, rtol=1e-5, atol=1e-6, err_msg=name)
        assert np.abs(plain.methods[name].raw).sum() > 0, name
    # Nothing outlives a request: flags restored on the parameters the hooks swap in, no function left registered,
    # the disk layers back on meta.
    assert all(p.requires_grad for p in offloaded.model.parameters())
    assert registered_names() == []
    assert _disk_layer(offloaded).mlp.down_proj.weight.device.type == "meta"


def test_faithfulness_under_offload_equals_the_plain_cpu_run(runs, offloaded):
    plain_bundle, plain, off = runs
    methods = ["macs"]  # and the random baseline's orderings
    expected = removal_curves(plain_bundle, plain, methods)
    got = removal_curves(offloaded, off, methods)
    assert got.generations == expected.generations
    assert set(expected.auc) == {"macs", "random"}
    for m in expected.auc:
        for metric, values in expected.auc[m].items():
            for kind, value in values.items():
                assert got.auc[m][metric][kind] == pytest.approx(value, rel=1e-5, abs=1e-6), (m, metric, kind)
    soft = SoftConfig(samples=2, pis=(0.5,), routing="fixed")
    expected_soft = soft_curves(plain_bundle, plain, methods, config=soft, steps=[NEW_TOKENS - 1])
    got_soft = soft_curves(offloaded, off, methods, config=soft, steps=[NEW_TOKENS - 1])
    assert np.isfinite(expected_soft.ns["macs"]).all() and np.isfinite(expected_soft.nc["macs"]).all()
    for m in methods:
        np.testing.assert_allclose(got_soft.ns[m], expected_soft.ns[m], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got_soft.nc[m], expected_soft.nc[m], rtol=1e-5, atol=1e-6)


def test_stacked_gathers_rows_of_layers_on_different_devices():
    """A model split over devices records each layer's row on that layer's device; `stacked` moves them to the
    recorder's device before stacking (torch.stack itself refuses tensors on two devices). Rows on `meta` stand in
    for a second device: without the move, this stack raises."""
    rows = {0: torch.rand(1, 2, 5), 1: torch.rand(1, 2, 5, device="meta"), 2: torch.rand(1, 2, 3)}
    with pytest.raises(RuntimeError):
        torch.stack(list(rows.values())[:2])
    stacked = AttentionRecorder(rows=dict(rows), device=torch.device("meta")).stacked()
    assert stacked.device.type == "meta" and stacked.shape == (3, 1, 2, 5)
    # On one device the values are untouched, short (sliding-window) rows left-padded with zeros.
    same = AttentionRecorder(rows={0: rows[0], 2: rows[2]}).stacked()
    torch.testing.assert_close(same[0], rows[0])
    torch.testing.assert_close(same[1], torch.nn.functional.pad(rows[2], (2, 0)))


def test_offloaded_embedding_device_and_weight():
    """An embedding offloaded for a GPU: its weight sits on meta, its inputs must go to the hook's execution device
    (given by accelerate as a bare CUDA index), and `parameter_value` reads the weight from the hook's map."""
    from accelerate.hooks import AlignDevicesHook, add_hook_to_module

    model = torch.nn.Module()
    model.embed = torch.nn.Embedding(7, 3)
    model.get_input_embeddings = lambda: model.embed
    weight = model.embed.weight.detach().clone()
    assert input_device(model) == torch.device("cpu")
    add_hook_to_module(model.embed, AlignDevicesHook(execution_device=0, offload=True))
    assert model.embed.weight.device.type == "meta"
    assert input_device(model) == torch.device("cuda", 0)
    torch.testing.assert_close(parameter_value(model.embed, "weight"), weight)


def test_parse_device_map():
    assert parse_device_map(None) is None and parse_device_map(" ") is None and parse_device_map("none") is None
    assert parse_device_map("auto") == "auto"
    assert parse_device_map('{"model.layers.1": "disk", "": "cpu"}') == {"model.layers.1": "disk", "": "cpu"}
    with pytest.raises(InputError, match="not valid JSON"):
        parse_device_map("{model: cpu")
    with pytest.raises(InputError):
        load_model(None, device="cpu", device_map="auto")
    with pytest.raises(InputError, match="device map"):
        load_model(None, offload_folder="x")
    with pytest.raises(ModelLoadError, match="Could not place .* device map"):
        load_model(None, device_map={"model.layers.1": "disk", "": "cpu"})  # the layer is placed twice


def test_cli_device_map(tiny_model_dir, tmp_path, capsys):
    base = ["explain", "--model", str(tiny_model_dir), "--prompt", "The quick brown fox", "--max-new-tokens", "2"]
    out, plain = tmp_path / "mapped.json", tmp_path / "plain.json"
    assert main([*base, "--device-map", "auto", "--json", str(out)]) == 0
    assert main([*base, "--device", "cpu", "--json", str(plain)]) == 0
    mapped, expected = json.loads(out.read_text()), json.loads(plain.read_text())
    assert mapped["generated_token_ids"] == expected["generated_token_ids"]
    capsys.readouterr()
    assert main([*base, "--device", "cpu", "--device-map", "auto"]) == EXIT_USER_ERROR
    assert "not both" in capsys.readouterr().err
    assert main([*base, "--device-map", "{bad"]) == EXIT_USER_ERROR
    assert "not valid JSON" in capsys.readouterr().err
