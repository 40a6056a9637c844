"""The probe that names where two runs of one request part, bit for bit (`explainer/bench/fingerprints.py`, issue #51):
its fingerprint sees any one element's bits, its hooks go with the block, and its parting names the first module and
decode step that differ, against a run made different on purpose."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from explainer.bench.crowd import crowd_request
from explainer.bench.fingerprints import fingerprint, fingerprints, lone_runs, parting
from explainer.models.loading import bundle_from_objects
from tests.conftest import build_model


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64, torch.int64, torch.bool])
def test_a_fingerprint_sees_one_element_changed_in_its_last_bit(dtype):
    t = (torch.arange(2 * 3 * 5).reshape(2, 3, 5) % 7).to(dtype)
    assert torch.equal(fingerprint(t), fingerprint(t.clone()))
    for index in [(0, 0, 0), (1, 2, 4), (1, 0, 3)]:
        other = t.clone()
        if dtype == torch.bool:
            other[index] = ~other[index]
        elif dtype.is_floating_point:  # the next representable number: one ulp
            other[index] = torch.nextafter(other[index].float(), torch.tensor(100.0)).to(dtype)
            other[index] = other[index] if other[index] != t[index] else t[index] + 1
        else:
            other[index] += 1
        assert not torch.equal(fingerprint(t), fingerprint(other)), (dtype, index)
    swapped = t.clone()  # the same elements in another order: the weighted sum tells them apart
    swapped[0, 0, 0], swapped[0, 0, 1] = t[0, 0, 1], t[0, 0, 0]
    if t[0, 0, 0] != t[0, 0, 1]:
        assert not torch.equal(fingerprint(t), fingerprint(swapped))


def test_parting_names_the_first_module_and_the_decode_step():
    one, two = torch.tensor([[1, 2]]), torch.tensor([[1, 3]])
    run = [("layers.0", one), ("", one), ("layers.0", one), ("layers.1", one), ("", one)]  # a hook runs at the end
    assert parting(run, list(run)) is None
    later = [*run[:3], ("layers.1", two), run[4]]
    assert parting(run, later) == {"call": 3, "module": "layers.1", "step": 1, "calls": [5, 5]}
    assert parting(run, run[:2]) == {"call": 2, "module": None, "step": 1, "calls": [5, 2]}
    renamed = [("layers.9", one), *run[1:]]
    assert parting(run, renamed) == {"call": 0, "module": "layers.0 / layers.9", "step": 0, "calls": [5, 5]}


def test_the_hooks_find_a_changed_weight_and_leave_with_the_block():
    model = build_model("llama", num_hidden_layers=2)
    ids = torch.tensor([[5, 9, 17, 3, 40]])
    with torch.no_grad():
        with fingerprints(model) as first:
            model(ids)
        with fingerprints(model) as again:
            model(ids)
        weight = model.model.layers[1].mlp.down_proj.weight
        weight[0] += 1e-3  # the first output of layer 1's down projection, and all after it
        with fingerprints(model) as nudged:
            model(ids)
    assert first and parting(first, again) is None
    found = parting(first, nudged)
    assert found["module"] == "model.layers.1.mlp.down_proj" and found["step"] == 0
    assert all(not m._forward_hooks for m in model.modules())


def test_lone_runs_of_one_request_agree_on_a_cpu(tokenizer):
    bundle = bundle_from_objects(build_model("llama"), tokenizer, name="tiny-llama")
    request = crowd_request(bundle, 24, 4, 1)
    found = lone_runs(bundle, request, 3)
    assert found["runs"] == 3 and found["partings"] == [None, None]
    assert found["steps"] == 4  # the prefill's and three decode steps: four tokens
    per_step = sum(1 for m in bundle.model.modules() if not isinstance(m, torch.nn.ModuleList))  # each one called
    assert found["calls"] == found["steps"] * per_step


def test_the_crowd_command_writes_the_fingerprints_report(tmp_path):
    out = tmp_path / "fp.json"
    done = subprocess.run(
        [sys.executable, "-m", "explainer", "crowd", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--tiny",
         "--device", "cpu", "--distinct", "--fingerprints", "--rounds", "2", "--new-tokens", "3",
         "--prompt-tokens", "20", "--json", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    assert report["partings"] == [None] and report["runs"] == 2 and report["calls"] > 0
    assert "run 2: bit for bit the first" in done.stdout
