"""The app on ZeroGPU, emulated on a CPU (`zerogpu_emulation.py`, after `spaces` 0.51.3): the models are created at
import in the main thread and moved to "cuda" there, nothing touches CUDA and no model runs outside a `spaces.GPU`
call (no speed probe either), a visitor's page visit, estimate, text question, faithfulness measurement and image
question answer from Gradio's worker threads, each GPU call asks for a duration from its estimate, and a model that
failed to load at start-up is reported, not loaded again from a worker thread.

Each case runs in a fresh process: the emulation patches torch for good, as the real package does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from ..vl_tiny import build_vl_model, make_vl_tokenizer

GPU_SECONDS_BOUNDS = (20, 300)  # runtime.hardware.GPU_SECONDS_BOUNDS (written out: the test also runs on old code)

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import inspect, json, os, shutil, sys, threading
sys.path.insert(0, "tests/ui")
import zerogpu_emulation
record = zerogpu_emulation.install()            # what `import spaces` does on ZeroGPU, first thing in app.py

import app                                      # start-up: the models are created here, in the main thread
from ui import models
out = {"loaded": models.loaded_models(), "moved_at_import": dict(record.moved), "errors": {}, "lines": {}}
outside = []
for bundle in getattr(models, "loaded_bundles", list)():
    bundle.model.register_forward_pre_hook(lambda *a: outside.append(1) if record.active == 0 else None)
if os.environ.get("LATE_MODEL"):                # the model's folder appears once the app has started
    shutil.copytree(os.environ["LATE_MODEL"], os.environ["EXPLAINER_MODEL"])
fns = {f.api_name: f for f in app.demo.fns.values()}
app.demo.upload_file_set.add(os.path.realpath(os.environ["IMAGE"]))  # as Gradio's /upload route records it

def args(name, **given):                        # an event's inputs at their defaults, some given by position
    values = [getattr(c, "value", None) for c in fns[name].inputs]
    for key, value in given.items():
        values[int(key[1:])] = value
    return values

def run(name, *values):  # a gated event's first parameter: Gradio's request (ui/guards/admission)
    gated = "request" in inspect.signature(fns[name].fn).parameters
    result = fns[name].fn(*((None,) if gated else ()), *values)
    return list(result) if hasattr(result, "__next__") else result

def visitor():                                  # Gradio calls handlers from its worker threads
    steps = [("model_info", lambda: run("model_info")), ("vlm_info", lambda: run("vlm_info")),
             ("estimate", lambda: run("estimate", *args("estimate", a0="Where is Paris?")))]
    updates = {}
    def explain():
        updates["explain"] = run("page_explain", *args("page_explain", a0="Where is Paris?", a2=4))
        return len(updates["explain"])
    def faithfulness():
        result = updates["explain"][-1][fns["page_faithfulness"].inputs[0]]
        return len(run("page_faithfulness", *args("page_faithfulness", a0=result, a1=["macs"], a3="every 5th step")))
    def image():
        image_args = args("page_explain_image", a0=os.environ["IMAGE"], a1="What is in the image?", a2=["macs"], a3=3,
                          a6=16)
        return len(run("page_explain_image", *image_args))
    steps += [("explain", explain), ("faithfulness", faithfulness), ("image", image)]
    for name, step in steps:
        try:
            out["lines"][name] = step()
        except BaseException as e:
            out["errors"][name] = f"{type(e).__name__}: {e}"

t = threading.Thread(target=visitor, name="gradio-worker")
t.start(); t.join()
out.update(moved=record.moved, durations=record.durations, calls=record.calls, outside=len(outside),
           cuda_inits=record.cuda_inits, cuda_init_threads=getattr(record, "cuda_init_threads", []),
           start_up=getattr(app, "start_up_line", lambda: "")())
print(json.dumps(out, default=str))
"""


@pytest.fixture(scope="module")
def tiny_vlm_dir(tmp_path_factory):
    """The tiny random Qwen2.5-VL and its tokenizer saved as a local model folder."""
    path = tmp_path_factory.mktemp("tiny-qwen2.5-vl")
    tokenizer = make_vl_tokenizer()
    build_vl_model(tokenizer).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def image_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("image") / "square.png"
    pixels = np.zeros((56, 84, 3), dtype=np.uint8)
    pixels[..., 2], pixels[14:42, 28:56] = 200, (220, 30, 30)  # a red square on blue
    Image.fromarray(pixels).save(path)
    return path


def run_emulated(text: Path | str, vision: Path | str, image: Path, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EXPLAINER_", "HF_"))}
    env.update(SPACES_ZERO_GPU="true", EXPLAINER_MODEL=str(text), EXPLAINER_VLM=str(vision), HF_HUB_OFFLINE="1")
    env.update(IMAGE=str(image), **extra)
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def assert_zerogpu_rules(out: dict, gpu_calls: int) -> None:
    """Created and moved at import in the main thread only; no CUDA and no forward outside a GPU call; one duration
    per GPU call, from the estimate, within the bounds."""
    assert out["moved_at_import"].get("MainThread", 0) > 0 and set(out["moved_at_import"]) == {"MainThread"}
    assert set(out["moved"]) == {"MainThread"}  # no request moved anything
    assert out["cuda_inits"] == 0 and out["outside"] == 0, out["cuda_init_threads"]
    assert out["calls"] == len(out["durations"]) == gpu_calls
    low, high = GPU_SECONDS_BOUNDS
    assert all(low <= d <= high for d in out["durations"])


def test_a_text_model_and_a_vision_model_answer_every_tab(tiny_model_dir, tiny_vlm_dir, image_path):
    out = run_emulated(tiny_model_dir, tiny_vlm_dir, image_path)
    assert out["errors"] == {}
    assert out["loaded"] == 2
    assert_zerogpu_rules(out, gpu_calls=3)  # explain, faithfulness, image question
    assert out["durations"][0] < 120  # a short MACS request asks for less than the old fixed 120 s
    assert "· bfloat16 on ZeroGPU · prompts up to" in out["lines"]["model_info"]  # "auto" on a GPU
    assert "· bfloat16 on ZeroGPU · the image is resized" in out["lines"]["vlm_info"]
    assert "an assumed GPU speed" in out["lines"]["estimate"]  # no probe outside a GPU call
    assert all(out["lines"][name] > 0 for name in ("explain", "faithfulness", "image"))
    assert out["start_up"].startswith("MACS Explorer on ZeroGPU:")
    assert f"text model {tiny_model_dir} (" in out["start_up"] and "loaded)" in out["start_up"]


def test_one_vision_model_serves_both_tabs(tiny_vlm_dir, image_path):
    out = run_emulated(tiny_vlm_dir, tiny_vlm_dir, image_path)
    assert out["errors"] == {}
    assert out["loaded"] == 1  # one id, one bundle
    assert_zerogpu_rules(out, gpu_calls=3)
    assert all(out["lines"][name] > 0 for name in ("explain", "faithfulness", "image"))
    assert "one model for both tabs" in out["start_up"]


def test_a_model_that_failed_at_start_up_is_reported_not_loaded_from_a_worker(tiny_model_dir, image_path, tmp_path):
    """The text model's folder is missing at start-up and appears later: requests say it failed at start-up and why,
    instead of loading it from Gradio's worker thread (where moving it to "cuda" initialises CUDA)."""
    late = tmp_path / "late-model"
    out = run_emulated(late, "none", image_path, LATE_MODEL=str(tiny_model_dir))
    assert out["loaded"] == 0 and out["cuda_inits"] == 0, out["cuda_init_threads"]
    assert out["moved"] == {}  # nothing was created, at start-up or later
    why = f"failed to load when the Space started: Model folder '{late}' does not exist."
    assert why in out["errors"]["explain"]
    assert "failed to load at start-up" in out["lines"]["model_info"]
    assert f"text model {late} (failed to load: Model folder" in out["start_up"]
    assert out["calls"] == 2 and set(out["errors"]) == {"explain", "faithfulness", "image"}  # no image model here


CUDA_OUTSIDE = r"""
import json, sys, threading
sys.path.insert(0, "tests/ui")
import zerogpu_emulation
record = zerogpu_emulation.install()
import torch
from explainer.errors import ModelLoadError
from explainer.models.loading import load_model
out = {}
def worker():
    try:
        torch.zeros(2).to("cuda")
    except RuntimeError as e:
        out["tensor"] = str(e)
    try:
        load_model(sys.argv[1], device="cuda")
    except ModelLoadError as e:
        out["model"] = str(e)
t = threading.Thread(target=worker, name="gradio-worker")
t.start(); t.join()
out["inits"], out["threads"] = record.cuda_inits, record.cuda_init_threads
out["main"] = str(torch.zeros(2).to("cuda").device)  # the importing thread: intercepted, stays on the CPU
print(json.dumps(out))
"""


def test_cuda_outside_the_importing_thread_and_outside_a_gpu_call_is_refused(tiny_model_dir):
    env = {k: v for k, v in os.environ.items() if not k.startswith("EXPLAINER_")} | {"SPACES_ZERO_GPU": "true"}
    done = subprocess.run([sys.executable, "-c", CUDA_OUTSIDE, str(tiny_model_dir)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert "CUDA must not be initialized in the main process" in out["tensor"]
    assert out["model"].startswith(f"Could not move model '{tiny_model_dir}' to cuda: CUDA must not be initialized")
    assert out["inits"] == 2 and out["threads"] == ["gradio-worker"] * 2 and out["main"] == "cpu"
