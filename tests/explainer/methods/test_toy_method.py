"""Adding a method is one file plus one registry line: a toy method registered in `METHODS` and nowhere else reaches
the CLI, the app's choices, the time estimates and `eval`."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pytest

from explainer import bundle_from_objects
from explainer import estimate as est
from explainer.cli import build_parser, main
from explainer.methods import METHODS, AttributionMethod, GenerationRun, method_choices

from ...conftest import build_model, make_tokenizer


@dataclass
class ToyConfig:
    scale: float = 1.0  # every score is its position times this


class Toy(AttributionMethod):
    """Post-hoc, no cost model, no image support: the facts a new method gets by default."""

    name = "toy"
    streaming = False
    Config = ToyConfig

    def explain(self, run: GenerationRun) -> np.ndarray:
        n = run.num_prompt_tokens
        return np.tile(np.arange(n, dtype=np.float32) * self.config.scale, (run.num_steps, 1))  # (K, N)


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setitem(METHODS, Toy.name, Toy)  # the one registry line
    return Toy


def test_defaults_of_a_new_method(toy):
    assert toy.display_name == "toy" and not toy.explains_images and not toy.needs_prompt_embeddings


def test_the_app_offers_it(toy):
    assert method_choices()[-1] == "toy"
    assert "toy" not in method_choices(image=True)  # post-hoc without image support: not offered for image prompts
    assert {"macs", "rollout", "atman", "random"} <= set(method_choices(image=True))


def test_the_cli_lists_and_runs_it(toy, tiny_model_dir, tmp_path, capsys):
    help_text = build_parser()._subparsers._group_actions[0].choices["explain"].format_help()
    assert "toy" in help_text
    out = tmp_path / "r.json"
    args = ["explain", "--model", str(tiny_model_dir), "--prompt", "Paris is", "--max-new-tokens", "3"]
    assert main([*args, "--methods", "macs,toy:scale=2", "--json", str(out)]) == 0
    saved = json.loads(out.read_text())["methods"]["toy"]
    assert saved["meta"] == {"scale": 2.0} and saved["raw"][0][:3] == [0.0, 2.0, 4.0]


def test_the_estimate_line_survives_a_method_without_a_cost_model(toy):
    bundle = bundle_from_objects(build_model("llama"), make_tokenizer(), name="tiny-toy")
    est._speeds[bundle.model] = est.Speed(forward_tokens_per_s=100.0, backward_tokens_per_s=40.0)
    try:
        out = {e.method: e for e in est.estimate(bundle, "Where is Paris?", max_new_tokens=4)}
    finally:
        est.forget_speed(bundle)
    assert out["toy"].seconds is None and out["toy"].describe() == "no estimate" and not out["toy"].cost.free
    assert out["atman"].seconds > 0 and out["macs"].describe() == "none"


def test_a_cost_model_on_the_class_is_used(toy, monkeypatch):
    def cost(cls, request, config):
        return est.Cost(forward_passes=1, forward_tokens=request.t * int(config.scale))

    monkeypatch.setattr(Toy, "cost", classmethod(cost))
    assert est.method_cost("toy", [1, 2, 3], 2, {"scale": 3}).forward_tokens == 15


def test_eval_runs_it(toy, tiny_model_dir, tmp_path):
    data = tmp_path / "squad.json"
    row = {"id": "q1", "title": "t", "question": "What is the capital of France?",
           "context": "Paris is the capital of France.", "answers": [{"text": "Paris", "answer_start": 0}]}  # fmt: skip
    data.write_text(json.dumps([row]))
    out = tmp_path / "eval.json"
    args = ["eval", "--data", str(data), "--model", str(tiny_model_dir), "--methods", "toy,macs",
            "--max-new-tokens", "3", "--skip-faithfulness", "--json", str(out)]  # fmt: skip
    assert main(args) == 0
    summary = json.loads(out.read_text())
    assert set(summary["methods"]) == {"toy", "macs"} and "mAUC_PR" in summary["methods"]["toy"]
