"""`decoding.choose_path`, the one place that decides which decode path a request takes: a table of device, model,
methods, images, device map and override against the path and the reason; and `decode_record` reading the results of
every version."""

from __future__ import annotations

import pytest
import torch

from explainer.decoding import (
    BATCHED,
    CUDA_GRAPH,
    DECODE_ENV,
    DYNAMIC,
    FIXED_SHAPE,
    GRAPH,
    SOLO,
    STATIC,
    DecodeChoice,
    DecodeJob,
    choose_path,
    decode_record,
    enable_batching,
    generate_steps,
    graphs,
)
from explainer.decoding.batched import batched_steps
from explainer.errors import InputError
from explainer.explain import decode_choice
from explainer.methods import get_method
from explainer.request import ExplainRequest

from ...conftest import FailingMACS, build_model

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def _model(kind: str = "llama", spread: bool = False, vision: bool = False) -> torch.nn.Module:
    model = build_model(kind)
    if spread:
        model.hf_device_map = {"model.embed_tokens": 0, "model.layers.0": 1}  # what accelerate leaves on a split model
    if vision:
        model.config.vision_config = {"depth": 1}  # only its presence is read
    return model


# (device, model, methods, image prompt, $EXPLAINER_DECODE, batching on, caller can batch) -> (path, reason's words)
TABLE = [
    (CPU, {}, ["macs"], False, None, False, True, SOLO, "CPU"),
    (CPU, {}, ["macs", "atman"], False, "static", False, True, STATIC, "EXPLAINER_DECODE=static"),
    (CPU, {}, [], False, "static-eager", False, True, STATIC, "eagerly"),
    (CPU, {}, ["rollout"], False, "static", False, True, STATIC, "EXPLAINER_DECODE=static"),
    (CPU, {}, ["rollout"], False, "cuda-graph", False, True, STATIC, "cuda-graph: the static step"),
    (CPU, {}, ["macs"], False, "batched:fixed-shape", False, True, BATCHED, "fixed-shape step runs eagerly"),
    (CPU, {}, ["macs"], False, "auto:fixed-shape", True, True, BATCHED, "fixed-shape step runs eagerly"),
    (CUDA, {}, ["macs"], False, "batched:dynamic", False, True, BATCHED, "row by row"),
    (CPU, {}, ["macs", "rollout"], False, "static-eager", False, True, STATIC, "eagerly"),
    (CPU, {}, ["macs", "rollout"], False, None, False, True, SOLO, "CPU"),
    (CPU, {}, ["macs"], False, None, True, True, BATCHED, "batching is on: the batch's step runs eagerly, row by"),
    (CPU, {}, ["macs"], False, "batched", False, True, BATCHED, "EXPLAINER_DECODE=batched"),
    (CPU, {}, ["macs"], False, "batched", False, False, SOLO, "cannot follow a batched row"),
    (CPU, {}, ["macs"], False, None, True, False, SOLO, "CPU"),  # an evaluation holding the model runs solo
    (CPU, {}, ["macs"], True, None, True, True, SOLO, "CPU"),  # an image prompt does not join the batch
    (CPU, {}, ["macs"], True, "batched", True, True, SOLO, "image prompt: the batched decode takes text prompts"),
    (CPU, {"vision": True}, ["macs", "rollout"], True, "static-eager", False, True, STATIC, "eagerly"),
    (CPU, {"vision": True}, ["macs"], False, "static", False, True, SOLO, "vision-language model with a text prompt"),
    (CPU, {}, ["macs"], False, "solo", True, True, SOLO, "EXPLAINER_DECODE=solo"),
    (CPU, {"kind": "qwen2_sliding"}, ["macs"], False, "batched", True, True, SOLO, "sliding-window"),
    (CUDA, {}, ["macs"], False, None, False, True, CUDA_GRAPH, "CUDA"),
    (CUDA, {}, [], False, None, False, True, CUDA_GRAPH, "CUDA"),
    (CUDA, {}, ["macs"], False, "cuda-graph", False, True, CUDA_GRAPH, "EXPLAINER_DECODE=cuda-graph"),
    (CUDA, {}, ["macs"], False, "static", False, True, STATIC, "eagerly"),
    (CUDA, {}, ["macs"], False, "static-eager", False, True, STATIC, "eagerly"),
    (CUDA, {}, ["macs"], False, "solo", False, True, SOLO, "EXPLAINER_DECODE=solo"),
    (CUDA, {}, ["macs"], False, None, True, True, BATCHED, "batching is on: the batch's step as one CUDA graph"),
    (CUDA, {}, ["macs", "rollout"], False, None, False, True, CUDA_GRAPH, "CUDA"),
    (CUDA, {}, ["macs", "rollout"], False, None, True, True, BATCHED, "batching is on"),
    (CUDA, {}, ["failing-macs"], False, None, False, True, SOLO, "has no device step"),  # a subclass with its own step
    (CUDA, {}, ["macs"], True, "cuda-graph", False, True, CUDA_GRAPH, "EXPLAINER_DECODE=cuda-graph"),
    (CUDA, {"vision": True}, ["macs", "rollout"], True, None, True, True, CUDA_GRAPH, "CUDA"),  # the app's images
    (CUDA, {"kind": "qwen2_sliding"}, ["macs"], False, None, False, True, SOLO, "sliding-window"),
    (CUDA, {"spread": True}, ["macs"], False, None, True, True, SOLO, "device map"),
    (CUDA, {"vision": True}, ["macs"], False, None, True, True, SOLO, "vision-language model with a text prompt"),
]


@pytest.mark.parametrize("device,model,methods,images,forced,batching,can_batch,path,reason", TABLE)
def test_choose_path(device, model, methods, images, forced, batching, can_batch, path, reason, monkeypatch):
    if forced is not None:
        monkeypatch.setenv(DECODE_ENV, forced)
    enable_batching(batching)  # undone by conftest's `_library_defaults`
    instances = [FailingMACS() if m == "failing-macs" else get_method(m) for m in methods]
    extra = {"pixel_values": torch.zeros(1)} if images else None
    job = DecodeJob(torch.arange(3, 9)[None], instances, 4, extra_inputs=extra)
    got = choose_path(_model(**model), job, device=device, can_batch=can_batch)
    assert got.path == path and reason in got.reason, got


def test_a_request_is_read_as_its_job_is(monkeypatch):
    """An `ExplainRequest` (names, no ids yet) gets the choice of its `DecodeJob`; the device is the model's."""
    model = _model()
    request = ExplainRequest.build("What is the capital of France?", ["rollout", "macs"], 4)
    job = DecodeJob(torch.arange(3, 9)[None], request.instances(), 4)
    assert choose_path(model, request) == choose_path(model, job)
    monkeypatch.setenv(DECODE_ENV, "static")
    assert choose_path(model, ExplainRequest.build("Hi?", ["macs", "atman"], 4)).path == STATIC


def test_a_failed_graph_capture_is_remembered(monkeypatch):
    model = _model()
    monkeypatch.setattr(graphs, "_failures", type(graphs._failures)())
    graphs._failures[model] = "RuntimeError: not capturable"
    got = choose_path(model, DecodeJob(torch.arange(3, 9)[None], [get_method("macs")], 4), device=CUDA)
    assert got.path == STATIC and "not capturable" in got.reason


def test_an_unknown_override_lists_the_valid_ones(monkeypatch):
    monkeypatch.setenv(DECODE_ENV, "dynamic")
    for value in ("dynamic", "solo:graph", "batched:rows"):
        monkeypatch.setenv(DECODE_ENV, value)
        with pytest.raises(InputError, match="auto, solo, static, cuda-graph, batched"):
            choose_path(_model(), DecodeJob(torch.arange(3, 9)[None], [], 4))


@pytest.mark.parametrize("value", ["auto", "solo", "static", "cuda-graph", "batched"])
def test_the_override_values_are_the_path_names(value, monkeypatch):
    """Each value of `EXPLAINER_DECODE` but auto forces the path of its name where it can run (CUDA here)."""
    monkeypatch.setenv(DECODE_ENV, value)
    got = choose_path(_model(), DecodeJob(torch.arange(3, 9)[None], [get_method("macs")], 4), device=CUDA)
    assert got.path == (CUDA_GRAPH if value == "auto" else value)
    assert got.form == {SOLO: DYNAMIC, STATIC: FIXED_SHAPE, CUDA_GRAPH: GRAPH, BATCHED: GRAPH}[got.path]


def test_decode_record_reads_every_version():
    new = {"path": STATIC, "reason": "r", "batch_size": 1, "prefill_rows": 1}
    assert decode_record({"decode": new}) == new
    old_batched = {"decode": "batched", "decode_path": "dynamic", "batch_size": 3, "prefill_rows": 2}
    assert decode_record(old_batched) == {"path": BATCHED, "reason": "", "batch_size": 3, "prefill_rows": 2}
    old_static = {"decode": "solo", "decode_path": "cuda-graph", "batch_size": 1, "prefill_rows": 1}
    assert decode_record(old_static)["path"] == CUDA_GRAPH
    assert decode_record({})["path"] == SOLO  # before either key


def test_every_step_carries_the_path_that_computed_it(monkeypatch):
    """Solo steps say `solo`, the static step's `static`, a batched row's `batched` (no longer "dynamic")."""
    model = _model()
    ids = torch.arange(3, 12)[None]

    def paths(steps) -> set[str]:
        return {s.decode_path for s in steps}

    def steps(choice=None):
        job = DecodeJob(ids, [get_method("macs")], 3)
        return generate_steps(model, job, choice or decode_choice(model, job))

    assert paths(steps()) == {SOLO}
    assert paths(batched_steps(model, DecodeJob(ids, [get_method("macs")], 3))) == {BATCHED}
    monkeypatch.setenv(DECODE_ENV, "static")
    assert paths(steps()) == {STATIC}
    batched = DecodeChoice(BATCHED, "the request's", DYNAMIC)  # the dispatcher hands it to the batch
    assert paths(steps(batched)) == {BATCHED}
