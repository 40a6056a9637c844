"""CPU guards against GPU crashes: no `.numpy()` outside `explainer/host.py`, and no tensor created by the library
without `device=`, checked by running every registered method, the faithfulness measures, evaluation, the benchmark
runners and the time estimate with such tensors sent to the `meta` device (`device_guard.factory_guard`).

The guards are shown to fail on planted defects, so a passing run means something.
"""

from __future__ import annotations

import importlib.util
import threading

import numpy as np
import pytest
import torch
from PIL import Image

from explainer.bench.worker import BASELINE, make_runner
from explainer.estimate import calibrate, estimate
from explainer.eval.evaluate import EvalConfig, evaluate_sample
from explainer.eval.lds_eval import LdsConfig, evaluate_lds_sample
from explainer.explain import explain
from explainer.faithfulness import RemovalConfig, removal_curves, soft_curves
from explainer.faithfulness.soft import SoftConfig
from explainer.methods import METHODS
from explainer.models.loading import bundle_from_objects

from ..conftest import QA_ROW, build_model
from ..device_guard import FACTORIES, factory_guard, in_library, library_numpy_calls, numpy_calls
from ..vl_tiny import build_vl_model, make_vl_tokenizer, vl_bundle

PROMPT = "Paris is the capital of France, and Berlin is the capital of Germany. What is the capital of France?"


# --- the static scan ------------------------------------------------------------------------------------------------


def test_library_converts_to_numpy_only_through_host():
    assert library_numpy_calls() == []


def test_scan_catches_planted_numpy_calls_and_factory_imports(tmp_path):
    planted = "import torch\n\ndef f(t):\n    x = t.sum()\n    return t.detach().cpu().numpy(), x.numpy(force=True)\n"
    assert numpy_calls(planted, "m.py") == ["m.py:5", "m.py:5"]
    assert numpy_calls("from torch import nn, zeros\n", "m.py") == ["m.py:1"]  # escapes the runtime guard
    assert numpy_calls("import numpy as np\nfrom torch import nn\nnp.asarray(1)\n") == []
    root = tmp_path / "explainer"
    (root / "methods").mkdir(parents=True)
    (root / "runtime").mkdir()
    (root / "runtime" / "host.py").write_text("def to_numpy(t):\n    return t.cpu().numpy()\n")  # the one allowed place
    (root / "methods" / "m.py").write_text(planted)
    assert library_numpy_calls(root) == ["explainer/methods/m.py:5", "explainer/methods/m.py:5"]


# --- the runtime guard ------------------------------------------------------------------------------------------------


@pytest.fixture
def planted(tmp_path):
    """A module standing in for library code, with one factory call without `device=` and one `.numpy()`."""
    path = tmp_path / "planted.py"
    path.write_text(
        "import torch\n\n"
        "def without_device(x):\n    return x + torch.zeros(3)\n\n"
        "def with_device(x):\n    return x + torch.zeros(3, device=x.device) + torch.as_tensor(x)\n\n"
        "def make():\n    return torch.arange(3)\n\n"
        "def to_host(x):\n    return x.numpy()\n"
    )
    spec = importlib.util.spec_from_file_location("planted_library_module", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, lambda filename: filename == str(path)


def test_guard_catches_a_planted_factory_call_without_device(planted):
    module, inside = planted
    x = torch.ones(3)
    with factory_guard(inside) as hits:
        with pytest.raises((RuntimeError, NotImplementedError)):
            module.without_device(x).tolist()  # a meta tensor beside a real one: no values to read
        assert len(hits) == 1 and "torch.zeros at" in hits[0] and hits[0].endswith(":4")
        assert torch.equal(module.with_device(x), 2 * x)  # given a device (or inheriting one): untouched
        assert len(hits) == 1
    assert torch.equal(module.without_device(x), x)  # the guard is gone after the block
    assert torch.zeros is not None and torch.zeros(1).device.type == "cpu"


def test_guard_acts_in_other_threads(planted):
    """The library runs methods in a worker thread: the guard must see those calls too (unlike set_default_device)."""
    module, inside = planted
    made = {}

    def work():
        made["library"], made["elsewhere"] = module.make(), torch.arange(3)

    with factory_guard(inside) as hits:
        thread = threading.Thread(target=work)
        thread.start()
        thread.join()
    assert made["library"].device.type == "meta" and len(hits) == 1 and "torch.arange" in hits[0]
    assert made["elsewhere"].tolist() == [0, 1, 2]  # calls from outside the library (this file) are left alone


def test_guard_catches_a_planted_numpy_call(planted):
    module, inside = planted
    with factory_guard(inside) as hits:
        with pytest.raises(RuntimeError, match="to_numpy"):
            module.to_host(torch.ones(2))
        assert torch.ones(2).numpy().tolist() == [1.0, 1.0]  # outside the library: allowed
    assert hits == [hits[0]] and "Tensor.numpy" in hits[0]
    assert module.to_host(torch.ones(2)).tolist() == [1.0, 1.0]


def test_guard_knows_the_library_and_covers_every_factory():
    import explainer.methods.macs

    assert in_library(explainer.methods.macs.__file__) and not in_library(torch.__file__)
    assert all(callable(getattr(torch, name)) for name in FACTORIES)


# --- everything the library runs, under the guard ---------------------------------------------------------------


@pytest.fixture(scope="module")
def bundle(tokenizer):
    return bundle_from_objects(build_model("qwen2_sliding"), tokenizer, name="tiny-qwen2-sliding")


def _assert_same(guarded, plain):
    assert guarded.generated_token_ids == plain.generated_token_ids
    assert set(guarded.methods) == set(plain.methods)
    for name, scores in plain.methods.items():
        assert np.isfinite(scores.raw).all()
        np.testing.assert_array_equal(guarded.methods[name].raw, scores.raw)


@pytest.mark.parametrize("method", list(METHODS))
def test_every_method_runs_under_the_guard(bundle, method):
    plain = explain(bundle, PROMPT, methods=[method], max_new_tokens=4)
    with factory_guard() as hits:
        guarded = explain(bundle, PROMPT, methods=[method], max_new_tokens=4)
    assert hits == []
    _assert_same(guarded, plain)


def test_image_prompts_run_under_the_guard():
    tokenizer = make_vl_tokenizer()
    vl = vl_bundle(build_vl_model(tokenizer), tokenizer)
    rng = np.random.default_rng(0)
    image = Image.fromarray(rng.integers(0, 255, (84, 112, 3)).astype(np.uint8))
    methods = [m for m, cls in METHODS.items() if cls.explains_images]
    assert {"macs", "rollout", "atman", "attnlrp", "grad_ellm", "input_x_gradient"} <= set(methods)
    plain = explain(vl, "What is in the image?", image=image, methods=methods, max_new_tokens=3)
    with factory_guard() as hits:
        guarded = explain(vl, "What is in the image?", image=image, methods=methods, max_new_tokens=3)
    assert hits == []
    _assert_same(guarded, plain)


def test_faithfulness_runs_under_the_guard(bundle):
    attr = explain(bundle, PROMPT, methods=["macs", "atman"], max_new_tokens=6)
    runs = {
        "removal": lambda: removal_curves(bundle, attr, config=RemovalConfig(batch_size=3)).auc,
        "soft": lambda: soft_curves(bundle, attr, config=SoftConfig(samples=2, pis=(0.3, 0.7), step_stride=2)).ns,
        "soft fixed": lambda: (
            soft_curves(bundle, attr, config=SoftConfig(samples=2, pis=(0.3, 0.7), step_stride=2, routing="fixed")).nc
        ),
    }
    for name, run in runs.items():
        plain = run()
        with factory_guard() as hits:
            guarded = run()
        assert hits == [], name
        assert guarded == plain, name


def test_evaluation_benchmark_and_estimate_run_under_the_guard(bundle):
    cfg = EvalConfig(methods=("macs", "rollout", "atman"), max_new_tokens=3)
    ids = bundle.encode("Paris is the capital").input_ids
    tokens = bundle.readable(ids[0].tolist())  # Sources cuts them into sentences
    attr = explain(bundle, PROMPT, methods=["macs", "atman"], max_new_tokens=3)
    plain = evaluate_sample(bundle, QA_ROW, cfg)
    with factory_guard() as hits:
        guarded = evaluate_sample(bundle, QA_ROW, cfg)
        for method in (BASELINE, *(m if m != "sources" else "sources:unit=word" for m in METHODS)):  # one sentence
            assert make_runner(bundle.model, method, tokens)(ids, 2) == 2
        estimates = estimate(bundle, PROMPT, max_new_tokens=3, wait=None)
        calibrate(bundle, attr)
    assert hits == []
    drop = ("seconds",)
    strip = lambda s: {k: v for k, v in s.items() if k not in drop and k != "methods"}  # noqa: E731
    assert strip(guarded) == strip(plain)
    for m, values in plain["methods"].items():
        assert {k: v for k, v in guarded["methods"][m].items() if k != "seconds"} == {
            k: v for k, v in values.items() if k != "seconds"
        }
    assert {e.method for e in estimates} == set(METHODS)


@pytest.mark.parametrize("kind", ["llama", "qwen2_sliding"])
def test_lds_runs_under_the_guard(kind, tokenizer):
    """The removal runs (batched for full attention, solo under a sliding window) and one LDS row."""
    lds_bundle = bundle_from_objects(build_model(kind), tokenizer, name=f"tiny-{kind}")
    row = {**QA_ROW, "context": "Paris is the capital of France. Berlin is the capital of Germany."}
    cfg = LdsConfig(methods=("macs", "random"), max_new_tokens=3, masks=4, top_k=(1,))
    plain = evaluate_lds_sample(lds_bundle, row, cfg)
    with factory_guard() as hits:
        guarded = evaluate_lds_sample(lds_bundle, row, cfg)
    assert hits == []
    assert guarded["methods"] == plain["methods"] and guarded["n_runs"] == plain["n_runs"] > 1


def test_calibration_rows_run_under_the_guard(tokenizer):
    """macs_calibrated's training rows: a SQuAD row (removals) and an image question (the batched knockout)."""
    from explainer.eval.calibrate import CalibrateConfig, collect_image_row, collect_row

    vl_tokenizer = make_vl_tokenizer()
    vl = vl_bundle(build_vl_model(vl_tokenizer), vl_tokenizer)
    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (84, 112, 3)).astype(np.uint8))
    text = bundle_from_objects(build_model("llama"), tokenizer, name="tiny-llama")
    row = {**QA_ROW, "context": "Paris is the capital of France. Berlin is the capital of Germany."}
    cfg = CalibrateConfig(max_new_tokens=3, masks=4, image_cells=2)
    runs = {
        "image": lambda: collect_image_row(vl, {"id": "img", "image": image, "question": "What is in it?"}, cfg),
        "text": lambda: collect_row(text, row, cfg),
    }
    for name, run in runs.items():
        plain = run()
        with factory_guard() as hits:
            guarded = run()
        assert hits == [], name
        for key in ("features", "source", "masks", "actual"):
            np.testing.assert_array_equal(guarded[key], plain[key], err_msg=f"{name} {key}")
