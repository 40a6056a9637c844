"""One request at a time per model, isolation of the attention functions, and cancellation (issue: concurrent
requests corrupted each other's attention rows)."""

from __future__ import annotations

import gc
import threading
import time

import numpy as np
import pytest
import torch

from explainer import bundle_from_objects, explain, stream_explain
from explainer.capture import capture_attention, registered_names
from explainer.errors import Cancelled
from explainer.faithfulness import (
    FaithfulnessRequest,
    RemovalConfig,
    SoftConfig,
    measure_faithfulness,
    stream_faithfulness,
)
from explainer.methods import MACS
from explainer.runtime.session import CancelToken, check_cancelled, hold, model_lock, run_in_worker

from ...conftest import build_model

PROMPTS = [
    "What is the capital of France?",
    "Question: What is the capital of France? Context: France is a country in Europe.",
    "The quick brown fox jumps over the lazy dog.",
]
REQUESTS = [
    (PROMPTS[0], ("macs", "rollout")),
    (PROMPTS[1], ("macs", "atman")),
    (PROMPTS[2], ("rollout", "atman", "random")),
]


@pytest.fixture(scope="module")
def bundle(tokenizer):
    return bundle_from_objects(build_model("llama"), tokenizer, name="tiny-llama")


def _clean(bundle) -> None:
    assert registered_names() == []
    assert bundle.model.config._attn_implementation == "sdpa"
    assert not model_lock(bundle.model).locked()


def _run(bundle, prompt, methods):
    attr = explain(bundle, prompt, methods=list(methods), max_new_tokens=6)
    return attr.generated_token_ids, {m: s.raw for m, s in attr.methods.items()}


def test_concurrent_requests_equal_the_same_requests_alone(bundle):
    alone = [_run(bundle, p, m) for p, m in REQUESTS]
    results: dict[int, tuple] = {}
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            results[i] = _run(bundle, *REQUESTS[i % len(REQUESTS)])
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(3 * len(REQUESTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    for i, (ids, raw) in results.items():
        ref_ids, ref_raw = alone[i % len(REQUESTS)]
        assert ids == ref_ids
        assert raw.keys() == ref_raw.keys()
        for m in raw:
            np.testing.assert_array_equal(raw[m], ref_raw[m])  # bit-identical, not merely close
    _clean(bundle)


def test_foreign_forward_pass_gets_plain_sdpa_and_records_nothing(bundle):
    """A forward pass from another thread (outside the library) while a capture is selected is not recorded and
    computes exactly what plain SDPA computes."""
    ids = bundle.encode(PROMPTS[0]).input_ids
    with torch.no_grad():
        plain = bundle.model(input_ids=ids).logits
    seen = {}
    with capture_attention(bundle.model) as recorder:

        def foreign():
            with torch.no_grad():
                seen["logits"] = bundle.model(input_ids=ids).logits

        t = threading.Thread(target=foreign)
        t.start()
        t.join(30)
        assert recorder.rows == {}
    torch.testing.assert_close(seen["logits"], plain, rtol=0, atol=0)
    _clean(bundle)


class SlowMACS(MACS):
    """MACS that takes a while per step, so a request is still running when it is cancelled."""

    name = "macs"

    def step(self, rows):
        time.sleep(0.05)
        return super().step(rows)


def test_cancelled_stream_stops_and_frees_the_model_for_the_next_request(bundle):
    full = explain(bundle, PROMPTS[0], methods=["macs"], max_new_tokens=60)
    assert full.num_steps >= 40  # otherwise the cancel below would prove nothing
    token = CancelToken()
    stream = stream_explain(bundle, PROMPTS[0], methods=[SlowMACS()], max_new_tokens=60, cancel=token)
    first = next(stream)
    assert first.num_steps == 1 and model_lock(bundle.model).locked()
    t0 = time.perf_counter()
    token.cancel()
    with pytest.raises(Cancelled):
        for _ in stream:
            pass
    stream.close()
    assert time.perf_counter() - t0 < 2.0
    _clean(bundle)
    t0 = time.perf_counter()
    assert explain(bundle, PROMPTS[0], methods=["macs"], max_new_tokens=2).num_steps == 2
    assert time.perf_counter() - t0 < 2.0  # the next request starts at once


def test_dropped_stream_is_cancelled(bundle):
    stream = stream_explain(bundle, PROMPTS[0], methods=[SlowMACS()], max_new_tokens=60)
    next(stream)
    thread = stream._thread
    del stream
    gc.collect()
    thread.join(5)
    assert not thread.is_alive()
    _clean(bundle)


class Recording(MACS):
    """MACS that logs its steps in a shared list, to see which request ran when."""

    name = "macs"

    def __init__(self, label, events, delay=0.0):
        super().__init__()
        self.label, self.events, self.delay = label, events, delay

    def step(self, rows):
        self.events.append(self.label)
        time.sleep(self.delay)
        return super().step(rows)


def test_waiting_request_runs_only_after_the_running_one(bundle):
    events: list[str] = []
    stream = stream_explain(bundle, PROMPTS[0], methods=[Recording("first", events, 0.05)], max_new_tokens=20)
    next(stream)
    t = threading.Thread(
        target=explain,
        args=(bundle, PROMPTS[1]),
        kwargs={"methods": [Recording("second", events)], "max_new_tokens": 3},
    )
    t.start()
    time.sleep(0.3)
    assert "second" not in events and model_lock(bundle.model).waiting == 1  # queued behind the running request
    for _ in stream:
        pass
    t.join(30)
    first = [i for i, e in enumerate(events) if e == "first"]
    second = [i for i, e in enumerate(events) if e == "second"]
    assert len(first) >= 15 and second and max(first) < min(second)  # never interleaved
    _clean(bundle)


def test_request_cancelled_while_waiting_never_runs(bundle):
    with hold(bundle.model):
        token = CancelToken()
        stream = stream_explain(bundle, PROMPTS[0], methods=["macs"], max_new_tokens=2, cancel=token)
        time.sleep(0.2)
        token.cancel()
        with pytest.raises(Cancelled):
            next(stream)
    _clean(bundle)


def test_atman_is_cancelled_between_passes(bundle):
    token = CancelToken()
    long_prompt = " ".join([PROMPTS[1]] * 6)
    calls = []
    stream = stream_explain(
        bundle, long_prompt, methods=["atman"], max_new_tokens=4, cancel=token,
        method_options={"atman": {"fast": False}},
        progress=lambda f, msg: (calls.append(f), token.cancel() if len(calls) == 3 else None),
    )  # fmt: skip
    with pytest.raises(Cancelled):
        for _ in stream:
            pass
    assert 3 <= len(calls) <= 4  # stopped right after the pass that saw the cancel
    _clean(bundle)


def test_faithfulness_is_cancellable_and_streams_removal_first(bundle):
    attr = explain(bundle, PROMPTS[1], methods=["macs"], max_new_tokens=6)
    request = FaithfulnessRequest(
        methods=["macs"], removal=RemovalConfig(max_new_tokens=4), soft=SoftConfig(samples=2, pis=(0.5,))
    )
    stream = stream_faithfulness(bundle, attr, request)
    parts = list(stream)
    assert parts[0].removal is not None and parts[0].soft is None and "removal" in parts[0].seconds
    assert parts[-1].soft is not None and set(parts[-1].seconds) == {"removal", "soft"}
    token = CancelToken()
    token.cancel()
    with pytest.raises(Cancelled):
        measure_faithfulness(bundle, attr, FaithfulnessRequest(methods=["macs"]), cancel=token)
    _clean(bundle)


def test_worker_stream_latest_merges_updates_and_keeps_the_end():
    release = threading.Event()

    def work():
        yield from range(5)
        release.wait(5)
        yield 5

    class Model:
        pass

    stream = run_in_worker(work, Model())
    time.sleep(0.2)
    assert stream.latest(1.0) == 4  # 0..3 merged away
    release.set()
    assert stream.latest(2.0) == 5
    with pytest.raises(StopIteration):
        stream.latest(2.0)


def test_worker_errors_reach_the_consumer():
    def work():
        yield 1
        raise ValueError("boom")

    class Model:
        pass

    stream = run_in_worker(work, Model())
    assert next(stream) == 1
    with pytest.raises(ValueError, match="boom"):
        next(stream)


def test_check_cancelled_sees_only_its_own_request():
    mine, other = CancelToken(), CancelToken()

    class Model:
        pass

    other.cancel()
    with hold(Model(), mine):
        check_cancelled()  # another request's cancel does not stop this one
        mine.cancel()
        with pytest.raises(Cancelled):
            check_cancelled()
    check_cancelled()  # outside any request: nothing to cancel
