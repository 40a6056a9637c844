"""The app on ZeroGPU, emulated on a CPU (`zerogpu_emulation.py`, after `spaces` 0.51.3): the models are created at
import in the main thread and moved to "cuda" there, no model runs outside a `spaces.GPU` call (no speed probe
either), handlers called from other threads answer, and each call asks for a duration from the estimate.

Each case runs in a fresh process: the emulation patches torch for good, as the real package does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

GPU_SECONDS_BOUNDS = (20, 300)  # explainer.hardware.GPU_SECONDS_BOUNDS (written out: the test also runs on old code)

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import json, sys, threading
sys.path.insert(0, "tests/ui")
import zerogpu_emulation
record = zerogpu_emulation.install()            # what `import spaces` does on ZeroGPU, first thing in app.py

import app                                      # start-up: the models are created here, in the main thread
from ui import models
loaded = models.loaded_models()
moved_at_import = dict(record.moved)
outside = []
for bundle in getattr(models, "loaded_bundles", list)():  # loaded at start-up (none before the change)
    bundle.model.register_forward_pre_hook(lambda *a: outside.append(1) if record.active == 0 else None)

fns = {f.api_name: f for f in app.demo.fns.values()}
args = [getattr(c, "value", None) for c in fns["explain"].inputs]
args[0] = "Where is Paris?"
args[2] = 4                                     # max new tokens
results, errors = [], []

def visitor():                                  # Gradio calls handlers from its worker threads
    try:
        for name in ("estimate",):
            est = [getattr(c, "value", None) for c in fns[name].inputs]
            est[0] = "Where is Paris?"
            fns[name].fn(*est)
        out = fns["explain"].fn(*args)
        results.append(list(out) if not hasattr(out, "__anext__") else "async")
    except BaseException as e:
        errors.append(f"{type(e).__name__}: {e}")

t = threading.Thread(target=visitor, name="gradio-worker")
t.start(); t.join()
print(json.dumps({"loaded": loaded, "moved_at_import": moved_at_import, "moved": record.moved,
                  "durations": record.durations, "calls": record.calls, "outside": len(outside),
                  "cuda_inits": record.cuda_inits, "errors": errors, "updates": len(results[0]) if results else 0}))
"""


def run_emulated(model_dir: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EXPLAINER_", "HF_"))}
    env.update(SPACES_ZERO_GPU="true", EXPLAINER_MODEL=str(model_dir), EXPLAINER_VLM="none", HF_HUB_OFFLINE="1")
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_app_starts_and_answers_the_way_zerogpu_expects(tiny_model_dir):
    out = run_emulated(tiny_model_dir)
    assert out["errors"] == []
    assert out["loaded"] == 1 and out["moved_at_import"].get("MainThread", 0) > 0  # created and moved at import
    assert set(out["moved_at_import"]) == {"MainThread"}
    assert out["cuda_inits"] == 0 and out["outside"] == 0  # no CUDA, no forward (no speed probe) outside a GPU call
    assert out["calls"] == 1 and out["updates"] > 0  # the request answered inside its GPU call
    low, high = GPU_SECONDS_BOUNDS
    assert len(out["durations"]) == 1 and low <= out["durations"][0] <= high  # from the estimate, within bounds
    assert out["durations"][0] < 120  # a short MACS request asks for less than the old fixed 120 s
