"""Time estimates: the cost model against forward and backward passes counted during real method runs on tiny models,
the speed probe (cached, leaves the model as it was, gives up on a busy model), calibration from a finished result,
and the arithmetic and wording of the estimates."""

from __future__ import annotations

import collections
import contextlib
import threading

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from explainer import bundle_from_objects, explain
from explainer import estimate as est
from explainer.errors import InputError, UnknownMethodError
from explainer.methods import METHODS, GenerationRun, get_method, method_config
from explainer.result.attribution import Attribution, load_result, result_json
from explainer.runtime.session import hold

from ..conftest import build_model, make_tokenizer


@contextlib.contextmanager
def counted(model):
    """Count, while the block runs, every forward call of `model` (positions = batch x length of its input) and every
    backward pass through each decoder layer (positions of the gradient reaching the layer's output)."""
    forwards: list[int] = []
    backwards: dict[int, list[int]] = collections.defaultdict(list)

    def on_forward(module, args, kwargs):
        x = kwargs.get("input_ids")
        if x is None:
            x = kwargs.get("inputs_embeds")
        if x is None:
            x = args[0]
        forwards.append(x.shape[0] * x.shape[1])

    def watch(i):
        def on_layer(module, args, output):
            hidden = output[0] if isinstance(output, tuple) else output  # (B, T, d)
            if hidden.requires_grad:
                hidden.register_hook(lambda grad: backwards[i].append(grad.shape[0] * grad.shape[1]))

        return on_layer

    handles = [model.register_forward_pre_hook(on_forward, with_kwargs=True)]
    handles += [layer.register_forward_hook(watch(i)) for i, layer in enumerate(model.model.layers)]
    try:
        yield forwards, backwards
    finally:
        for h in handles:
            h.remove()


def _run(model, method, ids, k, **options):
    """Run a method on a teacher-forced sequence of N = len(ids) prompt tokens and K answer tokens, counting."""
    answer = [(7 * i + 3) % 250 + 10 for i in range(k)]
    run = GenerationRun(model=model, input_ids=torch.tensor([ids + answer]), num_prompt_tokens=len(ids))
    with counted(model) as (forwards, backwards):
        get_method(method, **options).explain(run)
    return forwards, backwards


def _prompt(n: int, distinct: int, seed: int = 0) -> list[int]:
    """N ids drawn from `distinct` values, so later tokens repeat earlier ones (AtMan runs each distinct row once)."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, distinct, (n,), generator=g) + 5).tolist()


def _embeddings(model, ids):
    with torch.no_grad():
        return model.get_input_embeddings()(torch.tensor(ids))  # (N, d)


ATMAN_CASES = {
    "default": {},
    "no correlation": {"correlated": False},
    "many correlated": {"cosine_threshold": 0.05},  # distinct tokens suppress each other: earlier first positions
    "small batches": {"batch_size": 2},
    "nothing suppressed": {"suppression_factor": 1.0},
    "naive loop": {"fast": False},
}


@pytest.mark.parametrize("case", list(ATMAN_CASES))
def test_atman_cost_equals_the_passes_it_makes(llama, case):
    options = ATMAN_CASES[case]
    ids, k = _prompt(18 if options.get("fast") is False else 40, 12), 5
    forwards, _ = _run(llama, "atman", ids, k, **options)
    cost = est.method_cost("atman", ids, k, options, embeddings=_embeddings(llama, ids))
    assert (cost.forward_passes, cost.forward_tokens) == (len(forwards), sum(forwards))
    assert cost.backward_passes == 0


@pytest.mark.parametrize("kind", ["qwen2", "qwen2_sliding"])
def test_atman_cost_on_other_architectures(kind):
    model = build_model(kind)
    ids, k = _prompt(30, 20, seed=1), 4
    forwards, _ = _run(model, "atman", ids, k)
    cost = est.method_cost("atman", ids, k, embeddings=_embeddings(model, ids))
    assert (cost.forward_passes, cost.forward_tokens) == (len(forwards), sum(forwards))


def test_atman_cost_on_a_long_prompt_splits_passes_by_the_token_budget(llama):
    ids, k = _prompt(260, 200, seed=2), 3  # suffixes of ~260 positions: only a few rows fit ~1,024 positions a pass
    forwards, _ = _run(llama, "atman", ids, k)
    cost = est.method_cost("atman", ids, k, embeddings=_embeddings(llama, ids))
    assert (cost.forward_passes, cost.forward_tokens) == (len(forwards), sum(forwards))
    assert max(forwards[1:]) <= 1024 + 260 and len(forwards) > 1 + len(set(ids)) / 8


def test_atman_cost_from_token_ids_alone(llama):
    ids, k = _prompt(40, 12), 5
    unit = torch.nn.functional.normalize(llama.get_input_embeddings().weight[sorted(set(ids))], dim=-1)
    cos = unit @ unit.T - torch.eye(len(unit))
    assert cos.max() < 0.6  # random embeddings: no two distinct tokens are correlated at the default threshold
    forwards, _ = _run(llama, "atman", ids, k)
    assert est.method_cost("atman", ids, k).forward_tokens == sum(forwards)
    # with similar distinct tokens the ids alone cannot see the earlier first positions: a lower bound
    many = {"cosine_threshold": 0.05}
    exact = est.method_cost("atman", ids, k, many, embeddings=_embeddings(llama, ids)).forward_tokens
    assert est.method_cost("atman", ids, k, many).forward_tokens < exact


@pytest.mark.parametrize(
    "method, options, layers",
    [
        ("input_x_gradient", {}, 3),
        ("attnlrp", {}, 3),
        ("grad_ellm", {"layers": 1}, 1),
        ("grad_ellm", {"layers": 2}, 2),
        ("grad_ellm", {}, 3),  # the default 8 is more than the tiny model's depth: every layer
    ],
)
def test_gradient_method_costs_equal_the_passes_they_make(llama, method, options, layers):
    ids, k = _prompt(15, 15), 4
    forwards, backwards = _run(llama, method, ids, k, **options)
    cost = est.method_cost(method, ids, k, options, num_layers=3)
    assert (cost.forward_passes, cost.forward_tokens) == (len(forwards), sum(forwards)) == (1, len(ids) + k - 1)
    last = backwards[2]  # every backward pass starts at the top layer
    assert (cost.backward_passes, cost.backward_tokens) == (len(last), sum(last)) == (k, k * (len(ids) + k - 1))
    reached = sorted(i for i, calls in backwards.items() if len(calls) == k)
    assert reached == sorted(backwards) == list(range(3 - layers, 3))
    assert (cost.backward_layers or 3) == layers


@pytest.mark.parametrize("method", list(METHODS))
def test_every_registered_method_has_a_cost_model(method):
    cost = est.method_cost(method, [5, 6, 7, 8], 3, num_layers=3)
    model_free = METHODS[method].streaming or method == "random"
    assert cost.known and cost.free == model_free


def test_streaming_and_random_methods_make_no_extra_passes(llama, tokenizer):
    bundle = bundle_from_objects(llama, tokenizer, name="tiny")
    with counted(llama) as (forwards, _):
        attr = explain(bundle, "Paris is the capital", methods=["macs", "rollout", "random"], max_new_tokens=4)
    assert len(forwards) == attr.num_steps  # one per generated token, nothing after
    assert all(est.method_cost(m, attr.prompt_token_ids, attr.num_steps).free for m in attr.methods)


def test_bad_methods_and_options_are_clear_errors():
    with pytest.raises(UnknownMethodError, match="Available methods"):
        est.method_cost("nope", [1, 2], 2)
    with pytest.raises(InputError, match="batch_size"):
        est.method_cost("atman", [1, 2], 2, {"batch_size": -1})


@pytest.fixture
def bundle():
    """A tiny bundle with a fresh model (its cached speed is its own)."""
    b = bundle_from_objects(build_model("llama"), make_tokenizer(), name="tiny-estimate")
    yield b
    est.forget_speed(b)


def _model_state(model):
    return (
        [p.requires_grad for p in model.parameters()],
        model.config._attn_implementation,
        sum(len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks) for m in model.modules()),
        torch.is_grad_enabled(),
    )


def test_speed_is_probed_once_per_model_and_leaves_it_as_it_was(bundle):
    before = _model_state(bundle.model)
    with counted(bundle.model) as (forwards, _):
        first = est.speed(bundle)
    assert first.forward_tokens_per_s > 0 and first.backward_tokens_per_s > 0
    p = est.PROBE_TOKENS  # warm-up, a timed batch of ~1,024 positions, the forward for the backward passes
    assert forwards == [p, p * (1024 // p), p]
    assert _model_state(bundle.model) == before
    with counted(bundle.model) as (forwards, _):
        assert est.speed(bundle) is first
        est.estimate(bundle, "Where is Paris?", max_new_tokens=8)
    assert forwards == []  # cached, and an estimate itself runs no forward pass
    est.forget_speed(bundle)
    assert est.speed(bundle) is not first


def test_speed_of_a_busy_model_is_not_waited_for(bundle):
    taken, release = threading.Event(), threading.Event()

    def busy():
        with hold(bundle.model):
            taken.set()
            release.wait(10)

    worker = threading.Thread(target=busy)
    worker.start()
    try:
        taken.wait(10)
        assert est.speed(bundle, wait=0.1) is None
        estimates = {e.method: e for e in est.estimate(bundle, "Where is Paris?", wait=0.1)}
        assert estimates["atman"].seconds is None and estimates["atman"].describe() == "not measured yet"
        assert estimates["macs"].describe() == "none"
    finally:
        release.set()
        worker.join()
    assert est.speed(bundle, wait=0.1) is not None  # free again: probed now


def _chat_ids(tokenizer, prompt):
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
    )
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_estimate_is_cost_over_measured_speed(bundle):
    est._speeds[bundle.model] = est.Speed(forward_tokens_per_s=100.0, backward_tokens_per_s=40.0)
    prompt, k = "Paris is the capital of France.", 6
    t = len(_chat_ids(bundle.tokenizer, prompt)) + k
    out = {
        e.method: e for e in est.estimate(bundle, prompt, max_new_tokens=k, method_options={"grad_ellm": {"layers": 1}})
    }
    assert set(out) == set(METHODS)
    assert out["input_x_gradient"].seconds == pytest.approx((t - 1) / 100 + k * (t - 1) / 40)
    assert out["grad_ellm"].seconds == pytest.approx((t - 1) / 100 + k * (t - 1) / 3 / 40)  # 1 of 3 layers
    atman = est.method_cost("atman", _chat_ids(bundle.tokenizer, prompt), k, embeddings=None)
    assert out["atman"].seconds >= atman.forward_tokens / 100  # with embeddings: >= the ids-only lower bound
    assert out["macs"].seconds == 0 and out["macs"].describe() == "none"
    assert not any(e.corrected for e in out.values())
    plain = {e.method: e for e in est.estimate(bundle, prompt, max_new_tokens=k, chat_template=False)}
    assert plain["attnlrp"].cost.forward_tokens == len(bundle.tokenizer(prompt)["input_ids"]) + k - 1


def test_a_given_answer_sets_k_to_its_tokens(bundle):
    """With a given answer the work is that answer's K tokens, not the slider's max-new-tokens."""
    est._speeds[bundle.model] = est.Speed(forward_tokens_per_s=100.0, backward_tokens_per_s=40.0)
    prompt, answer = "Paris is the capital of France.", "It is Paris, in France."
    k = len(bundle.tokenizer(answer, add_special_tokens=False)["input_ids"])
    given = {e.method: e for e in est.estimate(bundle, prompt, max_new_tokens=200, answer=answer)}
    alike = {e.method: e for e in est.estimate(bundle, prompt, max_new_tokens=k)}
    assert given["input_x_gradient"].seconds == pytest.approx(alike["input_x_gradient"].seconds)
    assert given["input_x_gradient"].cost == alike["input_x_gradient"].cost
    blank = {e.method: e for e in est.estimate(bundle, prompt, max_new_tokens=k, answer="  ")}
    assert blank["input_x_gradient"].cost == alike["input_x_gradient"].cost  # blank: generation up to K


def test_estimate_refuses_bad_input(bundle):
    with pytest.raises(InputError, match="empty"):
        est.estimate(bundle, "   ")
    with pytest.raises(InputError, match="layers"):
        est.estimate(bundle, "hi", method_options={"grad_ellm": {"layers": 0}})


def test_a_finished_run_corrects_the_estimate_of_its_method(bundle):
    est._speeds[bundle.model] = est.Speed(forward_tokens_per_s=1e4, backward_tokens_per_s=1e4)
    attr = explain(
        bundle, "Where is Paris?", methods=["macs", "atman", "grad_ellm"], max_new_tokens=5,
        method_options={"grad_ellm": {"layers": 2}},
    )  # fmt: skip
    assert sorted(est.calibrate(bundle, attr)) == ["atman", "grad_ellm"]
    speed = est.speed(bundle)
    for method in ("atman", "grad_ellm"):
        options = {"layers": 2} if method == "grad_ellm" else {}
        cost = est.method_cost(
            method, attr.prompt_token_ids, attr.num_steps, options, num_layers=3,
            embeddings=_embeddings(bundle.model, attr.prompt_token_ids),
        )  # fmt: skip
        assert speed.seconds(cost, 3, method) == pytest.approx(attr.methods[method].seconds, rel=1e-6)
    if attr.num_steps == 5:  # the next estimate of the same request is the measured time
        again = {e.method: e for e in est.estimate(bundle, "Where is Paris?", ["atman"], max_new_tokens=5)}
        assert again["atman"].corrected
        assert again["atman"].seconds == pytest.approx(attr.methods["atman"].seconds, rel=1e-6)


def test_calibration_ignores_what_it_cannot_count(bundle):
    est._speeds[bundle.model] = est.Speed(forward_tokens_per_s=1e4, backward_tokens_per_s=1e4)
    attr = explain(bundle, "Where is Paris?", methods=["input_x_gradient"], max_new_tokens=3)
    other = Attribution(**{**attr.__dict__, "model": "another-model"})
    image = Attribution(**{**attr.__dict__, "image": {"token_positions": [0], "grid": [1, 1], "size": [4, 4]}})
    running = Attribution(**{**attr.__dict__, "meta": {**attr.meta, "status": "running input_x_gradient"}})
    opened = load_result(result_json(attr).encode())  # timings measured where the file was made
    assert opened.opened and not attr.opened and opened.methods["input_x_gradient"].seconds > 0
    for result in (None, other, image, running, opened):
        assert est.calibrate(bundle, result) == []
    est.forget_speed(bundle)
    assert est.calibrate(bundle, attr) == []  # no speed known yet: nothing to correct


def test_corrections_are_bounded(bundle):
    est._speeds[bundle.model] = est.Speed(forward_tokens_per_s=1e-3, backward_tokens_per_s=1e-3)  # absurdly slow
    attr = explain(bundle, "Where is Paris?", methods=["input_x_gradient"], max_new_tokens=3)
    est.calibrate(bundle, attr)
    assert est.speed(bundle).corrections["input_x_gradient"] == est.CORRECTION_BOUNDS[0]


@pytest.mark.parametrize(
    "seconds, text",
    [
        (0.2, "under a second"),
        (4.4, "about 4 s"),
        (38, "about 40 s"),
        (61, "about 1 min"),
        (200, "about 3.5 min"),
        (1500, "about 25 min"),
        (7200, "about 2 h"),
        (float("nan"), "unknown"),
    ],
)
def test_durations_are_rounded_without_false_precision(seconds, text):
    assert est.format_seconds(seconds) == text


def test_atman_options_reach_the_cost():
    ids = _prompt(30, 30)
    naive = est.method_cost("atman", ids, 4, {"fast": "false"})  # spec strings are converted as explain converts them
    assert naive.forward_passes == 31 and naive.forward_tokens == 31 * 34
    assert method_config("atman", fast="false").fast is False


@given(prompt=st.text(max_size=60), k=st.integers(1, 256), chat=st.booleans())
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_prompt_gets_an_estimate_or_an_input_error(llama, tokenizer, prompt, k, chat):
    bundle = bundle_from_objects(llama, tokenizer, name="tiny-fuzz")
    est._speeds[bundle.model] = est.Speed(forward_tokens_per_s=1e3, backward_tokens_per_s=5e2)
    try:
        out = est.estimate(bundle, prompt, max_new_tokens=k, chat_template=chat)
    except InputError:
        return
    finally:
        est.forget_speed(bundle)
    assert all(e.seconds is not None and e.seconds >= 0 and e.describe() for e in out)
    assert all(e.cost.free or e.cost.forward_passes >= 1 for e in out)


def test_seconds_at_a_measured_speed():
    assert est.seconds_at(1000, 250.0) == pytest.approx(4.0)
    assert est.seconds_at(1000, None) is None and est.seconds_at(1000, 0.0) is None  # no speed measured yet
