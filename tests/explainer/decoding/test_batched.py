"""Batched decode (decoding/batched/): every row gives, bit for bit, what the same request gives decoding alone in
the batcher, and that equals a solo `generate_steps` run to rounding.

Rows are started while the test holds the model, so they join the batch in the same round; a row that joins later
or leaves early is steered the same way. Against the request alone in the batcher (`_alone`) everything is compared
exactly: token ids, MACS and Rollout raw rows, step probabilities, entropies, alternatives and sinks (the batch's
matrix products run at a fixed row count, `products.py`, and attention runs row by row). Against the solo
loop the tolerances are: tokens identical; raw rows, probabilities and entropies to rtol 2e-5 / atol 1e-7 (float32):
the solo loop's products see 1 row, the batcher's a fixed count, which moves the tiny models' rows by at most ~3e-6
relative; cutting a row's columns wrongly, or mixing rows, moves them by orders of magnitude more.
"""

from __future__ import annotations

import contextlib
import threading
import time

import numpy as np
import pytest
import torch

from explainer import bundle_from_objects, explain, stream_explain
from explainer.capture import registered_names
from explainer.decoding import DECODE_ENV, DecodeJob, choice, enable_batching, generate_steps
from explainer.decoding.batched import batched_steps, counts, engine
from explainer.errors import Cancelled, InputError
from explainer.explain import decode_choice
from explainer.methods import MACS, get_method
from explainer.result.sinks import SinkTracker
from explainer.runtime import memory
from explainer.runtime.session import CancelToken, hold, model_lock

from ...conftest import ACCELERATORS, build_model, eager_attentions
from ...reference import reference_macs, reference_rollout

RTOL, ATOL = 2e-5, 1e-7
METHODS = ("macs", "rollout")


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def model(request):
    return build_model(request.param)


@pytest.fixture(autouse=True, params=["rows-apart", "fixed-shape"])
def step_form(request, monkeypatch):
    """Every test runs in both forms of the batch's step (`fixed.BatchStep`): row by row (a CPU's) and the fixed
    shape that a CUDA graph records, run eagerly."""
    if request.param == "fixed-shape":
        monkeypatch.setenv(DECODE_ENV, "auto:fixed-shape")
    engine._batchers.clear()  # the next request makes a batcher in this form
    yield request.param
    engine._batchers.clear()


def _ids(n: int, seed: int) -> torch.Tensor:
    return torch.randint(3, 300, (1, n), generator=torch.Generator().manual_seed(seed))  # (1, n)


def _request(n: int, seed: int, k: int = 10, forced=None, eos=(), stop_after=None, methods=None) -> dict:
    """A request; `methods` makes its batched run's method instances (default: fresh MACS and Rollout)."""
    made = methods or (lambda: [get_method(m) for m in METHODS])
    return {"ids": _ids(n, seed), "k": k, "forced": forced, "eos": eos, "stop_after": stop_after, "methods": made}


def _collect(steps, sinks, stop_after=None) -> dict:
    out = {"steps": []}
    for step in steps:
        out["steps"].append(step)
        if stop_after is not None and len(out["steps"]) == stop_after:
            steps.close()  # the visitor leaves: the row is dropped before the next step
            break
    out["sinks"] = sinks.record()
    return out


def _solo(model, req) -> dict:
    sinks = SinkTracker(req["ids"].shape[1], model)
    methods = [get_method(m) for m in METHODS]
    job = DecodeJob(req["ids"], methods, req["k"], req["forced"], req["eos"])
    return _collect(generate_steps(model, job, decode_choice(model, job), None, sinks), sinks)


def _batched(model, req, out: dict, key) -> None:
    try:
        sinks = SinkTracker(req["ids"].shape[1], model)
        methods = req["methods"]()
        record: dict = {}
        job = DecodeJob(req["ids"], methods, req["k"], req["forced"], req["eos"])
        steps = batched_steps(model, job, None, sinks, record)
        out[key] = {**_collect(steps, sinks, req["stop_after"]), **record}
    except BaseException as e:  # pragma: no cover - reported by the test
        out[key] = e


def _start(model, reqs: dict, out: dict) -> list[threading.Thread]:
    threads = [threading.Thread(target=_batched, args=(model, r, out, key)) for key, r in reqs.items()]
    for t in threads:
        t.start()
    return threads


def _together(model, reqs: dict) -> dict:
    """Run the requests as rows that all join in the same round (the test holds the model while they queue)."""
    out: dict = {}
    with _paused(model):
        threads = _start(model, reqs, out)
        _wait(lambda: counts(model)[1] == len(reqs))
    for t in threads:
        t.join(120)
    return out


@contextlib.contextmanager
def _paused(model):
    """Hold the model from another thread while the block runs: the batcher waits between two rounds, and requests
    started in the block queue (the block's own thread does not hold the model, so stream_explain does not run
    inline)."""
    taken, release = threading.Event(), threading.Event()

    def holder() -> None:
        with hold(model):
            taken.set()
            release.wait(60)

    thread = threading.Thread(target=holder)
    thread.start()
    taken.wait(60)
    try:
        yield
    finally:
        release.set()
        thread.join(60)


def _wait(condition, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.002)


def _assert_same(got: dict, ref: dict, steps: int | None = None) -> None:
    assert not isinstance(got, BaseException), got
    a, b = got["steps"], ref["steps"] if steps is None else ref["steps"][:steps]
    assert [s.token_id for s in a] == [s.token_id for s in b]
    for x, y in zip(a, b):
        assert x.index == y.index
        for m in METHODS:
            np.testing.assert_allclose(x.scores[m], y.scores[m], rtol=RTOL, atol=ATOL, err_msg=f"{m} step {x.index}")
        np.testing.assert_allclose([x.probability, x.entropy], [y.probability, y.entropy], rtol=RTOL, atol=1e-6)
        assert [i for i, _ in x.alternatives] == [i for i, _ in y.alternatives]
        np.testing.assert_allclose([p for _, p in x.alternatives], [p for _, p in y.alternatives], rtol=RTOL, atol=ATOL)
    if steps is None:
        assert got["sinks"]["positions"] == ref["sinks"]["positions"]
        assert got["sinks"]["steps"] == ref["sinks"]["steps"]


def _assert_exact(got: dict, ref: dict, steps: int | None = None) -> None:
    """Bit for bit: the request's steps (and sinks) as the batcher gives them to the request alone."""
    assert not isinstance(got, BaseException), got
    a, b = got["steps"], ref["steps"] if steps is None else ref["steps"][:steps]
    assert [s.token_id for s in a] == [s.token_id for s in b]
    for x, y in zip(a, b):
        for m in METHODS:
            np.testing.assert_array_equal(x.scores[m], y.scores[m], err_msg=f"{m} step {x.index}")
        got_stats, ref_stats = (x.index, x.probability, x.entropy), (y.index, y.probability, y.entropy)
        assert got_stats == ref_stats and x.alternatives == y.alternatives
    if steps is None:
        assert got["sinks"] == ref["sinks"]


def _alone(model, req) -> dict:
    """The request decoding alone in the batcher (fresh MACS and Rollout): the reference every row must equal."""
    return _together(model, {"alone": {**req, "methods": lambda: [get_method(m) for m in METHODS]}})["alone"]


def _clean(model) -> None:
    _wait(lambda: counts(model) == (0, 0) and not model_lock(model).locked())  # the batcher's last round is over
    assert registered_names() == []


def test_rows_of_different_lengths_answers_and_stops_equal_solo_runs(model):
    eos_stop = _solo(model, _request(9, 3, k=12))["steps"][4].token_id  # this row's 5th token ends it early
    forced = _solo(model, _request(23, 4, k=7))["steps"]  # a given answer: another prompt's tokens
    reqs = {
        "short": _request(4, 1, k=12),
        "long": _request(31, 2, k=6),  # fewer steps: leaves first
        "eos": _request(9, 3, k=12, eos=(eos_stop,)),
        "given": _request(14, 5, k=12, forced=[s.token_id for s in forced]),
    }
    reqs["short again"] = reqs["short"]  # rows of one length (float32 SDPA over both at once would move their bits)
    refs = {key: _alone(model, r) for key, r in reqs.items()}
    for key, r in reqs.items():
        _assert_same(refs[key], _solo(model, r))
    assert len(refs["eos"]["steps"]) <= 5 and len(refs["given"]["steps"]) == 7
    out = _together(model, reqs)
    for key in reqs:
        _assert_exact(out[key], refs[key])
        assert out[key]["batch_size"] == 5
    _clean(model)


def test_rows_with_the_same_prompt_share_one_prefill_pass_and_equal_lone_runs(model):
    forced = _solo(model, _request(17, 22, k=6))["steps"]
    reqs = {
        "a": _request(11, 21, k=8),
        "a, fewer steps": _request(11, 21, k=4),
        "a, given answer": _request(11, 21, k=6, forced=[s.token_id for s in forced]),
        "b, same length": _request(11, 23, k=8),  # another prompt: its own prefill
    }
    refs = {key: _alone(model, r) for key, r in reqs.items()}
    prefills = []
    handle = model.register_forward_pre_hook(
        lambda _m, _a, kw: prefills.append(kw["input_ids"].shape[1]) if kw["input_ids"].shape[1] > 1 else None,
        with_kwargs=True,
    )
    try:
        out = _together(model, reqs)
    finally:
        handle.remove()
    assert prefills == [11, 11]  # one pass for the three rows of prompt a, one for b
    for key in reqs:
        _assert_exact(out[key], refs[key])
        assert out[key]["prefill_rows"] == (1 if key.startswith("b") else 3)
        assert refs[key]["prefill_rows"] == 1
    assert len(out["a, fewer steps"]["steps"]) == 4 and len(out["a, given answer"]["steps"]) == 6
    _clean(model)


def test_rows_whose_prefill_runs_count_as_decoding(model):
    """The app's waiting note reads `counts`: a row being prefilled is no longer waiting, and it decodes next."""
    seen = []

    class CountingMACS(MACS):
        def begin(self, n):  # runs inside the row's prefill, in the batcher's round
            seen.append(counts(model))
            super().begin(n)

    made = lambda: [CountingMACS(), get_method("rollout")]  # noqa: E731
    out = _together(model, {"a": _request(9, 31, k=3, methods=made), "b": _request(12, 32, k=3, methods=made)})
    assert all(not isinstance(o, BaseException) for o in out.values())
    assert sorted(seen) == [(1, 1), (2, 0)]  # the first admitted row while the second waits, then both
    _clean(model)


class GatedMACS(MACS):
    """MACS that stops the batcher's thread at one step until the test opens the gate (methods run in that thread, so
    the test knows where every row is)."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.at, self.reached, self.gate = at, threading.Event(), threading.Event()

    def step(self, rows):
        if self.steps_done == self.at:
            self.reached.set()
            assert self.gate.wait(120)
        return super().step(rows)


def test_a_row_that_joins_mid_way_and_one_that_leaves_leave_the_others_unchanged(model):
    gated = GatedMACS(at=5)
    reqs = {
        "first": _request(12, 7, k=20, methods=lambda: [gated, get_method("rollout")]),
        "leaves": _request(6, 8, k=20, stop_after=3),
    }
    late = {"late": _request(20, 9, k=8)}
    refs = {key: _alone(model, r) for key, r in {**reqs, **late}.items()}
    # A MACS with its own `step` keeps a row's methods off the device (`Row.on_device`): so is its reference's.
    eager = {**reqs["first"], "methods": lambda: [GatedMACS(at=-1), get_method("rollout")]}
    refs["first"] = _together(model, {"alone": eager})["alone"]
    out: dict = {}
    with _paused(model):
        threads = _start(model, reqs, out)
        _wait(lambda: counts(model)[1] == 2)
    assert gated.reached.wait(120)  # the batcher is inside the round of "first"'s step 5
    threads[1].join(120)  # "leaves" has read its 3 steps and left
    threads += _start(model, late, out)
    _wait(lambda: counts(model)[1] == 1)  # "late" queues; it joins at the next round
    gated.gate.set()
    for t in threads:
        t.join(120)
    for key in refs:
        _assert_exact(out[key], refs[key], steps=3 if key == "leaves" else None)
        assert out[key]["batch_size"] == 2
    assert len(out["leaves"]["steps"]) == 3
    _clean(model)


def test_a_row_decoding_alone_matches_the_solo_loop(model):
    req = _request(15, 11, k=9)
    got = _alone(model, req)
    assert got["batch_size"] == 1
    _assert_same(got, _solo(model, req))  # the products differ (a fixed row count against 1 row): rounding only
    _assert_exact(_alone(model, req), got)  # and a second lone run is the first one again
    _clean(model)


def test_finish_waits_until_the_batchers_thread_has_ended(model):
    """`engine.finish` returns once the batcher's thread is gone, so that a process can exit without a daemon thread
    inside PyTorch (on an H200 every crowd script aborted at exit); True at once for a model never batched."""
    _alone(model, _request(6, 3, k=3))
    assert engine.finish(model, timeout=30)
    assert not [t for t in threading.enumerate() if t.name == "explainer-batcher"]
    assert engine.finish(build_model("llama"), timeout=0)  # no batcher: nothing to wait for
    _clean(model)


def test_a_row_that_does_not_fit_beside_the_others_waits_for_room(model, monkeypatch):
    reqs = {"a": _request(10, 12, k=6), "b": _request(13, 13, k=6)}
    refs = {key: _alone(model, r) for key, r in reqs.items()}
    from explainer.decoding.batched.row import Row

    need = max(
        Row(model, DecodeJob(r["ids"], [get_method(m) for m in METHODS], r["k"]), None, None).need
        for r in reqs.values()
    )
    monkeypatch.setenv(memory.BUDGET_ENV, str(int(1.5 * need / memory.USABLE)))  # one row fits, two do not
    out = _together(model, reqs)
    for key in reqs:
        _assert_exact(out[key], refs[key])
        assert out[key]["batch_size"] == 1  # each decoded alone: the second waited, it did not fail
    _clean(model)


def test_a_failing_row_fails_alone(model):
    from ...conftest import FailingMACS

    ok = _request(8, 14, k=6)
    ref = _alone(model, ok)
    out: dict = {}

    def failing() -> None:
        try:
            list(batched_steps(model, DecodeJob(_ids(5, 15), [FailingMACS()], 6)))
            out["failing"] = None
        except RuntimeError as e:
            out["failing"] = e

    with _paused(model):
        threads = [*_start(model, {"ok": ok}, out), threading.Thread(target=failing)]
        threads[-1].start()
        _wait(lambda: counts(model)[1] == 2)
    for t in threads:
        t.join(120)
    assert isinstance(out["failing"], RuntimeError)
    _assert_exact(out["ok"], ref)
    _clean(model)


class FailsOnTheDevice(MACS):
    """MACS whose device step fails at step 2: a method failing inside the batch's fixed-shape step."""

    def device_step(self, rows, step):
        if int(step) == 2:
            raise RuntimeError("device step failed")
        return super().device_step(rows, step)


def test_a_row_whose_device_work_fails_in_the_step_fails_alone(model, step_form):
    """In the fixed shape a row's methods run inside the batch's step (`Row.on_device`); one that fails there fails
    its row alone, after the steps it gave, and the others go on unchanged."""
    if step_form != "fixed-shape":
        pytest.skip("methods run inside the step only in the fixed shape")
    ok = _request(8, 17, k=6)
    ref = _alone(model, ok)
    out = _together(model, {"ok": ok, "failing": _request(6, 18, k=6, methods=lambda: [FailsOnTheDevice()])})
    assert isinstance(out["failing"], RuntimeError) and str(out["failing"]) == "device step failed"
    _assert_exact(out["ok"], ref)
    _clean(model)


def test_in_the_fixed_shape_rows_add_no_work_of_their_own_to_a_round(model, step_form, monkeypatch):
    """Rows whose methods run inside the step (MACS, Rollout, sinks) cost a round nothing outside it but the reads:
    a round of 4 rows runs as many tensor ops outside `BatchStep.run` as a round of 1 (each row's methods ran
    eagerly after the step before: ops in proportion to the rows), and the rows do work on the device."""
    if step_form != "fixed-shape":
        pytest.skip("methods run inside the step only in the fixed shape")
    from torch.utils._python_dispatch import TorchDispatchMode

    from explainer.decoding.batched import fixed
    from explainer.decoding.batched.row import Row

    class Count(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops, self.paused = 0, False

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops += not self.paused
            return func(*args, **(kwargs or {}))

    rounds: list[int] = []
    decode, run, work = engine.Batcher._decode, fixed.BatchStep.run, Row.device_work
    worked = []

    def counted_decode(self):
        with Count() as count:
            self._count = count
            decode(self)
        rounds.append(count.ops)

    def uncounted_run(self, *args, **kwargs):
        count = engine._batchers[model]._count
        count.paused = True
        try:
            return run(self, *args, **kwargs)
        finally:
            count.paused = False

    def device_work(self, rows, outs):
        worked.append(self.serial)
        return work(self, rows, outs)

    monkeypatch.setattr(engine.Batcher, "_decode", counted_decode)
    monkeypatch.setattr(fixed.BatchStep, "run", uncounted_run)
    monkeypatch.setattr(Row, "device_work", device_work)
    per_round = {}
    for size in (1, 4):
        rounds.clear()
        out = _together(model, {i: _request(9 + i, 70 + i, k=8) for i in range(size)})
        assert all(not isinstance(o, BaseException) for o in out.values())
        per_round[size] = sorted(rounds)[len(rounds) // 2]  # the median round (the last one also ends the rows)
    assert per_round[4] == per_round[1]
    assert len(set(worked)) == 5  # every row worked on the device
    _clean(model)


def test_rows_keep_macs_layer_factors_and_options_as_the_solo_loop(model):
    """The app's MACS keeps its layer factors (`keep_layers`); with options of the Table 4 ablations too, a row's
    factors and maps equal the solo loop's to rounding, in both forms (in the fixed shape they are written inside the
    step, `Row.device_work`); rows with other options decode beside it unchanged."""
    options = ({"keep_layers": True}, {"keep_layers": True, "pooling": "mean", "alpha": 0.5}, {"redistribute": False})
    made: dict[int, list] = {}

    def methods(i):
        def make():
            made[i] = [MACS(**options[i]), get_method("rollout")]
            return made[i]

        return make

    reqs = {i: _request(7 + 3 * i, 80 + i, k=6, methods=methods(i)) for i in range(3)}
    out = _together(model, reqs)
    for i, req in reqs.items():
        got = out[i]
        assert not isinstance(got, BaseException), got
        solo = [MACS(**options[i]), get_method("rollout")]
        job = DecodeJob(req["ids"], solo, req["k"])
        ref = list(generate_steps(model, job, decode_choice(model, job), None, SinkTracker(req["ids"].shape[1], model)))
        assert [s.token_id for s in got["steps"]] == [s.token_id for s in ref]
        for a, b in zip(got["steps"], ref):
            np.testing.assert_allclose(a.scores["macs"], b.scores["macs"], rtol=RTOL, atol=ATOL)
        if options[i].get("keep_layers"):
            np.testing.assert_allclose(made[i][0].layer_scores(), solo[0].layer_scores(), rtol=RTOL, atol=ATOL)
            assert made[i][0].layer_scores().shape == (6, model.config.num_hidden_layers, req["ids"].shape[1])
    _clean(model)


class FailsAtOnce(MACS):
    def step(self, rows):
        raise RuntimeError("failed at step 0")


class FailsToBegin(MACS):
    def begin(self, n):
        raise RuntimeError("failed to begin")


def test_a_row_that_fails_in_a_shared_prefill_fails_alone(model):
    ok = _request(8, 16, k=5)
    ref = _alone(model, ok)
    out: dict = {}

    def failing(key: str, method: MACS) -> None:
        try:
            sinks = SinkTracker(8, model)  # as "ok" has one: the same pass, so the prefill is shared
            list(batched_steps(model, DecodeJob(ok["ids"], [method, get_method("rollout")], 5), None, sinks))
            out[key] = None
        except RuntimeError as e:
            out[key] = e

    with _paused(model):
        threads = [threading.Thread(target=failing, args=("at once", FailsAtOnce()))]
        threads.append(threading.Thread(target=failing, args=("to begin", FailsToBegin())))
        for t in threads:
            t.start()
        threads += _start(model, {"ok": ok}, out)
        _wait(lambda: counts(model)[1] == 3)
    for t in threads:
        t.join(120)
    assert str(out["at once"]) == "failed at step 0" and str(out["to begin"]) == "failed to begin"
    _assert_exact(out["ok"], ref)
    assert out["ok"]["prefill_rows"] == 2  # it shared the pass with the row that failed at step 0
    _clean(model)


def test_requests_are_checked_before_they_join(model):
    with pytest.raises(InputError):  # one prompt per row: the job refuses a batch before anything joins
        batched_steps(model, DecodeJob(torch.zeros(2, 5, dtype=torch.long), [get_method("macs")], 3))
    with pytest.raises(ValueError):  # an image prompt runs solo
        batched_steps(model, DecodeJob(_ids(5, 1), [get_method("macs")], 3, extra_inputs={"pixel_values": 1}))
    assert counts(model) == (0, 0)


def test_stream_explain_batches_text_requests_and_records_the_path(tokenizer, monkeypatch):
    bundle = bundle_from_objects(build_model("llama"), tokenizer, name="tiny-llama")
    prompts = ["What is the capital of France?", "The quick brown fox jumps over the lazy dog.", "Name three colours."]
    methods = ["macs", "rollout", "random"]  # random is post-hoc: it holds the model after the decode
    alone = [explain(bundle, p, methods=methods, max_new_tokens=8) for p in prompts]
    assert all(a.meta["decode"] == {"path": "solo", "reason": a.meta["decode"]["reason"], "batch_size": 1,
                                    "prefill_rows": 1} for a in alone)  # fmt: skip
    enable_batching()
    results: dict = {}
    with _paused(bundle.model):
        streams = [stream_explain(bundle, p, methods=methods, max_new_tokens=8) for p in prompts]
        _wait(lambda: counts(bundle.model)[1] == len(prompts))
    threads = [threading.Thread(target=lambda i=i: results.update({i: list(streams[i])[-1]})) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for i, ref in enumerate(alone):
        got = results[i]
        form = choice.batch_step_form(bundle.model, torch.device("cpu"), choice.override()[1])[1]
        assert got.meta["decode"] == {"path": "batched", "reason": f"batching is on: {form}", "batch_size": 3,
                                      "prefill_rows": 1}  # fmt: skip
        assert got.meta["status"] == "done"
        assert got.generated_token_ids == ref.generated_token_ids
        for m in methods:
            np.testing.assert_allclose(got.methods[m].raw, ref.methods[m].raw, rtol=RTOL, atol=ATOL, err_msg=m)
    _clean(bundle.model)


def test_a_cancelled_visitor_leaves_the_batch_and_the_others_finish_unchanged(tokenizer, monkeypatch):
    bundle = bundle_from_objects(build_model("qwen2"), tokenizer, name="tiny-qwen2")
    prompt = "What is the capital of France?"
    ref = explain(bundle, prompt, methods=["macs", "rollout"], max_new_tokens=20)
    enable_batching()
    alone = explain(bundle, prompt, methods=["macs", "rollout"], max_new_tokens=20)  # alone in the batcher
    gated, token = GatedMACS(at=2), CancelToken()
    with _paused(bundle.model):
        kept = stream_explain(bundle, prompt, methods=["macs", "rollout"], max_new_tokens=20)
        gone = stream_explain(bundle, "Name three colours.", methods=[gated], max_new_tokens=20, cancel=token)
        _wait(lambda: counts(bundle.model)[1] == 2)
    assert gated.reached.wait(120)
    token.cancel()
    gated.gate.set()
    with pytest.raises(Cancelled):
        list(gone)
    final = list(kept)[-1]
    assert final.meta["decode"]["batch_size"] == 2 and final.generated_token_ids == ref.generated_token_ids
    for m in ("macs", "rollout"):
        np.testing.assert_allclose(final.methods[m].raw, ref.methods[m].raw, rtol=RTOL, atol=ATOL, err_msg=m)
        np.testing.assert_array_equal(final.methods[m].raw, alone.methods[m].raw, err_msg=m)
    assert final.step_scores == alone.step_scores
    _clean(bundle.model)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_in_bfloat16_rows_of_different_lengths_are_bit_identical_to_lone_runs(kind):
    """In bfloat16 (the embedded model's dtype on a CPU with native bf16) each row, beside rows of other lengths and
    beside a copy of itself, gives exactly its lone numbers; the solo loop gives the same tokens."""
    model = build_model(kind).to(torch.bfloat16)
    forced = [s.token_id for s in _solo(model, _request(19, 22, k=5))["steps"]]
    reqs = {"a": _request(5, 20, k=9), "b": _request(27, 21, k=7), "c": _request(12, 23, k=12, forced=forced)}
    reqs["a2"] = reqs["a"]
    refs = {key: _alone(model, r) for key, r in reqs.items()}
    out = _together(model, reqs)
    for key, ref in refs.items():
        assert out[key]["batch_size"] == 4
        _assert_exact(out[key], ref)
        assert [s.token_id for s in ref["steps"]] == [s.token_id for s in _solo(model, reqs[key])["steps"]]
    _clean(model)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_products_at_a_fixed_row_count_give_each_row_the_same_numbers_in_any_batch(dtype):
    """`chunked_linear` gives row 0 the same bits whether it is alone or among up to 9 rows (the product library
    picks its kernel by the row count, so a plain `F.linear` may not), and equals `F.linear` to rounding."""
    from explainer.decoding.batched.products import chunked_linear, fixed_rows, linear_layers

    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(96, 80, generator=g).to(dtype), torch.randn(96, generator=g).to(dtype)
    x = torch.randn(9, 1, 80, generator=g).to(dtype)  # (B, 1, K): a decode step's rows
    alone = chunked_linear(x[:1], w, b, 4)
    for n in range(1, 10):
        out = chunked_linear(x[:n], w, b, 4)
        assert out.shape == (n, 1, 96)
        torch.testing.assert_close(out, torch.nn.functional.linear(x[:n], w, b), rtol=1e-2, atol=1e-2)
        assert torch.equal(out[:1], alone), n
    model = build_model("llama")
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert linear_layers(model) == linears
    with pytest.raises(RuntimeError), fixed_rows(linears, 4):
        assert all("forward" in vars(m) for m in linears)
        raise RuntimeError("a failing step")
    assert not any("forward" in vars(m) for m in linears)  # nothing outlives the block


def test_a_text_visitor_decodes_between_the_passes_of_someone_elses_atman(tokenizer, monkeypatch):
    """Short work first (runtime/turns.py): a visitor's text request that arrives while another request runs AtMan
    (holding the model) is answered before that AtMan ends, with exactly its lone numbers; AtMan, given up and taken
    back between its passes, gives exactly its uninterrupted scores."""
    bundle = bundle_from_objects(build_model("llama"), tokenizer, name="tiny-llama")
    long_prompt = "The quick brown fox jumps over the lazy dog, and the dog sleeps on. " * 4
    short_prompt = "Name three colours."
    ref_atman = explain(bundle, long_prompt, methods=["atman"], max_new_tokens=6)
    enable_batching()
    alone = explain(bundle, short_prompt, methods=list(METHODS), max_new_tokens=12)  # alone in the batcher
    enable_batching(False)  # the AtMan request runs solo: it holds the model throughout
    in_atman, queued = threading.Event(), threading.Event()
    out: dict = {}

    def progress(fraction: float, message: str) -> None:
        if not in_atman.is_set():  # after AtMan's first pass
            in_atman.set()
            assert queued.wait(60)

    def long_request() -> None:
        out["atman"] = explain(bundle, long_prompt, methods=["atman"], max_new_tokens=6, progress=progress)
        out["atman_end"] = time.monotonic()

    def visitor() -> None:
        out["text"] = explain(bundle, short_prompt, methods=list(METHODS), max_new_tokens=12)
        out["text_end"] = time.monotonic()

    threads = [threading.Thread(target=long_request)]
    threads[0].start()
    assert in_atman.wait(120)
    enable_batching()
    threads.append(threading.Thread(target=visitor))
    threads[1].start()
    _wait(lambda: counts(bundle.model)[1] == 1)  # the visitor's row waits for the model
    queued.set()
    for t in threads:
        t.join(120)
    assert out["text_end"] < out["atman_end"]  # not stuck behind AtMan
    got = out["text"]
    assert got.meta["decode"]["path"] == "batched" and got.generated_token_ids == alone.generated_token_ids
    for m in METHODS:
        np.testing.assert_array_equal(got.methods[m].raw, alone.methods[m].raw, err_msg=m)
    np.testing.assert_array_equal(out["atman"].methods["atman"].raw, ref_atman.methods["atman"].raw)
    _clean(bundle.model)


@pytest.mark.parametrize("layout", ["cpu", "accelerator"])
@pytest.mark.parametrize("rows", [1, 5])
def test_rows_equal_the_eager_references(model, rows, layout, step_form, monkeypatch):
    """1 and 5 rows decoding together, each against MACS (`reference_macs`) and Rollout (`reference_rollout`)
    computed from eager attention over its own prompt and answer: independent of the batch and of the capture. Also
    with Rollout's prompt rows as an accelerator keeps them (one block a layer, and in the fixed shape every layer's
    rows in one (L, T, T) buffer: one product a layer a step)."""
    from explainer.methods import rollout

    if layout == "accelerator":
        monkeypatch.setattr(rollout, "CPU_PROMPT_BLOCKS", 1)
    made = []

    def methods():
        made.append([get_method(m) for m in METHODS])
        return made[-1]

    reqs = {i: _request(n, 40 + i, k=6, methods=methods) for i, n in enumerate((7, 12, 4, 9, 15)[:rows])}
    out = _together(model, reqs)
    for i, req in reqs.items():
        got = out[i]
        assert not isinstance(got, BaseException), got
        n, tokens = req["ids"].shape[1], [s.token_id for s in got["steps"]]
        attentions, _ = eager_attentions(model, torch.cat([req["ids"], torch.tensor([tokens])], dim=1))
        macs = np.array([s.scores["macs"] for s in got["steps"]])
        rollout_rows = np.array([s.scores["rollout"] for s in got["steps"]])
        np.testing.assert_allclose(macs, np.array(reference_macs(attentions, n, len(tokens))[0]), rtol=1e-4, atol=0)
        np.testing.assert_allclose(rollout_rows, np.array(reference_rollout(attentions, n, len(tokens))), atol=1e-5)
    squares = {m[1].square is not None for m in made}
    assert squares == {layout == "accelerator" and step_form == "fixed-shape"}  # the square on the device path only
    _clean(model)


@pytest.mark.parametrize("device", ACCELERATORS)
@pytest.mark.parametrize("rows", [1, 8])
def test_cuda_rows_on_the_batch_graph_equal_the_dynamic_loop(device, rows, step_form, monkeypatch):
    """On CUDA the batch's step is one CUDA graph (whatever the form asked on a CPU): 1 and 8 rows with MACS and
    Rollout, generated and given answers, equal the solo loop on a dynamic cache (tokens identical, rows to float32
    rounding), and each row equals its lone run in the batcher bit for bit."""
    if step_form != "rows-apart":
        pytest.skip("the CUDA form does not depend on the CPU's flag")
    model = build_model("llama").to(device)
    assert choice.batch_step_form(model, torch.device(device))[0] == choice.GRAPH
    monkeypatch.setenv(DECODE_ENV, "solo")  # the references: the plain loop on a dynamic cache
    reqs = {}
    for i, n in enumerate((5, 11, 8, 3, 17, 9, 6, 13)[:rows]):
        req = _request(n, 60 + i, k=7)
        req["ids"] = req["ids"].to(device)
        if i % 2:
            req["forced"] = [int(t) for t in (torch.arange(7) * 7 + i) % 250]
        reqs[i] = req
    out = _together(model, reqs)
    for i, req in reqs.items():
        _assert_same(out[i], _solo(model, req))
        _assert_exact(out[i], _alone(model, req))
    _clean(model)
