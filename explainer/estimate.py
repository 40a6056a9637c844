"""How long the slower attribution methods will take on a prompt, before they run: a cost model times a speed.

Each method states its own cost model (`AttributionMethod.cost`, in its file), counted in token positions that pass
through the model (N prompt tokens, K answer tokens, T = N + K; the last answer token predicts nothing that is scored,
so teacher-forced passes cover T - 1 positions):

- MACS, Rollout: nothing beyond the generation itself (they read the attention rows of its forward passes).
- random: nothing (no model call).
- AtMan, fast path (`methods/atman_cost.py`): one unperturbed forward over T - 1 positions, then one
  forward per group of distinct suppression rows, each row recomputing the suffix from its first suppressed position
  to T - 1; rows are grouped as AtMan groups them (sorted by first position, about `kv.TOKENS_PER_BATCH` positions
  and at most `batch_size` rows a pass, each pass with one more, unperturbed row: the baseline); rows that suppress
  nothing (`suppression_factor=1`) are not run. A row is one distinct input embedding (all occurrences of a token
  share one); its first suppressed position is the earliest occurrence of that token or, with correlated suppression, of
  any token whose embedding is at least `cosine_threshold` similar. Given the prompt's input embeddings (methods with
  `needs_prompt_embeddings` get them) this is AtMan's own count; from token ids alone similar tokens are not seen, so
  the count is a lower bound (on the embedded model's example prompts about a third of the rows start ~12 positions
  earlier than their own first occurrence).
- AtMan, naive path (`fast=False`): N + 1 forwards over T positions.
- Input x Gradient, AttnLRP (`methods/cost.py`, `gradient_cost`): one forward over T - 1 positions that keeps its
  graph, then K backward passes through every decoder layer over those positions.
- Grad-ELLM: the same forward, and K backward passes through the last L = min(`layers`, depth) decoder layers only.
- A method without a cost model of its own: nothing if it streams, else unknown ("no estimate"; the others still
  get theirs).

Seconds = forward positions / forward speed + backward positions x (layers reached / depth) / backward speed. The
speeds are measured on the process's own model: first by a short probe (a forward over a batch of
~`kv.TOKENS_PER_BATCH` positions as AtMan runs them, a backward over one `PROBE_TOKENS`-position sequence as the
gradient methods run them, each after a warm-up), cached per model; then, once a method has run, the ratio of its
measured time to the estimate for that run corrects every later estimate of that method. The model is rough: it
ignores that attention cost grows with sequence length, that AtMan's suffix passes also attend to a cached prefix,
and the extra cost of recording a graph. How far the probe-only figure is off has not been measured systematically:
treat it as the order of magnitude ("about 40 s"), not a deadline. The correction from a method's run makes a rerun
of the same request exact and is a better guess for prompts of similar length.

The generation's own forward time (`attr.meta["forward_seconds"]`) is not used as a speed: it is dominated by
one-token decode steps, whose cost per position is many times that of a pass over a whole sequence.
"""

from __future__ import annotations

import dataclasses
import math
import os
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .errors import Cancelled, InputError
from .methods import METHODS, method_class, method_config, method_options
from .methods.cost import Cost, CostRequest
from .methods.gradients import gradients_enabled
from .models.loading import ModelBundle
from .result.attribution import Attribution
from .runtime.kv import TOKENS_PER_BATCH, batch_budget
from .runtime.memory import language_config
from .runtime.session import CancelToken, hold

PROBE_TOKENS = 128  # positions of the speed probe's sequence (fewer if the model's context is shorter)
PROBE_WAIT = 0.5  # seconds the probe waits for a busy model before giving up (the caller shows no figure yet)
CORRECTION_BOUNDS = (0.05, 20.0)  # a measured/estimated ratio outside these is clamped (a stalled run, a tiny one)


def method_cost(
    method: str,
    prompt_ids: Sequence[int],
    num_new_tokens: int,
    options: dict[str, Any] | None = None,
    *,
    num_layers: int | None = None,
    embeddings: torch.Tensor | None = None,
    batch: tuple[int, int] | None = None,
) -> Cost:
    """The work a registered method does on a finished generation.

    Args:
        method: registered method name.
        prompt_ids: the N prompt token ids (chat template included).
        num_new_tokens: K.
        options: the method's options, validated as `explain` validates them.
        num_layers: the model's decoder depth (caps Grad-ELLM's `layers`).
        embeddings: (N, d) the prompt's input embeddings, for methods with `needs_prompt_embeddings` (AtMan's count
            is exact with them, a lower bound without).
        batch: (positions, rows) per batched pass on the model's device (`kv.batch_budget` with no row cap);
            None: a CPU's.

    Returns:
        The method's own `cost`; `Cost.known` is False for a method without a cost model.

    Raises:
        UnknownMethodError: not a registered method. InputError: bad options.
    """
    config = method_config(method, **(options or {}))  # checks the name too
    tokens, rows = batch or (TOKENS_PER_BATCH, 0)
    request = CostRequest(list(prompt_ids), int(num_new_tokens), num_layers, embeddings, tokens, rows)
    return method_class(method).cost(request, config)


@dataclass
class Speed:
    """Measured speed of one model in this process.

    Attributes:
        forward_tokens_per_s: positions per second of a forward pass over one sequence (inference mode).
        backward_tokens_per_s: positions per second of a backward pass through every layer over one sequence.
        corrections: method -> measured seconds / estimated seconds of its last run on this model.
    """

    forward_tokens_per_s: float
    backward_tokens_per_s: float
    corrections: dict[str, float] = field(default_factory=dict)

    def seconds(self, cost: Cost, num_layers: int | None = None, method: str | None = None) -> float:
        """Estimated seconds of `cost`, with `method`'s correction when it has one."""
        depth = 1.0
        if cost.backward_layers is not None and num_layers:
            depth = min(cost.backward_layers, num_layers) / num_layers
        raw = cost.forward_tokens / self.forward_tokens_per_s
        raw += cost.backward_tokens * depth / self.backward_tokens_per_s
        return raw * self.corrections.get(method, 1.0) if method else raw


# Where the model must not run outside a request (ZeroGPU): a GPU's rough speed for a ~1.5B model in bf16, corrected
# per method by its first measured run.
ASSUMED_SPEED = Speed(forward_tokens_per_s=20_000.0, backward_tokens_per_s=4_000.0)

_speeds: weakref.WeakKeyDictionary[Any, Speed] = weakref.WeakKeyDictionary()
_speeds_guard = threading.Lock()


def _new_guard() -> None:
    global _speeds_guard
    _speeds_guard = threading.Lock()


# ZeroGPU forks its GPU worker from the main process, whose other threads ask for estimates meanwhile: a guard held
# by one of them at the fork would stay held in the worker for good.
os.register_at_fork(after_in_child=_new_guard)


def _num_layers(model: Any) -> int | None:
    return getattr(language_config(model), "num_hidden_layers", None)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def probe_speed(bundle: ModelBundle, tokens: int = PROBE_TOKENS) -> Speed:
    """Time a forward and a backward pass (each after a warm-up) shaped like the methods' own; the caller holds the
    model, which is left as it was (parameters' `requires_grad` restored by `gradients_enabled`).

    The forward runs a batch of ~`kv.TOKENS_PER_BATCH` positions in `tokens`-position rows, as AtMan's passes do
    (most of its work); the backward runs over one `tokens`-position sequence, as the gradient methods' passes do.
    """
    model, device = bundle.model, bundle.device
    context = bundle.context_length or tokens
    p = max(2, min(tokens, context))
    batch = max(1, TOKENS_PER_BATCH // p)
    vocab = model.get_input_embeddings().num_embeddings
    ids = (torch.arange(p, device=device) * 7919 % vocab)[None, :]  # (1, P): varied ids, no tokenizer needed
    with torch.inference_mode():
        model(input_ids=ids, use_cache=False, logits_to_keep=1)  # warm-up: first-call allocations
        _synchronize(device)
        t0 = time.perf_counter()
        model(input_ids=ids.expand(batch, -1), use_cache=False, logits_to_keep=1)  # (B, P)
        _synchronize(device)
        forward = time.perf_counter() - t0
    with gradients_enabled(model):
        ids = ids.clone()  # an ordinary tensor, not an inference one
        with torch.no_grad():
            embeds = model.get_input_embeddings()(ids)  # (1, P, d)
        embeds = embeds.detach().requires_grad_(True)
        logits = model(inputs_embeds=embeds, use_cache=False, logits_to_keep=2).logits[0, :, 0]  # (2,)
        torch.autograd.grad(logits[0], [embeds], retain_graph=True)  # warm-up: the first backward sets autograd up
        _synchronize(device)
        t0 = time.perf_counter()
        torch.autograd.grad(logits[1], [embeds])
        _synchronize(device)
        backward = time.perf_counter() - t0
    return Speed(forward_tokens_per_s=batch * p / max(forward, 1e-6), backward_tokens_per_s=p / max(backward, 1e-6))


def speed(bundle: ModelBundle, wait: float | None = PROBE_WAIT, probe: bool = True) -> Speed | None:
    """The model's cached speed, probing it on first use (`probe_speed`).

    Args:
        bundle: the loaded model.
        wait: seconds to wait for the model if another request holds it; None waits as long as it takes.
        probe: False: never run the model here (ZeroGPU, where it runs only inside GPU calls): `ASSUMED_SPEED`
            until a method's run has corrected it (`calibrate`).

    Returns:
        The speed, or None if the model stayed busy for `wait` seconds (nothing is cached then; ask again later).
    """
    with _speeds_guard:
        known = _speeds.get(bundle.model)
    if known is not None:
        return known
    if not probe:
        with _speeds_guard:
            return _speeds.setdefault(bundle.model, dataclasses.replace(ASSUMED_SPEED, corrections={}))
    token = CancelToken()
    timer = threading.Timer(wait, token.cancel, ("busy",)) if wait is not None else None
    if timer is not None:
        timer.start()
    try:
        with hold(bundle.model, token):
            if timer is not None:
                timer.cancel()  # holding the model now: let the probe finish
            measured = probe_speed(bundle)
    except Cancelled:
        return None
    finally:
        if timer is not None:
            timer.cancel()
    with _speeds_guard:
        return _speeds.setdefault(bundle.model, measured)


def post_hoc_seconds(
    bundle: ModelBundle, attr: Attribution, methods: Sequence[str], options: dict[str, Any] | None = None
) -> float | None:
    """Estimated seconds of the post-hoc `methods` on a finished generation, at the speed already measured on this
    model (never probes, never waits): the request's place in the model's queue (`runtime/turns.py`). None when no
    speed is known yet or a method has no cost model."""
    with _speeds_guard:
        known = _speeds.get(bundle.model)
    ids, k = attr.prompt_token_ids, attr.num_steps
    num_layers = _num_layers(bundle.model)
    batch = batch_budget(bundle.model, len(ids) + k, k, 0, 0)
    total = 0.0
    for m in methods:
        if m not in METHODS:  # an instance of the caller's own class: no cost model
            return None
        seconds = cost_seconds(method_cost(m, ids, k, (options or {}).get(m), num_layers=num_layers, batch=batch),
                               known, num_layers, m)  # fmt: skip
        if seconds is None:
            return None
        total += seconds
    return total


def forget_speed(bundle: ModelBundle) -> None:
    """Drop the cached speed and corrections of a model (the next `speed` probes again)."""
    with _speeds_guard:
        _speeds.pop(bundle.model, None)


def _embeddings(bundle: ModelBundle, ids: Sequence[int]) -> torch.Tensor:
    """(N, d) input embeddings of `ids`: a table lookup, no forward pass."""
    with torch.inference_mode():
        table = bundle.model.get_input_embeddings()
        return table(torch.tensor(list(ids), dtype=torch.long, device=bundle.device))  # offloaded weight: on meta


def _need_embeddings(methods: Sequence[str]) -> bool:
    return any(method_class(m).needs_prompt_embeddings for m in methods)


def _known_options(method: str, meta: dict[str, Any]) -> dict[str, Any]:
    names = {o.name for o in method_options(method)}
    return {k: v for k, v in meta.items() if k in names}


def calibrate(bundle: ModelBundle, attr: Attribution | None) -> list[str]:
    """Learn each method's correction from a finished text result of this model: measured / estimated seconds.

    Only post-hoc methods that ran the model are used; image results (whose image tokens this cost model does not
    count), results of another model and results opened from a file (`Attribution.opened`) are ignored. Does nothing
    before the model's speed is known.

    Returns:
        The methods whose correction was updated.
    """
    if attr is None or attr.opened or attr.image is not None or attr.model != bundle.name or not attr.num_steps:
        return []  # an opened file's timings were measured where it was made
    if attr.meta.get("status") not in (None, "done"):
        return []
    with _speeds_guard:
        known = _speeds.get(bundle.model)
    if known is None:
        return []
    num_layers = _num_layers(bundle.model)
    ran = [m for m, scores in attr.methods.items() if m in METHODS and scores.seconds > 0]
    embeddings = _embeddings(bundle, attr.prompt_token_ids) if _need_embeddings(ran) else None
    updated = {}
    for method in ran:
        scores = attr.methods[method]
        try:
            cost = method_cost(
                method, attr.prompt_token_ids, attr.num_steps, _known_options(method, scores.meta),
                num_layers=num_layers, embeddings=embeddings,
            )  # fmt: skip
        except InputError:
            continue
        if cost.free or not cost.known:
            continue
        predicted = known.seconds(cost, num_layers)
        if predicted > 0:
            updated[method] = min(max(scores.seconds / predicted, CORRECTION_BOUNDS[0]), CORRECTION_BOUNDS[1])
    with _speeds_guard:
        known.corrections.update(updated)
    return list(updated)


@dataclass(frozen=True)
class Estimate:
    """The estimated time of one method on one request.

    Attributes:
        method: registered method name.
        cost: its work (see `Cost`).
        seconds: estimated wall time beyond the generation, or None while the model's speed is unknown or the
            method has no cost model (`cost.known` False).
        corrected: whether a measured run of this method on this model corrected the figure.
        prompt_tokens: N, the prompt's tokens as the model sees them (chat template included).
    """

    method: str
    cost: Cost
    seconds: float | None
    corrected: bool = False
    prompt_tokens: int = 0

    @property
    def label(self) -> str:
        """The method's name for people (`AttributionMethod.display_name`), e.g. "AtMan"."""
        return method_class(self.method).display_name

    def describe(self) -> str:
        """e.g. "about 40 s", "under a second", "not measured yet", "none" (no extra work), "no estimate"."""
        if self.cost.free:
            return "none"
        if not self.cost.known:
            return "no estimate"
        return "not measured yet" if self.seconds is None else format_seconds(self.seconds)


def answer_steps(bundle: ModelBundle, answer: str | None, max_new_tokens: int) -> int:
    """K, the answer tokens a request explains: a given `answer`'s number of tokens (tokenised on its own: within a
    token or two of `explain`'s count), else `max_new_tokens` (an answer that ends earlier has fewer)."""
    if isinstance(answer, str) and answer.strip():
        return max(1, len(bundle.tokenizer(answer, add_special_tokens=False)["input_ids"]))
    return max_new_tokens


def estimate(
    bundle: ModelBundle,
    prompt: str,
    methods: Sequence[str] | None = None,
    max_new_tokens: int = 64,
    chat_template: bool = True,
    method_options: dict[str, dict[str, Any]] | None = None,
    wait: float | None = PROBE_WAIT,
    answer: str | None = None,
    probe: bool = True,
) -> list[Estimate]:
    """Estimated extra time of each method on this prompt, taking K = `max_new_tokens` (an answer that ends earlier
    costs less), or, with a given `answer`, K = its number of tokens. Tokenises the prompt (and answer) and looks up
    the prompt's embeddings; runs the model only for the first speed probe.

    Args:
        bundle: the loaded model.
        prompt: the user's text, as `explain` gets it.
        methods: registered names; None: every registered method.
        max_new_tokens: K.
        chat_template: as `explain`.
        method_options: per-method options, as `explain` takes them.
        wait: how long the first speed probe may wait for a busy model (see `speed`).
        answer: a given answer (teacher-forced by `explain`); empty or None: generation up to `max_new_tokens`.
        probe: False: never run the model (see `speed`).

    Raises:
        InputError: empty or too long prompt, bad options. UnknownMethodError: unknown method.
    """
    max_new_tokens = answer_steps(bundle, answer, max_new_tokens)
    encoded = bundle.encode(prompt, chat_template=chat_template, max_new_tokens=max_new_tokens)
    ids = encoded.input_ids[0].tolist()
    names = list(METHODS) if methods is None else list(methods)
    options = method_options or {}
    num_layers = _num_layers(bundle.model)
    embeddings = _embeddings(bundle, ids) if _need_embeddings(names) else None
    batch = batch_budget(bundle.model, len(ids) + max_new_tokens, max_new_tokens, 0, 0)  # rows 0 on a CPU
    costs = {
        m: method_cost(m, ids, max_new_tokens, options.get(m), num_layers=num_layers, embeddings=embeddings,
                       batch=batch)
        for m in names
    }  # fmt: skip
    known = speed(bundle, wait, probe) if any(c.known and not c.free for c in costs.values()) else None
    out = []
    for m, cost in costs.items():
        seconds = cost_seconds(cost, known, num_layers, m)
        out.append(Estimate(m, cost, seconds, known is not None and m in known.corrections, len(ids)))
    return out


def cost_seconds(cost: Cost, known: Speed | None, num_layers: int | None, method: str) -> float | None:
    """A method's estimated seconds: 0 when it costs nothing beyond the generation, None without a cost model or a
    speed, else `Speed.seconds`."""
    if cost.free:
        return 0.0
    if not cost.known or known is None:
        return None
    return known.seconds(cost, num_layers, method)


def seconds_at(positions: int, positions_per_second: float | None) -> float | None:
    """The time of work over `positions` token positions at a measured speed (e.g. pi-Soft's cost at the speed the
    removal curves ran at); None while no speed is known."""
    return positions / positions_per_second if positions_per_second else None


def format_seconds(seconds: float) -> str:
    """A rough duration with no false precision: "under a second", "about 4 s", "about 40 s", "about 3 min"."""
    if not math.isfinite(seconds):
        return "unknown"
    if seconds < 1:
        return "under a second"
    if seconds < 10:
        return f"about {round(seconds)} s"
    if seconds < 60:
        return f"about {5 * round(seconds / 5)} s"
    minutes = seconds / 60
    if minutes < 10:
        return f"about {round(minutes * 2) / 2:g} min"
    if minutes < 90:
        return f"about {5 * round(minutes / 5)} min"
    return f"about {round(minutes / 60, 1):g} h"
