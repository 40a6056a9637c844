"""MACS's per-layer factors (Eq. 6), kept with `keep_layers`: equal to a plain-loop reference over eager attention,
their product over layers is the MACS row before z-scoring, they cost no host read per token, they are counted in
the memory estimate, and they reach the JSON only when asked for."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from explainer import bundle_from_objects, explain
from explainer.cli import EXIT_USER_ERROR, main
from explainer.errors import InputError
from explainer.methods import MACS, MACSConfig, get_method
from explainer.result.attribution import load_result, result_json, zscore
from explainer.runtime.memory import MemoryRequest, ModelShape, request_bytes

from ...conftest import build_model, eager_attentions
from ..test_host_syncs import CountHostReads, reads_per_step

PROMPT = "Question: What is the capital of France? Context: Paris is the capital of France."
KEEP = {"keep_layers": True}


def reference_factors(attentions, n: int, k_steps: int, alpha=0.8, pooling="max", redistribute=True):
    """(K, L, N) floored per-layer factors (Eq. 4-6) from eager attentions, with plain loops."""
    pool = {"max": max, "min": min, "mean": lambda v: sum(v) / len(v)}[pooling]
    out = []
    for k in range(k_steps):
        q = n - 1 + k  # the query that predicts answer token k
        layers = []
        for att in attentions:
            a = att[0].double()  # (H, T, T)
            row = []
            for i in range(n):
                heads = []
                for h in range(a.shape[0]):
                    value = float(a[h, q, i])
                    if redistribute:  # the generated keys' attention, shared out over the N input tokens
                        value += sum(float(a[h, q, n + p]) for p in range(k)) / n
                    heads.append(value)
                row.append(alpha * pool(heads) + 1 - alpha)
            layers.append(row)
        out.append(layers)
    return np.array(out)


@pytest.fixture(scope="module")
def bundles(tokenizer):
    return {kind: bundle_from_objects(build_model(kind), tokenizer, name=kind) for kind in ("llama", "qwen2_sliding")}


@pytest.mark.parametrize("options", [{}, {"redistribute": False}, {"pooling": "mean", "alpha": 0.5}], ids=str)
@pytest.mark.parametrize("kind", ["llama", "qwen2_sliding"])
def test_factors_equal_the_reference_and_multiply_to_the_macs_row(bundles, kind, options):
    bundle = bundles[kind]
    attr = explain(bundle, PROMPT, methods=["macs"], max_new_tokens=6, method_options={"macs": {**options, **KEEP}})
    scores = attr.methods["macs"]
    n, k, layers = attr.num_prompt_tokens, attr.num_steps, bundle.model.config.num_hidden_layers
    assert k == 6 and scores.layers.shape == (k, layers, n) and scores.layers.dtype == np.float32
    ids = torch.tensor([attr.prompt_token_ids + attr.generated_token_ids])
    attentions, _ = eager_attentions(bundle.model, ids)
    np.testing.assert_allclose(scores.layers, reference_factors(attentions, n, k, **options), atol=1e-5, rtol=0)
    product = np.prod(scores.layers.astype(np.float64), axis=1)  # (K, N), Eq. 7
    np.testing.assert_allclose(product, scores.raw, rtol=1e-6, atol=1e-6)  # steps k > 0: after redistribution
    np.testing.assert_allclose(zscore(product), scores.z, atol=1e-5)
    assert scores.meta["keep_layers"] is True and scores.meta["rescaled_steps"] == []


def test_keeping_the_factors_changes_neither_the_answer_nor_the_scores(bundles):
    bundle = bundles["llama"]
    kept = explain(bundle, PROMPT, methods=["macs", "rollout"], max_new_tokens=5, method_options={"macs": KEEP})
    plain = explain(bundle, PROMPT, methods=["macs", "rollout"], max_new_tokens=5)
    assert kept.generated_token_ids == plain.generated_token_ids
    np.testing.assert_array_equal(kept.methods["macs"].raw, plain.methods["macs"].raw)
    assert plain.methods["macs"].layers is None and kept.methods["rollout"].layers is None


def test_a_given_answer_keeps_the_factors_of_every_forced_token(bundles):
    bundle = bundles["qwen2_sliding"]
    attr = explain(bundle, PROMPT, methods=["macs"], answer=" Paris is the capital", method_options={"macs": KEEP})
    scores = attr.methods["macs"]
    assert attr.meta["answer"] == "given" and scores.layers.shape[0] == attr.num_steps >= 2
    np.testing.assert_allclose(np.prod(scores.layers.astype(np.float64), axis=1), scores.raw, rtol=1e-6, atol=1e-6)


def test_the_buffer_grows_past_its_first_capacity_without_losing_a_step():
    """70 steps of random rows (T growing as in generation): every step's factors kept, in order."""
    g = torch.Generator().manual_seed(1)
    layers, heads, n, steps = 3, 2, 5, 70
    macs = MACS(MACSConfig(keep_layers=True))
    macs.begin(n)
    rows, inputs = [], []
    for k in range(steps):
        a = torch.softmax(torch.randn(layers, heads, n + k, generator=g), dim=-1)  # (L, H, N + k)
        rows.append(macs.step(a))
        inputs.append(a)
    kept = macs.layer_scores()
    assert kept.shape == (steps, layers, n) and macs.layers.shape[0] == 128  # doubled once
    np.testing.assert_allclose(np.prod(kept.astype(np.float64), axis=1), np.stack(rows), rtol=1e-6)
    a = inputs[-1].double()
    a_in = a[..., :n] + a[..., n:].sum(-1, keepdim=True) / n  # Eq. 4
    np.testing.assert_allclose(kept[-1], 0.8 * a_in.amax(dim=1).numpy() + 0.2, rtol=1e-6)
    macs.begin(n)  # a new generation starts empty
    macs.step(inputs[0])
    assert macs.layer_scores().shape == (1, layers, n)


def test_without_keep_layers_nothing_is_kept():
    macs = MACS(MACSConfig())
    macs.begin(4)
    macs.step(torch.softmax(torch.randn(2, 2, 4, generator=torch.Generator().manual_seed(0)), dim=-1))
    assert macs.layer_scores() is None and macs.layers is None


@pytest.mark.parametrize("kind", ["llama", "qwen2_sliding"])
def test_keeping_the_factors_adds_no_host_read_per_token(kind):
    """Per decode step the reads stay one for the token plus one per streaming method; the factors are read once."""
    model = build_model(kind)
    macs = get_method("macs", **KEEP)
    counts = reads_per_step(model, 9, [macs, "rollout"])
    assert counts[1:] == [3] * (len(counts) - 1), counts
    with CountHostReads() as mode:
        kept = macs.layer_scores()
    assert mode.count == 1 and kept.shape == (6, model.config.num_hidden_layers, 9)


def test_the_memory_estimate_counts_the_buffer(llama):
    shape = ModelShape.of(llama)
    for k, capacity in ((1, 64), (64, 64), (65, 128 + 64), (200, 256 + 128)):
        request = MemoryRequest(shape, n=1000, k=k)
        assert MACS.memory(request, MACSConfig(keep_layers=True)) == 4 * shape.layers * 1000 * capacity
        assert MACS.memory(request, MACSConfig()) == 0
    parts = request_bytes(MemoryRequest(shape, n=1000, k=10), [get_method("macs", **KEEP), get_method("macs")])
    assert parts["macs"] == 4 * shape.layers * 1000 * 64


def test_the_json_carries_the_factors_only_when_asked(bundles):
    attr = explain(
        bundles["llama"], PROMPT, methods=["macs", "random"], max_new_tokens=3, method_options={"macs": KEEP}
    )
    plain = result_json(attr)
    assert "layers" not in json.loads(plain)["methods"]["macs"]
    assert load_result(plain.encode()).methods["macs"].layers is None
    text = result_json(attr, layers=True)
    saved = json.loads(text)["methods"]
    assert "layers" in saved["macs"] and "layers" not in saved["random"]
    back = load_result(text.encode())
    np.testing.assert_array_equal(back.methods["macs"].layers, attr.methods["macs"].layers)  # bit-identical
    assert back.methods["random"].layers is None


@pytest.mark.parametrize("broken", ["not a list", "one token", "a step short", "ragged layers", "empty tables"])
def test_malformed_factors_are_refused_naming_the_field(bundles, broken):
    attr = explain(bundles["llama"], PROMPT, methods=["macs"], max_new_tokens=2, method_options={"macs": KEEP})
    d = json.loads(result_json(attr, layers=True))
    kept = d["methods"]["macs"]["layers"]  # K = 2 tables of L rows of N numbers
    d["methods"]["macs"]["layers"] = {
        "not a list": "0.5",
        "one token": [[[0.5]], [[0.5]]],
        "a step short": kept[:1],
        "ragged layers": [kept[0], kept[1][:-1]],
        "empty tables": [[], []],
    }[broken]
    with pytest.raises(InputError, match=r"methods\['macs'\]\.layers must be 2 tables .* of \d+ numbers"):
        load_result(json.dumps(d).encode())


def test_old_files_still_open_without_factors():
    from pathlib import Path

    for path in sorted((Path(__file__).resolve().parents[2] / "data").glob("result-v0-*.json")):
        attr = load_result(path)
        assert attr.methods and all(s.layers is None for s in attr.methods.values())


def test_cli_writes_the_factors_with_macs_layers(tiny_model_dir, tmp_path, capsys):
    out, plain = tmp_path / "layers.json", tmp_path / "plain.json"
    common = ["explain", "--model", str(tiny_model_dir), "--prompt", "Paris is", "--max-new-tokens", "3"]
    assert main([*common, "--methods", "macs,random", "--json", str(out), "--macs-layers"]) == 0
    assert main([*common, "--methods", "macs,random", "--json", str(plain)]) == 0
    d = json.loads(out.read_text())
    layers = np.array(d["methods"]["macs"]["layers"])  # (K, L, N)
    assert layers.shape[0] == len(d["generated_token_ids"]) and layers.shape[2] == len(d["prompt_token_ids"])
    np.testing.assert_allclose(layers.prod(axis=1), np.array(d["methods"]["macs"]["raw"]), rtol=1e-5)
    assert "layers" not in json.loads(plain.read_text())["methods"]["macs"]
    capsys.readouterr()
    assert main([*common, "--macs-layers"]) == EXIT_USER_ERROR  # no --json to write them into
    assert main([*common, "--methods", "random", "--json", str(out), "--macs-layers"]) == EXIT_USER_ERROR
    assert capsys.readouterr().err.count("--macs-layers") == 2


def test_image_prompts_keep_the_factors_over_every_input_token():
    from ...vl_tiny import build_vl_model, make_vl_tokenizer, vl_bundle

    tokenizer = make_vl_tokenizer()
    bundle = vl_bundle(build_vl_model(tokenizer), tokenizer)
    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (56, 84, 3), dtype=np.uint8))
    attr = explain(
        bundle, "What is in the image?", methods=["macs"], image=image, max_new_tokens=3, method_options={"macs": KEEP}
    )
    scores = attr.methods["macs"]
    assert scores.layers.shape == (attr.num_steps, 3, attr.num_prompt_tokens) and attr.image["token_positions"]
    np.testing.assert_allclose(np.prod(scores.layers.astype(np.float64), axis=1), scores.raw, rtol=1e-6, atol=1e-6)
