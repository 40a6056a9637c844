"""Token removal curves: MIF / LIF / SRG (MACS paper, Appendix A.2).

Prompt tokens are ranked by the method's score averaged over steps (the mean of the per-step z-scores over the
evaluated positions; a single map repeated over steps, as AtMan-style methods give, is thereby used as is). For each
fraction F of the evaluated tokens, the first tokens of the ranking are removed by attention masking: a 2D attention
mask with zeros at their positions, so no query attends to them, with explicit `position_ids = arange` so no other
token's position moves. Per run we measure:

- `logit`: mean logit of the original tokens, teacher-forced on the original generation (higher is better);
- `ppl`: perplexity of the original generation, teacher-forced (it rises when evidence goes: SRG more negative is
  better);
- `rougeL`, `bleu`: ROUGE-L F1 and BLEU of the greedy regeneration against the original answer (higher is better).

Each value is divided by the unperturbed run's value, integrated with the trapezoid rule over F and divided by
max(F); SRG = AUC_LIF - AUC_MIF. The random baseline uses two independent random orderings in place of MIF and LIF.

How it is computed (equal to running each removal on its own, up to float rounding;
`tests/explainer/faithfulness/test_faithfulness.py` checks it against a plain loop):

1. One unperturbed pass over prompt + answer gives the baseline values and a KV cache of every position.
2. Each perturbed run recomputes only the positions from its first removed token on, reusing that cache before it;
   runs are sorted by that position and batched, so a batch shares a long prefix. Prompt and teacher-forced answer
   go through in one forward, which yields the logits of every answer position at once.
3. Greedy regeneration follows the original answer for as long as the teacher-forced argmax equals it, so a run's
   regeneration is only decoded from the first position where it departs; runs that never depart cost nothing more.
   The departing runs are decoded together, their caches cut at the departure point and right-aligned.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from transformers import DynamicCache

from ..errors import InputError
from ..methods.base import ProgressFn
from ..models.loading import ModelBundle
from ..result.attribution import Attribution
from ..runtime.host import to_numpy
from ..runtime.kv import batch_budget, prefix_cache, right_aligned, rows_per_batch
from ..runtime.session import between_passes, hold
from .common import (
    RANDOM,
    check_result,
    decode,
    evaluated_positions,
    removal_orderings,
)
from .metrics import REMOVAL_FRACTIONS, REMOVAL_METRIC_KEYS, bleu, normalised_auc, rouge_l_f1, srg

CPU_ROWS = 16  # perturbed runs per forward on a CPU


@dataclass(frozen=True)
class RemovalConfig:
    fractions: tuple[float, ...] = REMOVAL_FRACTIONS  # MACS paper A.2.1; the first must be 0 (the baseline run)
    max_new_tokens: int | None = None  # regeneration length; None: the original run's limit (attr.meta)
    batch_size: int = 0  # most perturbed runs per forward (fewer when long); 0: from the device (CPU: 16)
    decode_batch_size: int = 32  # most regenerations decoded together
    seed: int = 0  # the random baseline's two orderings


@dataclass
class RemovalReport:
    """MIF / LIF curves of every method.

    Attributes:
        fractions: the removed fractions F.
        curves: method -> metric -> {"mif": [c(F)...], "lif": [...]}, normalised by the unperturbed value.
        auc: method -> metric -> {"mif": AUC, "lif": AUC, "srg": AUC_LIF - AUC_MIF}.
        generations: method -> {"mif": [text per F], "lif": [...]}, the regenerated answers.
        runs: number of distinct perturbed runs (equal removed sets run once).
        tokens_per_second: positions the prompt-and-answer passes recomputed per second (a speed estimate for
            similar work, e.g. pi-Soft's cost before it starts).
    """

    fractions: list[float]
    curves: dict[str, dict[str, dict[str, list[float]]]] = field(default_factory=dict)
    auc: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    generations: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    runs: int = 0
    tokens_per_second: float = 0.0


@dataclass
class ImageSequence:
    """An image prompt's sequence as the removal passes feed it: the decoder's input embeddings (merged patch features
    at the image positions, computed once) and Qwen-VL's explicit 3D mRoPE positions, so masking a token moves no
    other token's position, exactly as for text.

    Attributes:
        embeds: (1, T, d) over prompt + answer (T = N + K - 1 is used).
        positions: (3, 1, N + K) position ids of prompt + answer; decoding continues from the last prompt position.
    """

    embeds: torch.Tensor
    positions: torch.Tensor

    def decode_positions(self, n: int, indices: list[int]) -> torch.Tensor:
        """(3, B, 1) positions of sequence indices >= N - 1 (text after the prompt advances all three axes)."""
        last = self.positions[:, 0, n - 1]  # (3,)
        offsets = torch.tensor(indices, dtype=last.dtype, device=last.device) - (n - 1)  # (B,)
        return (last[:, None] + offsets[None, :])[..., None]  # (3, B, 1)


def _pass_inputs(seq: torch.Tensor, image: ImageSequence | None, start: int, b: int) -> dict[str, torch.Tensor]:
    """Keyword inputs of a forward over positions [start, T) of `seq` (T,), repeated `b` times, with explicit
    positions: `arange` for text, the 3D mRoPE positions for an image prompt."""
    t = seq.shape[0]
    if image is None:
        positions = torch.arange(start, t, device=seq.device).expand(b, -1)  # (B, T - start)
        return {"input_ids": seq[start:].expand(b, -1), "position_ids": positions}
    pos = image.positions[..., start:t]  # (3, 1, T - start)
    return {"inputs_embeds": image.embeds[:, start:t].expand(b, -1, -1), "position_ids": pos.expand(-1, b, -1)}


@dataclass
class _Departure:
    """A run whose greedy regeneration leaves the original answer: decoded from `tokens[-1]` on."""

    run: int
    tokens: list[int]  # the regeneration so far; the last one is the next input
    cache: DynamicCache
    row: int  # row of `cache`
    length: int  # valid cached positions of that row (prompt + the answer tokens it shares)


def _cross_entropy_stats(logits: torch.Tensor, gen: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """(R, K, V) logits predicting `gen` (K,) -> mean target logit (R,), perplexity (R,)."""
    logits = logits.float()
    gen = gen.to(logits.device)  # the logits come from the last layer's device under a device map
    target = logits.gather(-1, gen.expand(logits.shape[0], -1)[..., None])[..., 0]  # (R, K)
    ce = torch.logsumexp(logits, dim=-1) - target
    return to_numpy(target.mean(dim=1)), to_numpy(torch.exp(ce.mean(dim=1)))


@torch.inference_mode()
def removal_runs(
    model: torch.nn.Module,
    prompt: torch.Tensor,
    gen: torch.Tensor,
    keep: torch.Tensor,
    max_new_tokens: int,
    eos: set[int],
    batch_size: int = 0,
    decode_batch_size: int = 32,
    progress: ProgressFn | None = None,
    image: ImageSequence | None = None,
) -> tuple[np.ndarray, np.ndarray, list[list[int]], float]:
    """Teacher-forced mean logit and perplexity of `gen`, and the greedy regeneration, after each masked prompt.

    Args:
        prompt: (N,) ids. gen: (K,) the original answer. keep: (R, N) bool, False = removed.
        max_new_tokens: regeneration length bound; eos: ids that end a regeneration (included in it).
        image: for an image prompt, its embeddings and 3D positions (`image_sequence`); masked image tokens are
            hidden from every query like text tokens.

    Returns:
        mean logits (R,), perplexities (R,), R token lists, and positions per second of the batched passes.
    """
    n, k, r = prompt.shape[0], gen.shape[0], keep.shape[0]
    seq = torch.cat([prompt, gen[:-1]])  # (T,) T = N + K - 1: every position whose logits predict an answer token
    removed = ~keep
    first = torch.where(removed.any(dim=1), removed.float().argmax(dim=1), n).tolist()  # (R,) first removed position
    base = DynamicCache()  # no config: every layer keeps all positions (sliding windows are applied by the mask)
    out = model(**_pass_inputs(seq, image, 0, 1), past_key_values=base, use_cache=True, logits_to_keep=k)
    runs = _Runs(gen, n, max(1, max_new_tokens), eos, base, r)
    unperturbed = [i for i in range(r) if first[i] >= n]
    if unperturbed:
        runs.settle(unperturbed, out.logits.expand(len(unperturbed), -1, -1), None)  # (1, K, V) for each
    del out
    perturbed = sorted((i for i in range(r) if first[i] < n), key=lambda i: first[i])
    size = rows_per_batch(seq.shape[0] - (min(first) if perturbed else 0),
                          *batch_budget(model, seq.shape[0], k, batch_size, CPU_ROWS))  # fmt: skip
    groups = [perturbed[s : s + size] for s in range(0, len(perturbed), size)]
    speed = _perturbed_passes(model, runs, seq, keep, first, groups, progress, image)
    if progress:
        progress(1 - 1 / (len(groups) + 2), f"removal: {len(runs.departures)} regenerations depart from the answer")
    _decode_departures(model, runs.departures, keep, n, runs.limit, eos, decode_batch_size, runs.regenerated, image)
    return runs.logit, runs.ppl, runs.regenerated, speed


class _Runs:
    """The removal runs' results as their teacher-forced logits arrive: mean logit and perplexity of the answer,
    and either a finished regeneration or the point where it departs from the answer (decoded later)."""

    def __init__(self, gen: torch.Tensor, n: int, limit: int, eos: set[int], base: DynamicCache, r: int) -> None:
        self.gen, self.n, self.limit, self.eos, self.base = gen, n, limit, eos, base
        self.logit, self.ppl = np.zeros(r), np.zeros(r)
        self.regenerated: list[list[int]] = [[] for _ in range(r)]
        self.departures: list[_Departure] = []

    def settle(self, runs: list[int], logits: torch.Tensor, cache: DynamicCache | None) -> None:
        """Metrics and regeneration state of `runs` from their teacher-forced logits (B, K, V)."""
        gen, k, limit = self.gen, self.gen.shape[0], self.limit
        self.logit[runs], self.ppl[runs] = _cross_entropy_stats(logits, gen)
        follows = logits.argmax(dim=-1) == gen.to(logits.device)  # (B, K)
        for i, run in enumerate(runs):
            stop = min(k, limit)
            departs = (~follows[i, :stop]).nonzero()
            d = int(departs[0]) if departs.numel() else stop  # answer tokens the regeneration shares
            tokens = gen[:d].tolist()
            if d < stop:
                tokens.append(int(logits[i, d].argmax()))
            elif d == k and int(gen[-1]) not in self.eos and k < limit:
                pass  # the whole answer, not ended by end-of-sequence: greedy decoding goes on after it
            else:
                self.regenerated[run] = tokens
                continue
            if tokens[-1] in self.eos or len(tokens) >= limit:
                self.regenerated[run] = tokens
                continue
            row_cache, row = (self.base, 0) if cache is None else (cache, i)
            self.departures.append(_Departure(run, tokens, row_cache, row, self.n + len(tokens) - 1))


def _perturbed_passes(
    model: torch.nn.Module,
    runs: _Runs,
    seq: torch.Tensor,
    keep: torch.Tensor,
    first: list[int],
    groups: list[list[int]],
    progress: ProgressFn | None,
    image: ImageSequence | None = None,
) -> float:
    """Teacher-forced passes of the masked prompts, a group per batch over the unperturbed prefix cache; returns the
    positions per second they ran at."""
    t, k, dev = seq.shape[0], runs.gen.shape[0], keep.device
    pass_start, pass_tokens = time.perf_counter(), 0
    for done, group in enumerate(groups, start=1):
        between_passes()
        if progress:
            progress(done / (len(groups) + 1), f"removal: runs {done}/{len(groups)}")
        start = min(first[i] for i in group)  # positions before it are those of the unperturbed pass
        b = len(group)
        mask = torch.cat([keep[group].long(), torch.ones(b, k - 1, dtype=torch.long, device=dev)], dim=1)  # (B, T)
        cache = prefix_cache(runs.base, start, b)
        out = model(
            **_pass_inputs(seq, image, start, b), attention_mask=mask, past_key_values=cache, use_cache=True,
            logits_to_keep=k,
        )  # fmt: skip
        runs.settle(group, out.logits, cache)
        del out
        pass_tokens += b * (t - start)
    return pass_tokens / max(time.perf_counter() - pass_start, 1e-9)


def _decode_departures(
    model, departures: list[_Departure], keep: torch.Tensor, n: int, limit: int, eos: set[int], size: int,
    regenerated: list[list[int]], image: ImageSequence | None = None,
) -> None:  # fmt: skip
    """Greedy decoding of every departing run, `size` at a time, until end-of-sequence or `limit` tokens."""
    dev = keep.device
    size = max(1, size)
    for chunk_start in range(0, len(departures), size):
        rows = departures[chunk_start : chunk_start + size]  # in cache row order
        width = max(d.length for d in rows)
        room = limit - min(len(d.tokens) for d in rows) + 1
        cache = right_aligned([(d.cache, d.row, d.length) for d in rows], width, room)
        mask = torch.zeros(len(rows), width, dtype=torch.long, device=dev)  # (B, W): left padding stays 0
        for i, d in enumerate(rows):
            mask[i, width - d.length : width - d.length + n] = keep[d.run].long()
            mask[i, width - d.length + n :] = 1
        finished = [False] * len(rows)
        while True:
            between_passes()
            token = torch.tensor([[d.tokens[-1]] for d in rows], dtype=torch.long, device=dev)  # (B, 1)
            at = [n + len(d.tokens) - 1 for d in rows]  # sequence index of each row's next input
            pos = image.decode_positions(n, at) if image else torch.tensor(at, device=dev)[:, None]  # (B, 1)
            mask = torch.cat([mask, torch.ones(len(rows), 1, dtype=mask.dtype, device=dev)], dim=1)
            logits = model(
                input_ids=token, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True
            ).logits[:, -1]  # (B, V)
            for i, d in enumerate(rows):
                if finished[i]:
                    continue  # a finished row stays in the batch until compaction; its output is ignored
                d.tokens.append(int(logits[i].argmax()))
                if d.tokens[-1] in eos or len(d.tokens) >= limit:
                    regenerated[d.run] = d.tokens
                    finished[i] = True
            live = [i for i in range(len(rows)) if not finished[i]]
            if not live:
                break
            if len(live) <= len(rows) // 2:  # copying the cache pays off once half the rows are done
                index = torch.tensor(live, device=dev)
                cache.batch_select_indices(index)
                mask = mask[index]
                rows = [rows[i] for i in live]
                finished = [False] * len(rows)


def removal_curves(
    bundle: ModelBundle,
    attr: Attribution,
    methods: Sequence[str] | None = None,
    positions: Sequence[int] | None = None,
    config: RemovalConfig | None = None,
    include_random: bool = True,
    progress: ProgressFn | None = None,
    image_inputs: dict[str, torch.Tensor] | None = None,
) -> RemovalReport:
    """MIF / LIF curves and SRG for the given methods of one result (MACS paper, Appendix A.2).

    Args:
        bundle: the model that produced `attr`.
        attr: a finished result.
        methods: methods of `attr` to evaluate (default: all); "random" needs no scores.
        positions: prompt positions that may be removed (default: the user's text).
        include_random: add the random baseline (two random orderings) if not among `methods`.
        progress: progress(fraction, message).
        image_inputs: an image result's `vision.encode_image_prompt(...).prefill_inputs`; `positions` then
            usually names image tokens (`common.image_ranked_positions`).

    Returns:
        A `RemovalReport`; SRG is higher-is-better for logit, ROUGE-L and BLEU, lower-is-better for perplexity.

    Raises:
        InputError: no generated tokens, unknown method, or bad positions. Cancelled: the request was cancelled.
    """
    cfg = config or RemovalConfig()
    methods = list(methods if methods is not None else attr.methods)
    if include_random and RANDOM not in methods:
        methods.append(RANDOM)
    check_result(attr, methods, image_inputs is not None)
    pos = evaluated_positions(attr, positions)
    fractions = [float(f) for f in cfg.fractions]
    if fractions[0] != 0.0 or len(fractions) < 2:
        raise InputError("fractions must start at 0 and have at least two entries")
    runs, plan = _plan(attr, methods, pos, [int(round(f * pos.size)) for f in fractions], cfg.seed)
    dev = bundle.device
    keep = _keep_rows(runs, attr.num_prompt_tokens, dev)  # (R, N)
    prompt = torch.tensor(attr.prompt_token_ids, dtype=torch.long, device=dev)  # (N,)
    gen = torch.tensor(attr.generated_token_ids, dtype=torch.long, device=dev)  # (K,)
    max_new = cfg.max_new_tokens or int(attr.meta.get("max_new_tokens") or attr.num_steps)
    with hold(bundle.model):
        logit, ppl, regenerated, speed = removal_runs(
            bundle.model, prompt, gen, keep, max_new, bundle.eos_token_ids, cfg.batch_size, cfg.decode_batch_size,
            progress, image_sequence(bundle, attr, image_inputs) if image_inputs is not None else None,
        )  # fmt: skip
    texts = [decode(bundle, tokens) for tokens in regenerated]
    values = _metrics(logit, ppl, texts, decode(bundle, attr.generated_token_ids))
    if progress:
        progress(1.0, "removal runs done")

    report = RemovalReport(fractions=fractions, runs=len(runs) - 1, tokens_per_second=speed)
    for m, orders in plan.items():
        report.curves[m], report.auc[m] = {}, {}
        report.generations[m] = {name: [texts[i] for i in rows] for name, rows in orders.items()}
        for metric, v in values.items():
            report.curves[m][metric], report.auc[m][metric] = _curves(fractions, orders, v)
    return report


@torch.inference_mode()
def image_sequence(bundle: ModelBundle, attr: Attribution, image_inputs: dict[str, torch.Tensor]) -> ImageSequence:
    """The removal passes' inputs of an image result: the decoder's input embeddings over prompt + answer (the vision
    tower runs once) and the 3D positions continued over the answer.

    Raises:
        InputError: the image inputs do not belong to this result (another image size or prompt).
    """
    from ..methods.inputs import decoder_input_embeddings
    from ..models.vision import full_sequence_inputs

    grid = image_inputs.get("image_grid_thw")
    merge = bundle.model.config.vision_config.spatial_merge_size
    tokens = int(grid.prod(dim=-1).sum()) // merge**2 if grid is not None else -1
    if tokens != len(attr.image_token_positions):
        raise InputError(
            f"The image inputs give {tokens} image tokens, but the result has {len(attr.image_token_positions)}: "
            "encode the same images and question with the same image budget."
        )
    ids = torch.tensor([attr.prompt_token_ids + attr.generated_token_ids], dtype=torch.long, device=bundle.device)
    extra = full_sequence_inputs(image_inputs, attr.num_steps)
    embeds = decoder_input_embeddings(bundle.model, ids, extra)  # (1, N + K, d)
    return ImageSequence(embeds[:, :-1], extra["position_ids"])


def _keep_rows(runs: dict[frozenset, int], n: int, device: torch.device) -> torch.Tensor:
    """(R, N) bool: False at the positions each run removes."""
    keep = torch.ones(len(runs), n, dtype=torch.bool, device=device)  # (R, N)
    for removed, row in runs.items():
        keep[row, sorted(removed)] = False
    return keep


def _metrics(logit: np.ndarray, ppl: np.ndarray, texts: list[str], reference: str) -> dict[str, np.ndarray]:
    """Every run's value of each metric in `REMOVAL_METRIC_KEYS` order: mean logit, perplexity, and the ROUGE-L and
    BLEU of its regeneration against the original answer."""
    values = {
        "logit": logit,
        "ppl": ppl,
        "rougeL": np.array([rouge_l_f1(text, reference) for text in texts]),
        "bleu": np.array([bleu(text, reference) for text in texts]),
    }
    assert tuple(values) == REMOVAL_METRIC_KEYS
    return values


def _plan(
    attr: Attribution, methods: list[str], pos: np.ndarray, counts: list[int], seed: int
) -> tuple[dict[frozenset, int], dict[str, dict[str, list[int]]]]:
    """One run per distinct removed set (index 0: the unperturbed baseline), and for each method and ordering
    ("mif", "lif") the run of each removal fraction."""
    runs: dict[frozenset, int] = {frozenset(): 0}
    plan: dict[str, dict[str, list[int]]] = {}
    for m in methods:
        plan[m] = {}
        for name, order in removal_orderings(attr, m, pos, seed).items():
            plan[m][name] = [runs.setdefault(frozenset(order[:c].tolist()), len(runs)) for c in counts]
    return runs, plan


def _curves(
    fractions: list[float], orders: dict[str, list[int]], v: np.ndarray
) -> tuple[dict[str, list[float]], dict[str, float]]:
    """One metric's curves (each run's value over the unperturbed one, per ordering) and their normalised AUCs and
    SRG."""
    base = v[0]
    curves = {
        name: [float(v[i] / base) if base != 0 and np.isfinite(base) else float("nan") for i in rows]
        for name, rows in orders.items()
    }
    auc = {name: normalised_auc(fractions, c) for name, c in curves.items()}
    auc["srg"] = srg(auc["lif"], auc["mif"])
    return curves, auc
