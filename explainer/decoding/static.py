"""The static decode path: greedy generation over a preallocated `StaticCache` whose per-token work is one
fixed-shape step, captured once as a CUDA graph and replayed on a GPU (issue #33).

Today's loop (`solo.generate_steps`) grows a `DynamicCache`, and every token pays one Python launch per kernel and
a host read for its token and for each streaming method's row: on a GPU a small model's step is launch-bound
(docs/gpu.md). Here every buffer is allocated before the first token, so each decode step has the same shapes and the
same addresses:

- the KV cache holds N + K - 1 positions (`StaticCache`); the model attends over all of them with a mask, and the
  positions come from the cache's own length counter on the device; an image prompt's prefill gets its pixels and
  explicit 3-D (mRoPE) positions (`DecodeJob.extra_inputs`), and decode step k the prompt's last position + k in
  every axis, k read on the device;
- the attention function stashes each layer's last query (one copy per layer); after the pass one product over all
  layers' keys, which the cache keeps in one buffer (`StackedKeys`), gives the float32 probability rows of every layer
  at once into one (L, H, N + K - 1) buffer, keys after the query masked to exactly 0 (MACS's redistribution of Eq. 4
  sums them unchanged): a few kernels a step, where computing each layer's row in its attention took about a dozen
  per layer (on an H200 that put MACS at 0.80-0.90x plain decoding; docs/gpu.md);
- each streaming method's `device_step` writes step k's (N,) row into row k of a (K, N) buffer: MACS's Eqs. 4-7
  (`macs.log_factors`) its float64 log-product, and its layer factors into a (K, L, N) buffer with `keep_layers`;
  Rollout its float32 row, after writing the step's Â rows into its (L, K - 1, N + K - 1) buffer (its prompt rows
  come from the prefill, whose every query row this path hands over as the capture does: `capture.hand_full_rows`);
  the sinks' share sums accumulate in place;
- the token (the argmax, or the forced token of a given answer), its probability, the entropy and the top
  alternatives (`decoding.step.token_stats`, as every path computes them) go to row k of a (K, 3 + 2A) buffer, and
  the token is fed to the next step on the device.

Nothing is read on the host per token: the buffers are read after the prefill and then after 1, 2, 4, ... 32 decode
steps (`MAX_CHUNK`), so a visitor still sees the answer grow. An end-of-sequence token is found when its chunk is read;
the steps computed after it are dropped (a flag on the device keeps them out of the sink shares).

On CUDA (path `cuda-graph`) the step is recorded once and replayed by the decode layer's one graph wrapper
(`graphs.StepGraph`, which the batch's step uses too); where capture fails the model is remembered and the same step
runs eagerly (path `static`, the CPU's form when forced).
Which requests take it is decided by `decoding.choose_path` (paths `static` and `cuda-graph`): streaming methods
that all have a device step (`has_device_step`: MACS, calibrated MACS, Rollout), text and image prompts, models on
one device whose layers all use full attention and that transformers marks as working with a static cache. Each step
reports its path (`Step.decode_path`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence

import torch
from transformers import StaticCache

from ..capture import QueryStash, attention_function_selected, hand_full_rows
from ..methods import AttributionMethod
from ..result.sinks import SinkTracker
from ..runtime.host import to_numpy
from ..runtime.kv import full_row_chunk
from ..runtime.memory import language_config
from ..runtime.scores import float32_products
from ..runtime.session import check_cancelled
from .choice import CUDA_GRAPH, STATIC
from .graphs import StepGraph
from .job import DecodeJob
from .state import DeviceWork
from .step import Step, ends, full_row_consumer, make_step, method_scores, query_stashing_attention, token_stats

MAX_CHUNK = 32  # decode steps between two host reads, at most
_NAME_PREFIX = "explainer_static_"


class StackedKeys:
    """Every layer's keys of a `StaticCache` in one (L, B, KVH, T, D) buffer, so that a step's attention rows of all
    layers come from one product (`capture.stacked_last_rows`). Each layer's own buffer, made when the prefill first
    writes it, is replaced by its view of this one at once: the keys are never held twice. `ready` says whether
    every layer took its view (layers of one shape, dtype and device: every model the static path takes)."""

    def __init__(self, cache: StaticCache) -> None:
        self.layers = list(cache.layers)
        self.buffer: torch.Tensor | None = None
        for i, layer in enumerate(self.layers):
            layer.lazy_initialization = self._initialiser(i, layer, layer.lazy_initialization)

    def _initialiser(self, i: int, layer, initialise):
        def lazy_initialization(key_states: torch.Tensor, value_states: torch.Tensor) -> None:
            initialise(key_states, value_states)
            del layer.lazy_initialization  # the class's own again
            keys = layer.keys  # (B, KVH, T, D)
            if self.buffer is None:
                self.buffer = keys.new_zeros((len(self.layers), *keys.shape))  # (L, B, KVH, T, D)
            buffer = self.buffer
            if (buffer.shape[1:], buffer.dtype, buffer.device) == (keys.shape, keys.dtype, keys.device):
                layer.keys = self.buffer[i]

        return lazy_initialization

    @property
    def ready(self) -> bool:
        return self.buffer is not None and all(
            la.keys is not None and la.keys.data_ptr() == self.buffer[i].data_ptr() for i, la in enumerate(self.layers)
        )


class StaticDecoder:
    """One request's preallocated buffers and its fixed-shape step (see the module docstring)."""

    def __init__(
        self, model: torch.nn.Module, job: DecodeJob, sinks: SinkTracker | None = None, graphs: bool = False
    ) -> None:
        """The job's streaming methods all have a device step (`decoding.choose_path` checked) and have had `begin`;
        K = `job.num_steps`."""
        input_ids, steps = job.input_ids, job.num_steps
        device, text = input_ids.device, language_config(model)
        self.model, self.n, self.steps = model, input_ids.shape[1], steps
        self.methods = [m for m in job.methods if m.streaming]  # each with `has_device_step`
        self.consumer = full_row_consumer(self.methods)  # the prefill's full rows, for `needs_full_rows` (Rollout)
        self.graph, self.path = StepGraph(model, graphs, "decoding without graphs"), CUDA_GRAPH if graphs else STATIC
        self.cache = StaticCache(config=model.config, max_cache_len=self.n + steps - 1)
        self.job = job
        self.prefill_inputs = dict(job.extra_inputs or {})  # an image prompt's pixels, grid and 3-D positions
        # k, the step the next pass explains, each method's layer buffer, the sink shares summed in place
        layers, tracker = text.num_hidden_layers, sinks if self.methods else None
        self.work = DeviceWork(self.methods, self.n, steps, layers, device, tracker)
        self.k = self.work.k  # (1,)
        self.token_in = torch.zeros((1, 1), dtype=input_ids.dtype, device=device)  # the next pass's input id
        forced = [job.forced_at(k) for k in range(steps)]  # -1: the argmax
        self.forced = torch.tensor(forced, dtype=torch.long, device=device)  # (K,)
        self.eos = torch.tensor(sorted(job.stop_ids), dtype=torch.long, device=device)  # (E,) none for a given answer
        self.alive = torch.ones(1, dtype=torch.bool, device=device)  # (1,) no end-of-sequence token yet
        self.stats: torch.Tensor | None = None  # (K, 3 + 2A) float64, made at the prefill (A from the logits)
        self.rows = self.sinks = None
        self.outs: list[torch.Tensor | None] = [None] * len(self.methods)  # (K, N) each, made at the prefill
        if self.methods:
            total = self.n + steps - 1
            self.rows = torch.zeros((text.num_hidden_layers, text.num_attention_heads, total), device=device)
            # Each layer stashes its last query; the step's rows of all layers come after the pass, from one product.
            self.keys = StackedKeys(self.cache)
            self.queries = QueryStash(text.num_hidden_layers)
            self.key_index = torch.arange(total, device=device)  # (T,)
            self.float32_out: bool | None = None  # asked at the prefill (`runtime.scores.float32_products`)
            self.sinks = sinks

    # --- the device work --------------------------------------------------------------------------------------
    def _prefill_rows(self, module, query, key, attention_mask, scale) -> None:
        """Beside the stash (`step.query_stashing_attention`): the products' precision, asked at the prefill's
        first layer, and the prefill's full rows for `needs_full_rows` (Rollout)."""
        if self.float32_out is None:  # the prefill's first layer
            self.float32_out = float32_products(query.device, query.dtype)
        if self.consumer is not None and query.shape[2] > 1:  # the prefill, from an empty cache: query 0 is key 0
            chunk = full_row_chunk(self.n, query.device.type)
            hand_full_rows(self.consumer, chunk, module.layer_idx, query, key, attention_mask, scale, 0)

    def _step_rows(self) -> None:
        """The rows buffer from the pass's stashed queries: each layer's float32 softmax row of its last query, the
        keys after it exactly 0 (the query at position N - 1 + k sees the keys up to it). One product for all layers
        (`capture.QueryStash.write_rows`), or one per layer where the keys are not stacked or the layers' shapes or
        temperatures differ."""
        visible = self.key_index[None] <= self.k + (self.n - 1)  # (1, T)
        keys, stacked = [la.keys for la in self.cache.layers], self.keys.buffer if self.keys.ready else None
        self.queries.write_rows(self.rows[:, None], keys, stacked, visible, self.float32_out)

    def capturing(self) -> contextlib.AbstractContextManager:
        """The block within which forward passes write the rows buffer (nothing without a streaming method)."""
        if self.rows is None:
            return contextlib.nullcontext()
        attention = query_stashing_attention("the static decode path", self.queries, self._prefill_rows)
        return attention_function_selected(self.model, _NAME_PREFIX, attention)

    def _forward(self, ids: torch.Tensor, inputs: dict) -> torch.Tensor:
        out = self.model(input_ids=ids, past_key_values=self.cache, use_cache=True, logits_to_keep=1, **inputs)
        return out.logits[0, -1]  # (V,)

    def _write_step(self, logits: torch.Tensor, prefill: bool) -> None:
        """Row k of every buffer from this pass, the token fed to the next one, then k += 1; no host read."""
        token, stats = token_stats(logits, self.forced.index_select(0, self.k))  # (1,), (3 + 2A,)
        if self.stats is None:
            self.stats = torch.zeros((self.steps, stats.shape[0]), dtype=torch.float64, device=stats.device)
        self.stats.index_copy_(0, self.k, stats[None])
        if self.rows is not None:
            self._step_rows()
            self._write_rows(prefill)
        self.token_in.copy_(token.view(1, 1))
        self.alive.logical_and_(~(token[:, None] == self.eos).any(dim=-1))  # (1,)
        self.work.advance()

    def _write_rows(self, prefill: bool) -> None:
        for i, row in enumerate(self.work.scores(self.rows)):  # (N,) each
            if self.outs[i] is None:  # the prefill: the buffer takes the row's dtype
                self.outs[i] = torch.zeros((self.steps, *row.shape), dtype=row.dtype, device=row.device)  # (K, N)
            self.outs[i].index_copy_(0, self.k, row[None])
        if self.sinks is None:
            return
        if prefill:
            self.sinks.add(self.rows)
            return
        self.work.gather_sinks(self.rows, self.alive)  # none after an end-of-sequence

    def prefill(self, input_ids: torch.Tensor) -> None:
        """The prompt's pass (eager: its length is the prompt's), which also explains step 0."""
        probe = self.sinks.probing_norms(self.model) if self.sinks is not None else contextlib.nullcontext()
        with self.capturing(), probe:
            self._write_step(self._forward(input_ids, self.prefill_inputs), prefill=True)

    def step(self) -> None:
        """One decode step: the fixed-shape work that a CUDA graph records."""
        # Explicit positions (Qwen's mRoPE) continue from the prompt's last in every axis, from k on the device.
        self._write_step(self._forward(self.token_in, self.job.step_positions(self.k)), prefill=False)

    def decode(self, count: int) -> None:
        """`count` more decode steps on the device; the first call on a graph path records the graph."""
        graph = self.graph
        if count > 0 and graph.enabled and graph.graph is None:
            with self.capturing():
                graph.record(self.k.device, self.step, self.step)  # runs one real step
            self.path = CUDA_GRAPH if graph.enabled else STATIC
            count -= 1
        with contextlib.nullcontext() if graph.graph is not None else self.capturing():
            for _ in range(count):
                check_cancelled()
                if not graph.replay():
                    self.step()

    # --- the host reads ---------------------------------------------------------------------------------------
    def read(self, start: int, stop: int, seconds: float, method_seconds: dict[str, float] | None) -> Iterator[Step]:
        """The steps start .. stop - 1, read from the device once per buffer; each method's row is finished
        (`finish_step`) only when its step is taken."""
        stats = to_numpy(self.stats[start:stop])  # (k, 3 + 2A) float64
        outs = {m.name: to_numpy(x[start:stop]) for m, x in zip(self.methods, self.outs)}  # each (k, N)
        for j in range(stop - start):
            scores = method_scores(self.methods, lambda m, j=j: m.finish_step(outs[m.name][j]), method_seconds)
            yield make_step(start + j, stats[j], scores, seconds / (stop - start), self.path)

    def finish(self, steps_taken: int) -> None:
        """Hand the decode steps' sink shares to the tracker (steps after an end-of-sequence token hold nothing)."""
        self.work.finish(steps_taken)


def static_steps(
    model: torch.nn.Module,
    job: DecodeJob,
    streaming: Sequence[AttributionMethod],
    sinks: SinkTracker | None = None,
    method_seconds: dict[str, float] | None = None,
    graphs: bool = False,
) -> Iterator[Step]:
    """What `solo.solo_steps` yields, from the static step; the `streaming` methods (each with a device step,
    see `decoding.choose_path`) have had `begin`. `graphs`: replayed as a CUDA graph (path `cuda-graph`), else
    eagerly (`static`)."""
    decoder = StaticDecoder(model, job, sinks, graphs)
    check_cancelled()
    t0 = time.perf_counter()
    decoder.prefill(job.input_ids)
    done = taken = 1  # steps computed on the device; steps yielded
    stopped = False
    for step in decoder.read(0, 1, time.perf_counter() - t0, method_seconds):
        yield step
        stopped = ends(1, step.token_id, job.num_steps, job.stop_ids)
    while not stopped:
        t0 = time.perf_counter()
        stop = min(job.num_steps, done + min(done, MAX_CHUNK))
        decoder.decode(stop - done)
        seconds = time.perf_counter() - t0
        for step in decoder.read(done, stop, seconds, method_seconds):
            yield step
            taken += 1
            stopped = ends(taken, step.token_id, job.num_steps, job.stop_ids)
            if stopped:
                break
        done = stop
    decoder.finish(taken)
