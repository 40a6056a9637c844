"""The static decode path (`explainer/decoding/static.py`) against the solo loop and the eager references.

The static path is forced with `EXPLAINER_DECODE=static` (its fixed-shape step, eagerly) or `cuda-graph` (replayed as
a CUDA graph on CUDA; eagerly on the CPU). Checked row by row against `generate_steps` on the solo loop: the same
tokens, their probabilities, entropies and alternatives, MACS's raw rows and layer factors to float32 rounding, and
the same sink shares; generated and teacher-forced answers, an end-of-sequence token inside a chunk, plain generation
without methods; Rollout alone and beside MACS the same way; an image prompt (Qwen2.5-VL, 3-D positions); MACS against
`reference_macs` and Rollout against `reference_rollout` on eager attention; no host read inside a decode step; the
fallbacks.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from explainer import explain
from explainer.capture import registered_names
from explainer.decoding import CUDA_GRAPH, DECODE_ENV, SOLO, STATIC, DecodeJob, choose_path, generate_steps
from explainer.decoding.static import StaticDecoder
from explainer.explain import decode_choice
from explainer.methods import MACS, MACSCalibrated, Rollout
from explainer.models.loading import bundle_from_objects
from explainer.models.vision import encode_image_prompt
from explainer.result.sinks import SinkTracker

from ...conftest import ACCELERATORS, DEVICES, build_model, eager_attentions
from ...reference import reference_macs, reference_rollout
from ...vl_tiny import build_vl_model, make_vl_tokenizer, vl_bundle
from ..test_host_syncs import CountHostReads, reads_of_each_step
from ..test_on_device import _syncs_per_step

N, K = 23, 13  # chunks of the static path: steps 0 | 1 | 2-3 | 4-7 | 8-12


def _ids(model, n: int = N, device="cpu") -> torch.Tensor:
    return (torch.arange(3, 3 + n, device=device)[None] * 7) % model.config.vocab_size  # (1, n)


def _run(model, ids, path: str, monkeypatch, macs_options=None, rollout_options=None, **kwargs):
    """(steps, MACS layer factors, sink tracker) of one generation on `path` ("solo" or "static"); MACS runs when
    `macs_options` is given, Rollout when `rollout_options` is."""
    monkeypatch.setenv(DECODE_ENV, path)
    methods = [] if macs_options is None else [MACS(**macs_options)]
    methods += [] if rollout_options is None else [Rollout(**rollout_options)]
    sinks = SinkTracker(ids.shape[1], model) if methods else None
    job = DecodeJob(ids, methods, kwargs.pop("k", K), **kwargs)
    steps = list(generate_steps(model, job, decode_choice(model, job), sinks=sinks))
    return steps, (methods[0].layer_scores() if macs_options is not None else None), sinks


def _assert_same_steps(static, dynamic, path=STATIC) -> None:
    assert [s.token_id for s in static] == [s.token_id for s in dynamic]
    assert [s.index for s in static] == list(range(len(dynamic)))
    assert {s.decode_path for s in static} == {path} and {s.decode_path for s in dynamic} == {SOLO}
    for a, b in zip(static, dynamic):
        assert a.scores.keys() == b.scores.keys()
        for name in a.scores:
            assert a.scores[name].dtype == np.float32
            np.testing.assert_allclose(a.scores[name], b.scores[name], rtol=2e-5, atol=0, err_msg=name)
        assert abs(a.probability - b.probability) < 1e-5 and abs(a.entropy - b.entropy) < 1e-4
        assert [i for i, _ in a.alternatives] == [i for i, _ in b.alternatives]
        np.testing.assert_allclose([p for _, p in a.alternatives], [p for _, p in b.alternatives], atol=1e-5)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])  # Qwen2: one key head for four query heads (GQA)
@pytest.mark.parametrize("options", [{}, {"keep_layers": True, "pooling": "mean"}, {"redistribute": False}],
                         ids=["default", "layers-mean", "no-redistribution"])  # fmt: skip
def test_static_path_equals_the_dynamic_path(kind, options, monkeypatch):
    model = build_model(kind)
    ids = _ids(model)
    static, layers, sinks = _run(model, ids, "static", monkeypatch, options)
    dynamic, dyn_layers, dyn_sinks = _run(model, ids, "solo", monkeypatch, options)
    assert len(static) == K
    _assert_same_steps(static, dynamic)
    if options.get("keep_layers"):
        assert layers.shape == dyn_layers.shape == (K, model.config.num_hidden_layers, N)
        np.testing.assert_allclose(layers, dyn_layers, rtol=1e-5)
    assert sinks.steps == dyn_sinks.steps == K
    np.testing.assert_allclose(sinks.share_sum.numpy(), dyn_sinks.share_sum.numpy(), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(sinks.share_min.numpy(), dyn_sinks.share_min.numpy(), rtol=1e-5, atol=1e-7)
    assert sinks.record() == dyn_sinks.record()
    assert registered_names() == []


def test_the_keys_lie_in_one_buffer_and_rows_come_per_layer_where_they_do_not(monkeypatch):
    """The static cache's keys are views of one (L, B, KVH, T, D) buffer (`StackedKeys`: no second copy), whose one
    product gives the rows; where a layer's keys are not in it (`ready` False) the rows come from one product per
    layer: the same steps either way, and the dynamic loop's."""
    from explainer.decoding import static

    model = build_model("qwen2")
    ids = _ids(model)
    seen = []
    ready = static.StackedKeys.ready

    def spy(self):
        seen.append(ready.fget(self))
        storage = self.buffer.untyped_storage().data_ptr()
        assert all(la.keys.untyped_storage().data_ptr() == storage for la in self.layers)
        return seen[-1]

    monkeypatch.setattr(static.StackedKeys, "ready", property(spy))
    stacked = _run(model, ids, "static", monkeypatch, {}, {})[0]
    assert seen and all(seen)
    monkeypatch.setattr(static.StackedKeys, "ready", property(lambda self: False))
    apart = _run(model, ids, "static", monkeypatch, {}, {})[0]
    dynamic = _run(model, ids, "solo", monkeypatch, {}, {})[0]
    _assert_same_steps(stacked, dynamic)
    _assert_same_steps(apart, dynamic)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_teacher_forced_answer_and_plain_generation(kind, monkeypatch):
    model = build_model(kind)
    ids = _ids(model)
    forced = [int(t) for t in (torch.arange(K) * 11 + 5) % model.config.vocab_size]
    forced[4] = model.config.eos_token_id  # a given answer runs all K steps, an end-of-sequence id inside included
    static, _, _ = _run(model, ids, "static", monkeypatch, {}, forced_ids=forced, eos_token_ids=[forced[4]])
    dynamic, _, _ = _run(model, ids, "solo", monkeypatch, {}, forced_ids=forced, eos_token_ids=[forced[4]])
    assert [s.token_id for s in static] == forced
    _assert_same_steps(static, dynamic)
    plain, _, _ = _run(model, ids, "static", monkeypatch)  # no method: no capture, only the tokens and their stats
    _assert_same_steps(plain, _run(model, ids, "solo", monkeypatch)[0])


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
@pytest.mark.parametrize("macs", [None, {"keep_layers": True}], ids=["rollout", "macs+rollout"])
@pytest.mark.parametrize("rollout", [{}, {"head_fusion": "max", "residual": 0.2}], ids=["default", "max-0.2"])
def test_rollout_on_the_static_path_equals_the_dynamic_path(kind, macs, rollout, monkeypatch):
    """Rollout's device step (its Â rows in a fixed (L, K - 1, N + K - 1) buffer) against its solo step, alone and
    beside MACS, for a generated and a given answer; the sinks as well."""
    model = build_model(kind)
    ids = _ids(model)
    static, layers, sinks = _run(model, ids, "static", monkeypatch, macs, rollout)
    dynamic, dyn_layers, dyn_sinks = _run(model, ids, "solo", monkeypatch, macs, rollout)
    assert len(static) == K and set(static[0].scores) == {"rollout"} | ({"macs"} if macs else set())
    _assert_same_steps(static, dynamic)
    if macs:
        np.testing.assert_allclose(layers, dyn_layers, rtol=1e-5)
    assert sinks.record() == dyn_sinks.record()
    forced = [int(t) for t in (torch.arange(K) * 11 + 5) % model.config.vocab_size]
    forced[6] = model.config.eos_token_id  # inside the chunk of steps 4-7: all K steps still run
    static, _, _ = _run(model, ids, "static", monkeypatch, macs, rollout, forced_ids=forced, eos_token_ids=[forced[6]])
    dynamic, _, _ = _run(model, ids, "solo", monkeypatch, macs, rollout, forced_ids=forced, eos_token_ids=[forced[6]])
    assert [s.token_id for s in static] == forced
    _assert_same_steps(static, dynamic)
    assert registered_names() == []


@pytest.mark.parametrize("n", [1, 2])  # a 1-token prompt has no multi-query prefill: its Â row comes from the step
def test_rollout_on_the_static_path_with_a_tiny_prompt(n, monkeypatch):
    model = build_model("llama")
    ids = _ids(model, n)
    static = _run(model, ids, "static", monkeypatch, {}, {}, k=6)[0]
    _assert_same_steps(static, _run(model, ids, "solo", monkeypatch, {}, {}, k=6)[0])


@pytest.mark.parametrize("stop_at", [0, 1, 5, K - 1])  # the prefill, a chunk of one, inside a chunk, the last step
def test_end_of_sequence_stops_both_paths_at_the_same_step(stop_at, monkeypatch):
    model = build_model("llama")
    ids = _ids(model)
    tokens = [s.token_id for s in _run(model, ids, "solo", monkeypatch, {}, k=K)[0]]
    eos = tokens[stop_at]
    first = tokens.index(eos)  # the first time that token comes
    static, _, sinks = _run(model, ids, "static", monkeypatch, {}, {}, eos_token_ids=[eos])  # MACS + Rollout
    dynamic, _, dyn_sinks = _run(model, ids, "solo", monkeypatch, {}, {}, eos_token_ids=[eos])
    assert len(static) == len(dynamic) == first + 1
    _assert_same_steps(static, dynamic)
    assert sinks.steps == dyn_sinks.steps == first + 1  # the steps computed after it are left out of the shares
    np.testing.assert_allclose(sinks.share_sum.numpy(), dyn_sinks.share_sum.numpy(), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_macs_on_the_static_path_equals_the_reference(tokenizer, kind, monkeypatch):
    monkeypatch.setenv(DECODE_ENV, "static")
    bundle = bundle_from_objects(build_model(kind), tokenizer, name=kind)
    prompt = "Question: What is the capital of France? Context: Paris is the capital of France."
    attr = explain(bundle, prompt, methods=["macs"], max_new_tokens=8)
    assert attr.meta["decode"]["path"] == STATIC
    n, k = attr.num_prompt_tokens, attr.num_steps
    attentions, _ = eager_attentions(bundle.model, torch.tensor([attr.prompt_token_ids + attr.generated_token_ids]))
    ref_raw, ref_z = reference_macs(attentions, n, k)
    np.testing.assert_allclose(attr.methods["macs"].raw, np.array(ref_raw), rtol=1e-4, atol=0)
    np.testing.assert_allclose(attr.methods["macs"].z, np.array(ref_z), atol=1e-4)
    monkeypatch.setenv(DECODE_ENV, "solo")
    assert explain(bundle, prompt, methods=["macs"], max_new_tokens=8).meta["decode"]["path"] == SOLO


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_macs_and_rollout_on_the_static_path_equal_the_references(tokenizer, kind, monkeypatch):
    monkeypatch.setenv(DECODE_ENV, "static")
    bundle = bundle_from_objects(build_model(kind), tokenizer, name=kind)
    prompt = "Question: What is the capital of France? Context: Paris is the capital of France."
    attr = explain(bundle, prompt, methods=["macs", "rollout"], max_new_tokens=8)
    assert attr.meta["decode"]["path"] == STATIC
    n, k = attr.num_prompt_tokens, attr.num_steps
    attentions, _ = eager_attentions(bundle.model, torch.tensor([attr.prompt_token_ids + attr.generated_token_ids]))
    np.testing.assert_allclose(attr.methods["macs"].raw, np.array(reference_macs(attentions, n, k)[0]), rtol=1e-4)
    np.testing.assert_allclose(attr.methods["rollout"].raw, np.array(reference_rollout(attentions, n, k)), atol=1e-5)


def test_a_decode_step_reads_nothing_on_the_host():
    """The step a CUDA graph records: no `.item()`, `.tolist()`, numpy conversion or `nonzero`, with and without
    MACS and Rollout, at every step; the host reads the buffers only between chunks (1, 2, 4, ... steps)."""
    model = build_model("qwen2")
    ids = _ids(model)
    for methods in ([], [MACS(keep_layers=True)], [MACS(), Rollout()], [Rollout(head_fusion="max")]):
        for m in methods:
            m.begin(N)
        sinks = SinkTracker(N, model) if methods else None
        decoder = StaticDecoder(model, DecodeJob(ids, methods, K, eos_token_ids=[2]), sinks)
        decoder.prefill(ids)
        with decoder.capturing():
            for _ in range(K - 1):
                with CountHostReads() as mode:
                    decoder.step()
                assert mode.count == 0, methods
        assert int(decoder.k) == K


def test_host_reads_happen_only_between_chunks(monkeypatch):
    monkeypatch.setenv(DECODE_ENV, "static")
    model = build_model("llama")
    for methods, most in (([MACS()], 2), ([MACS(), Rollout()], 3)):  # a read for the tokens, one per method
        job = DecodeJob(_ids(model), methods, K)
        counts = reads_of_each_step(generate_steps(model, job, decode_choice(model, job)))
        assert len(counts) == K
        reads = [i for i, c in enumerate(counts) if c]
        assert reads == [0, 1, 2, 4, 8], counts  # the chunks' first steps
        prefill = counts[0] if len(methods) == 1 else 0  # Rollout's prefill reads where its full rows reach
        assert max(prefill, *(counts[i] for i in reads[1:])) <= most, counts


def test_a_stopped_consumer_leaves_nothing_registered(monkeypatch):
    monkeypatch.setenv(DECODE_ENV, "static")
    model = build_model("llama")
    job = DecodeJob(_ids(model), [MACS()], K)
    gen = generate_steps(model, job, decode_choice(model, job))
    for _ in range(3):
        next(gen)
    assert registered_names() == []  # capture is entered around each chunk's passes, never across a yield
    gen.close()
    assert registered_names() == []


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_static_path_on_the_device(device, kind, monkeypatch):
    """On CUDA `cuda-graph` replays a CUDA graph (`auto` chooses it too); on the CPU it runs the same step eagerly.
    Either way: the dynamic loop's tokens and rows on the same device."""
    model = build_model(kind).to(device)
    ids = _ids(model, device=device)
    static, layers, sinks = _run(model, ids, "cuda-graph", monkeypatch, {"keep_layers": True}, {})  # MACS + Rollout
    dynamic, dyn_layers, dyn_sinks = _run(model, ids, "solo", monkeypatch, {"keep_layers": True}, {})
    _assert_same_steps(static, dynamic, CUDA_GRAPH if device == "cuda" else STATIC)
    np.testing.assert_allclose(layers, dyn_layers, rtol=1e-5)
    assert sinks.record() == dyn_sinks.record()
    if device == "cuda":
        monkeypatch.setenv(DECODE_ENV, "auto")
        assert choose_path(model, DecodeJob(ids, [MACS(), Rollout()], K)).path == CUDA_GRAPH


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_calibrated_macs_takes_the_static_path_and_equals_its_solo_loop(device, kind, monkeypatch):
    """macs_calibrated's device step (MACS's with the layer weights, the tests' 0.5 / 1 / 1.5) on the static step
    (a CUDA graph on CUDA) against its solo step, beside MACS and Rollout: the same rows and weighted layer factors;
    `auto` chooses the graph for it on CUDA."""
    model = build_model(kind).to(device)
    ids = _ids(model, device=device)

    def run(path):
        monkeypatch.setenv(DECODE_ENV, path)
        methods = [MACSCalibrated(keep_layers=True), MACS(), Rollout()]
        methods[0].prepare(model)
        job = DecodeJob(ids, methods, K)
        steps = list(generate_steps(model, job, decode_choice(model, job), sinks=SinkTracker(ids.shape[1], model)))
        return steps, methods[0].layer_scores()

    (static, layers), (dynamic, dyn_layers) = run("cuda-graph"), run("solo")
    _assert_same_steps(static, dynamic, CUDA_GRAPH if device == "cuda" else STATIC)
    assert set(static[0].scores) == {"macs_calibrated", "macs", "rollout"}
    np.testing.assert_allclose(layers, dyn_layers, rtol=1e-5)
    assert not np.allclose(static[3].scores["macs_calibrated"], static[3].scores["macs"])  # the weights are used
    monkeypatch.setenv(DECODE_ENV, "auto")
    expected = CUDA_GRAPH if device == "cuda" else SOLO
    assert choose_path(model, DecodeJob(ids, [MACSCalibrated(), Rollout()], K)).path == expected


@pytest.mark.parametrize("device", ACCELERATORS)
def test_cuda_graph_steps_do_not_synchronise(device, monkeypatch):
    """What CUDA itself reports: inside a chunk the graph's replays never wait for the device; a chunk's first
    step reads the buffers (the tokens, one per method), whatever the prompt length. Step 1 also records the graph."""
    monkeypatch.setenv(DECODE_ENV, "auto")
    model = build_model("llama").to(device)
    for n, methods in ((23, ["macs"]), (61, ["macs"]), (23, ["macs", "rollout"])):
        counts = _syncs_per_step(model, n, methods, steps=K)
        assert [i for i in range(2, K) if counts[i]] == [2, 4, 8], (n, methods, counts)
        assert max(counts[2:]) <= 1 + len(methods), (n, methods, counts)


@pytest.mark.parametrize("kind", ["qwen2_5_vl", "qwen2_vl"])
@pytest.mark.parametrize("device", DEVICES)
def test_an_image_prompt_on_the_static_path_equals_the_solo_loop(device, kind, monkeypatch):
    """Qwen2.5-VL and Qwen2-VL: the prefill takes the pixels and the 3-D (mRoPE) positions as on the solo loop; the
    decode steps continue every axis from the prompt's last position, k taken on the device. Generated and given
    answers, MACS + Rollout, through `explain` (`meta.decode.path`: the static step run eagerly; `cuda-graph` on
    CUDA records the graph) and the decode loop; nothing is left in the model."""
    tokenizer = make_vl_tokenizer()
    model = build_vl_model(tokenizer, kind=kind).to(device)
    bundle = vl_bundle(model, tokenizer)
    graph = CUDA_GRAPH if device == "cuda" else STATIC
    image = Image.fromarray(np.random.default_rng(3).integers(0, 256, (70, 120, 3), dtype=np.uint8))
    question = "What is in the image?"
    results = {}
    for path in ("static", "solo"):
        monkeypatch.setenv(DECODE_ENV, path)
        results[path] = explain(bundle, question, image=image, methods=["macs", "rollout"], max_new_tokens=9)
        assert registered_names() == [] and model.model.rope_deltas is None
    static, solo = results["static"], results["solo"]
    assert static.meta["decode"]["path"] == STATIC and solo.meta["decode"]["path"] == SOLO
    assert static.generated_token_ids == solo.generated_token_ids and static.num_steps == 9
    for name in ("macs", "rollout"):
        np.testing.assert_allclose(static.methods[name].raw, solo.methods[name].raw, rtol=2e-5, atol=0, err_msg=name)
    enc = encode_image_prompt(bundle, image, question)
    forced = [int(t) for t in (torch.arange(7) * 13 + 5) % model.config.text_config.vocab_size]
    steps = {}
    for path in ("cuda-graph", "solo"):
        monkeypatch.setenv(DECODE_ENV, path)
        job = DecodeJob(enc.input_ids, [MACS(), Rollout()], 7, forced_ids=forced, extra_inputs=enc.prefill_inputs)
        steps[path] = list(generate_steps(model, job, decode_choice(model, job)))
    assert [s.token_id for s in steps["cuda-graph"]] == forced
    _assert_same_steps(steps["cuda-graph"], steps["solo"], graph)
    methods = [MACS(), Rollout()]
    for m in methods:
        m.begin(enc.input_ids.shape[1])
    decoder = StaticDecoder(model, DecodeJob(enc.input_ids, methods, 5, extra_inputs=enc.prefill_inputs))
    decoder.prefill(enc.input_ids)
    with decoder.capturing():
        for _ in range(4):
            with CountHostReads() as mode:
                decoder.step()  # the 3-D positions from k on the device: no host read
            assert mode.count == 0
