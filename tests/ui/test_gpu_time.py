"""The GPU seconds each ZeroGPU call asks for (`ui.gpu_time`): the answer tokens a request explains (a given answer's
own count), the image tab's answer limit, and the faithfulness panel's pi-Soft choice. Each expected figure is
written out from the formula's parts: `gpu_duration(decoding + the methods' extra time)`."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from explainer.estimate import estimate
from explainer.faithfulness import QUICK_SOFT, soft_cost
from explainer.models.loading import bundle_from_objects
from explainer.result.attribution import Attribution, MethodScores
from explainer.runtime.hardware import gpu_duration
from ui import gpu_time, models
from ui.guards import inputs
from ui.panels.measurement import SOFT_CHOICES

from .. import upload_files
from ..conftest import build_model, make_tokenizer

PROMPT = "Where is Paris?"
ANSWER = " ".join(["Paris is the capital of France, and Berlin is the capital of Germany."] * 8)


@pytest.fixture(scope="module")
def bundle():
    return bundle_from_objects(build_model("llama"), make_tokenizer(), name="tiny-llama")


@pytest.fixture
def tiny(bundle, monkeypatch):
    """Both tabs served by the tiny Llama (no request runs it: the durations only tokenise)."""
    monkeypatch.setattr(models, "model_ids", lambda: ("tiny", "tiny"))
    monkeypatch.setattr(models, "load_model", lambda name=None, **kw: bundle)
    models.forget_models()
    yield bundle
    models.forget_models()


def answer_tokens(bundle) -> int:
    return len(bundle.tokenizer(ANSWER, add_special_tokens=False)["input_ids"])


def test_text_duration_counts_a_given_answers_tokens_not_max_new_tokens(tiny):
    k = answer_tokens(tiny)
    assert k > 100  # long enough for the decoding time to show past the 20 s minimum
    plain = gpu_time.text_seconds(PROMPT, ["macs"], 4, True)
    assert plain == gpu_duration(4 / gpu_time.DECODE_TOKENS_PER_S)
    given = gpu_time.text_seconds(PROMPT, ["macs"], 4, True, False, ANSWER)
    assert given == gpu_duration(k / gpu_time.DECODE_TOKENS_PER_S) > plain
    assert gpu_time.text_seconds(PROMPT, ["macs"], 4, True, False, "   ") == plain  # blank: generate as usual


def test_text_duration_of_a_post_hoc_method_is_estimated_over_the_given_answer(tiny):
    k = answer_tokens(tiny)
    atman = estimate(tiny, PROMPT, ["atman"], max_new_tokens=k, probe=False)[0].seconds  # K written out
    assert atman is not None and atman > 0
    asked = gpu_time.text_seconds(PROMPT, ["atman"], 4, True, False, ANSWER)
    assert asked == gpu_duration(k / gpu_time.DECODE_TOKENS_PER_S + atman)


@pytest.fixture
def picture(tmp_path):
    """An upload of the image tab (its duration opens it, as the handler does)."""
    path = upload_files.uploaded(tmp_path / "blue.png")
    Image.new("RGB", (45, 31), (40, 90, 200)).save(path)
    return str(path)


def test_image_duration_keeps_the_image_tabs_limit_of_128_tokens(tiny, picture):
    assert inputs.IMAGE_NEW_TOKENS == (1, 128)
    prefill, per_token = gpu_time.IMAGE_PREFILL_SECONDS, 1 / gpu_time.DECODE_TOKENS_PER_S
    assert gpu_time.image_seconds(picture, "What?", ["macs"], 128) == gpu_duration(prefill + 128 * per_token)
    for refused in (129, 256):  # the handler refuses these at once: no estimate from them
        assert gpu_time.image_seconds(picture, "What?", ["macs"], refused) == gpu_duration(None)
    assert gpu_time.image_seconds(None, "What?", ["macs"], 128) == gpu_duration(None)  # no image: refused too


def test_image_duration_counts_a_given_answers_tokens_and_atman(tiny, picture):
    k, prefill = answer_tokens(tiny), gpu_time.IMAGE_PREFILL_SECONDS
    given = gpu_time.image_seconds(picture, "What?", ["macs"], 4, 0.5, True, 256, ANSWER)
    assert given == gpu_duration(prefill + k / gpu_time.DECODE_TOKENS_PER_S)
    with_atman = gpu_time.image_seconds(picture, "What?", ["macs", "atman"], 4, 0.5, True, 256, ANSWER)
    assert with_atman == gpu_duration(prefill + k / gpu_time.DECODE_TOKENS_PER_S + gpu_time.IMAGE_POST_HOC_SECONDS)
    assert gpu_time.image_seconds(picture, "What?", ["macs"], 4, 0.5, True, 256, None) == gpu_duration(prefill + 0.4)


def result(steps: int = 20, prompt: int = 3000, methods=("macs", "rollout")) -> Attribution:
    raw = np.random.default_rng(0).random((steps, prompt)).astype(np.float32)  # (K, N)
    return Attribution(
        model="fake",
        prompt_token_ids=list(range(prompt)),
        prompt_tokens=[f"t{i}" for i in range(prompt)],
        generated_token_ids=list(range(steps)),
        generated_tokens=[f"a{i}" for i in range(steps)],
        methods={m: MethodScores.from_raw(raw) for m in methods},
        user_positions=list(range(prompt)),
    )


def test_faithfulness_duration_follows_the_pi_soft_choice():
    attr, chosen = result(), ["macs", "rollout"]
    removal = gpu_time.REMOVAL_SECONDS_PER_STEP * 20 * 3  # 20 answer tokens x (2 methods + the random baseline)
    speed = gpu_time.ASSUMED_SPEED.forward_tokens_per_s

    def asked(choice, step=None):
        return gpu_time.faithfulness_seconds(attr, chosen, "logit", choice, step)

    def soft(steps):
        return soft_cost(attr, chosen, QUICK_SOFT, steps)["tokens"] / speed

    skip, slider, every_5th = asked(SOFT_CHOICES[2]), asked(SOFT_CHOICES[0], 7), asked(SOFT_CHOICES[1])
    assert skip == gpu_duration(removal)  # pi-Soft off: the removal curves alone
    assert slider == gpu_duration(removal + soft([6])) and soft([6]) > 5  # one step: the slider's (1-based)
    assert every_5th == gpu_duration(removal + soft([0, 5, 10, 15])) and every_5th == gpu_duration(removal + soft(None))
    assert skip < slider < every_5th
    assert asked(SOFT_CHOICES[0], None) == gpu_duration(removal + soft([19]))  # no step given: the newest


def test_faithfulness_duration_without_a_result_or_methods_is_the_minimum():
    assert gpu_time.faithfulness_seconds(None, ["macs"], "logit", SOFT_CHOICES[1]) == gpu_duration(0)
    assert gpu_time.faithfulness_seconds(result(), ["atman"], "logit", SOFT_CHOICES[1]) == gpu_duration(0)
