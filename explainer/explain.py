"""One explain request from start to end: the request (`request.ExplainRequest`, validated when it was built) meets
the model, the decode loop (`decoding/`) runs with the streaming methods, then the post-hoc methods, yielding a
growing `Attribution` snapshot after every step.

A given answer is teacher-forced through exactly the forward passes of generation (`decoding.generate_steps`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import Any

import torch

from .contrast import alternatives_record, foil_vector, resolve_contrast
from .decoding.choice import BATCHED, DecodeChoice, choose_path
from .decoding.dispatch import generate_steps
from .decoding.graphs import graph_failure
from .decoding.job import DecodeJob
from .estimate import post_hoc_seconds
from .methods import AttributionMethod, GenerationRun, ProgressFn, answer_logprobs
from .models.answer import answer_token_ids
from .models.loading import ModelBundle
from .reliance import add_reliance
from .request import ExplainRequest, answer_too_long, check_vocabulary, fit_answer
from .result.attribution import STEP_SCORES, Attribution, MethodScores, ScoreRows
from .result.sinks import SinkTracker
from .runtime.kv import batch_budget
from .runtime.memory import check_request
from .runtime.precision import precision_meta
from .runtime.session import CancelToken, hold, holds, run_in_worker


def stream_explain(
    bundle: ModelBundle,
    prompt: str,
    methods: Sequence[str | AttributionMethod] = ("macs",),
    max_new_tokens: int = 64,
    chat_template: bool = True,
    method_options: dict[str, dict[str, Any]] | None = None,
    progress: ProgressFn | None = None,
    image: Any = None,
    max_image_tokens: int | None = None,
    cancel: CancelToken | None = None,
    answer: str | Sequence[int] | None = None,
    contrast: dict[int, str | int] | None = None,
    reliance: bool = True,
) -> Iterator[Attribution]:
    """Generate (or take) an answer and yield a growing `Attribution` after every token, then after each post-hoc
    method.

    Args:
        bundle: loaded model.
        prompt: the user's text (the chat template is applied when `chat_template` and the tokenizer has one).
        methods: registered method names (or instances), e.g. ["macs", "random"].
        max_new_tokens: generation length bound (greedy decoding; stops early at end-of-sequence).
        chat_template: wrap the prompt in the tokenizer's chat template.
        method_options: per-method keyword options, e.g. {"macs": {"alpha": 0.5}}.
        progress: callback for post-hoc methods' progress.
        image: optional image (path or PIL image), or a list of them in order, the prompt asks about (a vision-language
            bundle); the result then has `image` / `images` (`Attribution`) and the question's `user_positions`.
        max_image_tokens: with `image`, resize the images to at most this many merged image tokens in all, shared
            equally (default: the budget the bundle's image processor was loaded with).
        cancel: a token that stops the work within one forward pass when it fires (`Cancelled` is raised).
        answer: explain this answer instead of generating one: text, or token ids used as they are. The text is
            tokenised as the continuation of the prompt after the chat template's assistant prefix, with no special
            tokens added (see `answer_token_ids`); every method then explains each of its K tokens as if the model
            had generated it (teacher forcing, the same forward passes as generation). All K tokens are explained,
            `max_new_tokens` raised to hold them (`request.fit_answer`, up to 1,024), an end-of-sequence token
            inside the answer included, and none is appended. None, "" or whitespace only: generate as usual.
            The result's `meta["answer"]` is "given" or "generated", `meta["answer_tokenization"]` says how a
            text answer was split.
        contrast: {0-based step: foil (token id or one-token text)}: there the contrastive methods explain
            l_A - l_B ("why A rather than B?"); `meta["contrast"]` records it (see `explainer/contrast.py`).
        reliance: for an image prompt, measure `Attribution.reliance` after the methods (`explainer/reliance.py`).

    Every result has `step_scores`: the probability the model gave each answer token and the entropy of that
    step's next-token distribution (nats).

    The keywords become an `ExplainRequest`, checked here, before any model work; `stream_request` runs it (in the
    model's worker thread; closing the stream cancels the work).

    Raises:
        InputError: bad prompt, answer, image or settings (an answer longer than 1,024 tokens included).
        UnknownMethodError: unknown method name. UnsupportedModelError: the model's attention cannot be captured.
    """
    request = ExplainRequest.build(
        prompt, methods, max_new_tokens, chat_template, method_options, image, max_image_tokens, answer, contrast,
        reliance=reliance,
    )
    return stream_request(bundle, request, progress, cancel)


def stream_request(
    bundle: ModelBundle, request: ExplainRequest, progress: ProgressFn | None = None, cancel: CancelToken | None = None
) -> Iterator[Attribution]:
    """Run a request (`ExplainRequest`, validated when it was built) on `bundle`: the stream of `stream_explain`.

    The work runs in its own thread that holds the model's lock (`session.hold`) from the first forward pass to the
    last, so concurrent calls on one bundle never see each other's attention (on the batched path, text requests
    share decode steps: `decode_choice` decides, `meta["decode"]` records it). Each update is a snapshot that
    the work does not change afterwards. Closing the stream (or dropping it) cancels the work. Called while the
    caller holds the model (eval), it runs inline.

    Args:
        bundle: loaded model.
        request: what to explain and how.
        progress: callback for post-hoc methods' progress: (fraction, message).
        cancel: a token that stops the work within one forward pass when it fires (`Cancelled` is raised).
    """
    return _updates(bundle, request, progress, cancel, on_caller=False)


def explain_request(
    bundle: ModelBundle, request: ExplainRequest, progress: ProgressFn | None = None, cancel: CancelToken | None = None
) -> Attribution:
    """Run `stream_request` to the end and return the final `Attribution`.

    The model runs on the caller's own thread (holding the model's lock, waiting for it like any request), except a
    row of the batched decode, whose steps the batcher's thread runs: a process keeps one team of torch's CPU threads.
    A worker thread here would start a second team, and once the caller has run torch itself (a `model.generate`, a
    comparison script) the two teams contend for the cores: every later call was ~1.5x slower on a 2-core CPU.
    """
    final = None
    for update in _updates(bundle, request, progress, cancel, on_caller=True):
        final = update
    assert final is not None
    return final


def _updates(
    bundle: ModelBundle,
    request: ExplainRequest,
    progress: ProgressFn | None,
    cancel: CancelToken | None,
    on_caller: bool,
) -> Iterator[Attribution]:
    """The request's snapshots: on the caller's thread when it holds the model (eval) or when `on_caller` (a call that
    reads them to the end), else in a worker thread (a stream the caller may drop)."""
    request = fit_answer(bundle, request)  # a given answer is explained in full (the one rule of its length)
    choice = decode_choice(bundle, request)
    run = partial(_run, bundle, request, progress, choice)
    if holds(bundle.model):
        return _inline(bundle.model, run, cancel)
    if on_caller and choice.path != BATCHED:
        return _inline(bundle.model, run, cancel, fresh_modes=True)
    # On the batched path (the app) a text request joins the model's batched decode (decoding/batched/) and holds
    # the model only for its post-hoc methods; otherwise the worker holds it from the first forward pass to the last.
    return run_in_worker(run, bundle.model, cancel, hold_model=choice.path != BATCHED)


def decode_choice(bundle: ModelBundle | torch.nn.Module, request: ExplainRequest | DecodeJob) -> DecodeChoice:
    """The decode path a request takes (`decoding.choose_path`), decided here, once, for every caller: the requests
    of `explain` and the streams, and the bare `DecodeJob`s of the bench, the scripts and the tests, which they hand
    to `decoding.generate_steps` with it. A bare job never joins the batch: its caller holds no place in it.

    Args:
        bundle: the `ModelBundle`, or the model itself.
        request: an `ExplainRequest` (after `request.fit_answer`) or a `DecodeJob`.

    Raises:
        InputError: `EXPLAINER_DECODE` names no path.
    """
    return choose_path(bundle, request, can_batch=False if isinstance(request, DecodeJob) else None)


def _inline(
    model: torch.nn.Module,
    run: Callable[[], Iterator[Attribution]],
    cancel: CancelToken | None,
    fresh_modes: bool = False,
):
    """`run` in the calling thread, holding the model (re-entrantly where it holds it already, e.g. inside an
    evaluation). `fresh_modes`: with the autograd modes a worker thread starts with (gradients on, no inference
    mode), whatever the caller set, so the gradient methods run as they do in a worker."""
    modes = contextlib.ExitStack()
    if fresh_modes:
        modes.enter_context(torch.inference_mode(False))
        modes.enter_context(torch.enable_grad())
    with modes, hold(model, cancel):
        yield from run()


def _run(
    bundle: ModelBundle, request: ExplainRequest, progress: ProgressFn | None, choice: DecodeChoice
) -> Iterator[Attribution]:
    instances = request.instances()
    attr, job = _meet(bundle, request, instances)
    yield from _generate(bundle, attr, job, choice)
    batched = choice.path == BATCHED
    foils = resolve_contrast(bundle, attr, request.contrast, instances)  # {step: foil id}; sets meta["contrast"]
    post_hoc = [m.name for m in instances if not m.streaming] if batched else []
    seconds = post_hoc_seconds(bundle, attr, post_hoc, dict(request.method_options)) if post_hoc else None
    with hold(bundle.model, seconds=seconds) if post_hoc else contextlib.nullcontext():  # batched: holds it only now
        yield from _run_post_hoc(bundle, attr, instances, progress, job.extra_inputs, foils)
    yield from add_reliance(bundle.model, attr, instances, job.extra_inputs, request.reliance)  # image prompts
    attr.meta["status"] = "done"
    yield attr.snapshot()


def _meet(
    bundle: ModelBundle, request: ExplainRequest, instances: list[AttributionMethod]
) -> tuple[Attribution, DecodeJob]:
    """Where a request meets the model, and the only place the checks that need it are made: answer ids inside the
    vocabulary, the prompt (plus `max_new_tokens`) within the context, a text answer's tokens within
    `max_new_tokens`, and the memory the request needs. Returns the empty result and the decode loop's job."""
    answer = request.answer
    if isinstance(answer, tuple):  # before the (slow) image preprocessing
        check_vocabulary(answer, bundle.model.get_input_embeddings().num_embeddings)
    attr, input_ids, extra_inputs, context = _encode_request(bundle, request)
    forced = None
    if answer is None:
        attr.meta["answer"] = "generated"
    else:
        forced, how = (list(answer), "ids") if isinstance(answer, tuple) else answer_token_ids(bundle, answer, *context)
        if len(forced) > request.max_new_tokens:  # text: known once tokenised (ids were checked when built)
            raise answer_too_long(len(forced), request.max_new_tokens)
        attr.meta.update(answer="given", answer_tokenization=how)
    for m in instances:
        m.prepare(bundle.model)
    job = DecodeJob(input_ids, instances, request.max_new_tokens, forced, bundle.eos_token_ids, extra_inputs)
    n, k = input_ids.shape[1], job.num_steps
    check_request(bundle.model, instances, n, k, *batch_budget(bundle.model, n + k, k, 0, 0))
    return attr, job


def _encode_request(
    bundle: ModelBundle, request: ExplainRequest
) -> tuple[Attribution, torch.Tensor, dict[str, Any] | None, tuple[list[int], str, bool]]:
    """The empty result of a request, its (1, N) prompt ids, for an image prompt the prefill's extra inputs, and the
    prompt as `answer_token_ids` continues it: (ids, the text they were tokenised from, whether special tokens were
    added)."""
    extra_inputs = None
    image_record = None
    prompt, chat_template, max_new_tokens = request.prompt, request.chat_template, request.max_new_tokens
    if request.images:
        from .models.vision import encode_image_prompt

        encoded = encode_image_prompt(
            bundle, request.image, prompt, chat_template=chat_template, max_new_tokens=max_new_tokens,
            max_image_tokens=request.max_image_tokens,
        )  # fmt: skip
        extra_inputs = encoded.prefill_inputs
        text, add_special = encoded.expanded_text(), False  # as tokenised
        image_record = encoded.record()
    else:
        encoded = bundle.encode(prompt, chat_template=chat_template, max_new_tokens=max_new_tokens)
        text, add_special = encoded.text, not (chat_template and bundle.has_chat_template)  # as `encode` does
    ids = encoded.input_ids[0].tolist()
    attr = Attribution(
        model=bundle.name,
        prompt_token_ids=ids,
        prompt_tokens=bundle.readable(ids),
        user_positions=encoded.user_positions,
        meta={
            "max_new_tokens": max_new_tokens,
            "chat_template": bool(chat_template and bundle.has_chat_template),
            **precision_meta(bundle.model),
        },
        image=image_record,
    )
    return attr, encoded.input_ids, extra_inputs, (ids, text, add_special)


def _generate(bundle: ModelBundle, attr: Attribution, job: DecodeJob, choice: DecodeChoice) -> Iterator[Attribution]:
    """Greedy generation (or the job's teacher-forced answer) into `attr`, with the streaming methods' rows and the
    step scores: a snapshot after every token, on the path `choice` names (`decoding.generate_steps` dispatches it).
    `meta["decode"]` records it (`DecodeChoice.meta`)."""
    streaming = [m for m in job.methods if m.streaming]
    forced_ids = job.forced_ids
    attr.step_scores = {key: [] for key in STEP_SCORES}  # "probability", "entropy"
    capacity = min(job.max_new_tokens, 64) if forced_ids is None else len(forced_ids)
    score_rows = {m.name: ScoreRows(attr.num_prompt_tokens, capacity) for m in streaming}  # O(N) host work a token
    method_seconds: dict[str, float] = {}
    gen_start = time.perf_counter()
    forward_seconds = 0.0
    sinks = SinkTracker(attr.num_prompt_tokens, bundle.model)
    seen = {"batch_size": 1, "prefill_rows": 1}
    steps = generate_steps(bundle.model, job, choice, method_seconds, sinks, seen)
    attr.meta["decode"] = choice.meta()
    for step in steps:
        forward_seconds += step.seconds
        if step.decode_path != choice.path:  # a CUDA graph's capture failed: the same step goes on eagerly
            choice = choice.eager(graph_failure(bundle.model))
            attr.meta["decode"] = choice.meta()
        attr.generated_token_ids.append(step.token_id)
        attr.generated_tokens.extend(bundle.readable([step.token_id]))
        for key in STEP_SCORES:
            attr.step_scores[key].append(getattr(step, key))
        alternatives = alternatives_record(bundle, step.alternatives)
        attr.meta["alternatives"] = [*attr.meta.get("alternatives", []), alternatives]  # a new list per snapshot
        for m in streaming:
            attr.methods[m.name] = score_rows[m.name].append(
                step.scores[m.name], seconds=method_seconds.get(m.name, 0.0), meta=m.meta()
            )
        done = len(attr.generated_token_ids)
        forcing = f"teacher-forcing the answer: {done} of {len(forced_ids)} tokens" if forced_ids else ""
        attr.meta["status"] = forcing or f"generating: {done} tokens"
        yield attr.snapshot()
    generation_seconds = time.perf_counter() - gen_start
    for m in streaming:  # per-layer scores a method kept on the device (MACS's factors): one read, at the end
        attr.methods[m.name] = attr.methods[m.name].with_layers(m.layer_scores())
    sink_record = sinks.record()  # read once, at the end; None when no attention was captured
    if sink_record is not None:
        attr.meta["sinks"] = sink_record
    attr.meta.update(
        generation_seconds=generation_seconds,
        forward_seconds=forward_seconds,
        tokens_per_s=len(attr.generated_token_ids) / generation_seconds if generation_seconds > 0 else 0.0,
        decode=choice.meta(seen["batch_size"], seen["prefill_rows"]),
    )


def _run_post_hoc(
    bundle: ModelBundle,
    attr: Attribution,
    instances: list[AttributionMethod],
    progress: ProgressFn | None,
    extra_inputs: dict[str, Any] | None,
    foils: dict[int, int] | None = None,
) -> Iterator[Attribution]:
    """Each post-hoc method on the finished sequence: a snapshot after each."""
    ids = attr.prompt_token_ids
    full_ids = torch.tensor([ids + attr.generated_token_ids], dtype=torch.long, device=bundle.device)  # (1, N+K)
    run_inputs = None
    if extra_inputs is not None:
        from .models.vision import full_sequence_inputs

        run_inputs = full_sequence_inputs(extra_inputs, attr.num_steps)
    run = GenerationRun(
        model=bundle.model, input_ids=full_ids, num_prompt_tokens=len(ids), progress=progress, extra_inputs=run_inputs,
        foils=foil_vector(foils, attr.num_steps, full_ids.device), prompt_tokens=list(attr.prompt_tokens),
        user_positions=list(attr.user_positions) or None,
        answer_logprobs=answer_logprobs(attr.step_scores.get("probability", ()), attr.num_steps),
    )  # fmt: skip
    for m in instances:
        if m.streaming:
            continue
        attr.meta["status"] = f"running {m.name}"
        t0 = time.perf_counter()
        raw = m.explain(run)  # (K, N)
        attr.methods[m.name] = MethodScores.from_raw(raw, seconds=time.perf_counter() - t0, meta=m.meta())
        yield attr.snapshot()


def explain(bundle: ModelBundle, prompt: str, **kwargs: Any) -> Attribution:
    """`stream_explain`'s request (the same keywords) run to the end on the caller's thread (`explain_request`);
    returns the final `Attribution`."""
    progress, cancel = kwargs.pop("progress", None), kwargs.pop("cancel", None)
    return explain_request(bundle, ExplainRequest.build(prompt, **kwargs), progress, cancel)
