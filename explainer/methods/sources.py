"""Sources: which passages of the prompt support the answer, per answer token.

Answers the retrieval-augmented-generation question "which sentences support this answer?" two ways (`fit`):

**"surrogate" (the default): ContextCite's surrogate** (Cohen-Wang et al., 2024, section 3, Eq. 1). The prompt's
units (paragraphs, sentences or words of the user's text, `explainer/segments.py`; sentences by default) are removed
from the prompt by `ablations` keep-masks (ContextCite's ablation: the tokens are taken out, `ablate.py`, batched over
the prefix cache; the unperturbed prompt's values are the generation's own, `GenerationRun.answer_logprobs`, where
the run carries them), the answer is teacher-forced through every ablated prompt, and a linear model per answer token,
log p(token k | kept units) = b_k + sum of w_k[u] over the kept units, is fitted to them (`surrogate.py`: ridge over
an orthogonal design of masks, its penalty by leave-one-out error, shared by every token; where the units are as many
as the masks or more, ContextCite's Lasso on sparse masks, each token's penalty by cross-validation:
`regulariser`, "auto" by default).
With `context` the passages start just after the first occurrence of that text (a label such as "Context:"), and
what comes before them (an instruction, the question, the label) stays in every ablation, as ContextCite is handed the
context apart from the query and its template. One set of passes gives
every answer token's weights, so each step of the slider has its own map and the whole answer's weights are their
sum. A unit's weight is spread evenly over its tokens: summing a step's token scores over a unit gives its weight
back. Scores are signed: a negative unit hurts the answer. The fit's quality in the method's meta is its
cross-validated Spearman: each fitted mask's measured whole-answer log-probability against the prediction of a fit
without it (ContextCite's LDS on this one answer, on masks the prediction did not see; it costs no pass). `check` > 0
measures that many more random masks, left out of the fit, for a held-out Spearman on them beside it; 0 by default
(4 before 2026-12-03): on development questions 4 such masks tracked each answer's LDS on fresh masks less closely than
the cross-validated Spearman did, for a quarter of Sources' time (docs/results.md).
The meta also keeps every mask and its log-probabilities, which the faithfulness panel reuses to score the other
methods on the same answer, and the seconds of the passes and of the fit (`passes_seconds`, `fit_seconds`; `bench`
rows carry them as `phase_seconds`).
`passes=knockout` is the cheap approximation: each mask recomputes only what follows the last unit (a question after
the passages, the template's tail, the answer), blind to the removed units, while the kept units keep the cache they
were read with beside the removed ones (`ablate.py`); docs/results.md says what it costs in LDS.

**"leave_one_out"**: hide one unit at a time (as AttriBoT, Liu et al., 2024, makes fast by reusing the KV cache and
refining hierarchically), per answer token:

- a unit (paragraph, sentence or word of the user's text, `explainer/segments.py`) is hidden from later queries by
  attention masking (its keys get a large negative pre-softmax bias in every layer and head; with
  `suppression_factor` > 0, AtMan's softer suppression: the weights are multiplied by it), and its score at answer
  token k is the change of k's teacher-forced cross-entropy: score[k, u] = CE_k(hide u) - CE_k(original) (AtMan
  paper, Eq. 3, with a unit in place of a token). Positive: the unit supports that answer token.
- `scope`, which queries the unit is hidden from: "answer" (the default) hides it from the positions that predict
  the answer only (the last prompt position and the answer's), so the prompt's own tokens keep reading it and the
  score measures what the answer draws on directly (an attention knockout, as Geva et al., 2023, block the last
  position's edges to the subject); "all" hides it from every later query, i.e. removes it from the context (the
  ContextCite / AttriBoT leave-one-out quantity), and also counts what reaches the answer through later tokens.
- hierarchically (`depth` levels coarser than `unit`): paragraphs first, then the sentences of the `keep` strongest
  paragraphs (mean score over the answer), then the words of the strongest sentences, as AttriBoT does; a unit that
  is not refined keeps its parent's score.
- each unit's score goes to every one of its tokens, so the token, word and sentence views and every export show
  it unchanged (a sentence's mean is its score).

Speed: scope "all" runs AtMan's passes (`atman.suppression_scores`): one unperturbed pass caches every position's
keys and values; a unit's pass reuses that cache up to the unit's first token and recomputes only the rest, several
units per batch (rows per batch from the device, `kv.batch_budget`), sorted by their first position. Scope "answer"
runs packed passes (`answer_passes.PackedPasses`): the prompt's cache once for every level, then each unit's K
answer positions as one segment of a shared pass (`kv.packed_positions`). The method's `meta` lists the top units
with their scores and token spans (`sources` in the JSON), the scope, and how many forward positions it used.
"""

from __future__ import annotations

import string
import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import torch

from ..errors import InputError
from ..result.ranks import spearman
from ..result.segments import Group, paragraph_groups, sentence_groups, word_groups
from ..runtime.host import to_numpy
from ..runtime.kv import TOKENS_PER_BATCH
from ..runtime.memory import MemoryRequest
from ..runtime.session import hold
from .ablate import CPU_ROWS, forward_positions, response_logprobs
from .answer_passes import PackedPasses
from .atman import prefix_pass_bytes, suppression_scores
from .atman.config import CPU_BATCH_ROWS
from .base import AttributionMethod, GenerationRun
from .cost import Cost, CostRequest
from .surrogate import DESIGNS, REGULARISERS, chosen_regulariser, design, design_kind, spread, surrogate_fit

LEVELS = ("paragraph", "sentence", "word")  # coarse to fine
SCOPES = ("answer", "all")  # which queries a hidden unit is hidden from
MASK_BIAS = -1e4  # pre-softmax bias of a hidden key: exp(-1e4) is 0 in every float format, and no row is all -inf
TOP_SOURCES = 10  # units listed in the method's meta
FITS = ("surrogate", "leave_one_out")
PASSES = ("removal", "knockout")  # the surrogate's ablations: units taken out (exact), or hidden from what reads them
MAX_ABLATIONS = 256  # ablations a surrogate may ask for (ContextCite uses 32 to 256)


@dataclass
class SourcesConfig:
    fit: str = field(default="surrogate", metadata={"choices": FITS})  # ContextCite's surrogate, or leave-one-out
    ablations: int = 16  # surrogate: keep-masks it is fitted on (k, 1 to 256), besides the unperturbed prompt
    check: int = 0  # surrogate: random masks measured but not fitted, for a held-out Spearman beside the
    # cross-validated one (which costs no pass); 0: none
    design: str = field(default="informed", metadata={"choices": DESIGNS})  # surrogate: the masks (surrogate.py)
    regulariser: str = field(default="auto", metadata={"choices": REGULARISERS})  # surrogate: "ridge" (dense),
    # "lasso" (ContextCite's: sparse weights), or "auto": the ridge where the units are fewer than the masks, else
    # lasso; "saturating": as "auto", with a model of redundant passages in the ridge's place (`saturating.py`)
    context: str = ""  # surrogate: the passages start just after this text (a label, e.g. "Context"); it and what
    # precedes it (an instruction, the question) stay in every ablation and score 0; empty: every unit is a passage
    seed: int = 0  # surrogate: seeds the masks
    passes: str = field(default="removal", metadata={"choices": PASSES})  # surrogate: "removal" takes the units out
    # and recomputes from the first one removed (ContextCite's ablation); "knockout" recomputes only what follows the
    # last unit (a question after the passages, the template, the answer), blind to the removed units: far cheaper,
    # approximate (the kept units were read beside the removed ones)
    unit: str = field(default="sentence", metadata={"choices": LEVELS})  # the finest unit scored
    # leave-one-out only, from here on (but `batch_size`, rows per batched pass for both):
    depth: int = 1  # levels refined down to `unit` (sentence, depth 1: paragraphs, then sentences); 0: flat
    keep: int = 3  # units of a level whose children are scored at the next level
    scope: str = field(default="answer", metadata={"choices": SCOPES})  # hidden from the answer's queries only
    # (the positions that predict it: each unit costs K positions), or from every later query ("all": the unit is
    # removed from the context, each unit recomputes from its first token, ~20x slower at 2,000 tokens)
    suppression_factor: float = 0.0  # 0: the unit is masked; > 0: its attention weights are scaled by this (AtMan)
    batch_size: int = 0  # units per batched pass besides the unperturbed row; 0: from the device (8 on a CPU)
    fast: bool = True  # reuse the prefix cache and batch; False: one full forward per unit (the reference)

    def __post_init__(self) -> None:
        if self.fit not in FITS:
            raise ValueError(f"fit must be one of {', '.join(FITS)}, got {self.fit!r}")
        if not 1 <= self.ablations <= MAX_ABLATIONS:
            raise ValueError(f"ablations must lie between 1 and {MAX_ABLATIONS}, got {self.ablations}")
        if not 0 <= self.check <= MAX_ABLATIONS:
            raise ValueError(f"check must lie between 0 and {MAX_ABLATIONS}, got {self.check}")
        if self.passes not in PASSES:
            raise ValueError(f"passes must be one of {', '.join(PASSES)}, got {self.passes!r}")
        if self.design not in DESIGNS:
            raise ValueError(f"design must be one of {', '.join(DESIGNS)}, got {self.design!r}")
        if self.regulariser not in REGULARISERS:
            raise ValueError(f"regulariser must be one of {', '.join(REGULARISERS)}, got {self.regulariser!r}")
        if self.scope not in SCOPES:
            raise ValueError(f"scope must be one of {', '.join(SCOPES)}, got {self.scope!r}")
        if self.unit not in LEVELS:
            raise ValueError(f"unit must be one of {', '.join(LEVELS)}, got {self.unit!r}")
        if not 0 <= self.depth <= LEVELS.index(self.unit):
            raise ValueError(f"depth must lie between 0 and {LEVELS.index(self.unit)} for unit {self.unit!r}")
        if self.keep < 1:
            raise ValueError(f"keep must be at least 1, got {self.keep}")
        if not 0 <= self.suppression_factor < 1:
            raise ValueError(f"suppression_factor must lie in [0, 1), got {self.suppression_factor}")
        if self.batch_size < 0:
            raise ValueError(f"batch_size must be 0 (from the device) or more, got {self.batch_size}")


_GROUPS = {"paragraph": paragraph_groups, "sentence": sentence_groups, "word": word_groups}
_KINDS = {"paragraph": ("paragraph",), "sentence": ("sentence",), "word": ("word", "punct")}


def units(tokens: list[str], positions: list[int], level: str) -> list[Group]:
    """The units of `level` over `positions` (whitespace, chat-template and role groups left out)."""
    return [g for g in _GROUPS[level](tokens, positions) if g.kind in _KINDS[level]]


def passages(tokens: list[str], positions: list[int], cfg: SourcesConfig) -> list[Group]:
    """The surrogate's units: those of `cfg.unit` over `positions`, from just after `cfg.context` on.

    The marker is a label ("Context:"), not a source: it stays in every ablation with what precedes it, as ContextCite
    is handed the context apart from its template, and so does the punctuation right after it. The unit that holds it
    keeps its tokens after the marker as the first passage (none where nothing follows it there).

    Raises:
        InputError: no unit holds `cfg.context`, or fewer than two units.
    """
    groups = units(tokens, positions, cfg.unit)
    if cfg.context:
        first = next((i for i, g in enumerate(groups) if cfg.context in g.text), None)
        if first is None:
            raise InputError(f"Sources: no {cfg.unit} of the prompt holds {cfg.context!r}, where the passages "
                             "should start; change the option `context` or leave it empty.")  # fmt: skip
        groups = after_marker(tokens, groups[first:], cfg.context)
    if len(groups) < 2:
        raise InputError(
            f"Sources fits its surrogate over the prompt's {cfg.unit}s and needs at least two; this prompt has "
            f"{len(groups)}. Add text, choose a finer unit (unit=word), or use fit=leave_one_out."
        )
    return groups


_LABEL_END = string.punctuation + string.whitespace  # what may follow a marker before the passages start


def after_marker(tokens: list[str], groups: list[Group], marker: str) -> list[Group]:
    """`groups` (the first holds `marker`) from the token after the one that completes it and the punctuation or
    spaces after that (e.g. from the sentence after "Context:"): the unit cut there keeps its rest, the units before
    it go (with word units, the label's ":" is one)."""
    text, start = "", groups[0].start
    while marker not in text:
        text += tokens[start]
        start += 1
    while start < groups[-1].stop and not tokens[start].strip(_LABEL_END):
        start += 1
    cut = [g for g in groups if g.stop > start]
    if cut and cut[0].start < start:
        cut[0] = Group(start, cut[0].stop, "".join(tokens[start : cut[0].stop]), cut[0].kind)
    return cut


def keep_rows(masks: np.ndarray, groups: list[Group], n: int) -> np.ndarray:
    """(R, N) bool token keep-rows of (R, U) unit masks; the last prompt token, which predicts the answer's first
    one, always stays (`ablate.py`)."""
    keep = np.ones((len(masks), n), dtype=bool)
    for u, g in enumerate(groups):
        keep[:, g.start : g.stop] = masks[:, u : u + 1]
    keep[:, n - 1] = True
    return keep


def overlap_prior(ids: np.ndarray, groups: list[Group], readers: list[int]) -> np.ndarray:
    """(U,) how likely each unit is to matter to the answer, known before any pass (the "informed" design's prior):
    the distinct token ids a unit shares with what reads it (`readers`: the answer's positions and the user's text
    outside the passages, a question), each weighted by 1 / the number of units that hold it, so a token every
    sentence has counts little and the sentence an answer quotes counts most. 0 where a unit shares nothing."""
    read = set(ids[readers].tolist())
    held = [set(ids[g.start : g.stop].tolist()) for g in groups]
    count = Counter(t for h in held for t in h)
    return np.array([sum(1.0 / count[t] for t in h & read) for h in held], dtype=np.float64)  # (U,)


def readers(groups: list[Group], positions: list[int], n: int, total: int) -> list[int]:
    """The user's positions outside every unit, then the answer's (n to total - 1): what reads the units."""
    inside = np.zeros(total, dtype=bool)
    for g in groups:
        inside[g.start : g.stop] = True
    return [p for p in positions if p < n and not inside[p]] + list(range(n, total))


def fitted_masks(cfg: SourcesConfig, groups: list[Group], ids: np.ndarray, positions: list[int], n: int) -> np.ndarray:
    """(A, U) the keep-masks the surrogate is fitted on besides the unperturbed prompt (True = kept): `design` over the
    units, placed by `overlap_prior` where the design is "informed". `ids`: (T,) the prompt's then the answer's
    token ids; `positions`: the user's prompt positions; n: the prompt's length."""
    prior = None
    if cfg.design == "informed":
        prior = overlap_prior(ids, groups, readers(groups, positions, n, len(ids)))  # (U,)
    return design(len(groups), cfg.ablations, cfg.design, cfg.seed, prior)


def reread_from(groups: list[Group], n: int) -> int:
    """Where knockout passes start: the first position after the last unit (at most the last prompt position)."""
    return min(groups[-1].stop, n - 1)


def _inside(children: list[Group], parents: list[Group]) -> list[Group]:
    """The children that lie within one of `parents`."""
    return [c for c in children if any(p.start <= c.start and c.stop <= p.stop for p in parents)]


class Sources(AttributionMethod):
    name = "sources"
    display_name = "Sources"
    streaming = False
    Config = SourcesConfig

    def __init__(self, config: SourcesConfig | None = None, **options) -> None:
        super().__init__(config, **options)
        self._meta: dict = {}

    @classmethod
    def cost(cls, request: CostRequest, config: SourcesConfig) -> Cost:
        """A rough count: about one unit per 25 prompt tokens (sentences) or 4 (words), a paragraph level of about a
        tenth of that; scope "all": each unit's pass over the suffix after it (half the sequence on average) in
        batches of rows; scope "answer": the prompt once, then K positions per unit (and a baseline segment per
        pass) packed into passes of about `batch_tokens` positions."""
        n, k, t = request.n, request.num_new_tokens, request.t
        if k <= 0 or n == 0:
            return Cost()
        if config.fit == "surrogate":  # the unperturbed pass, then each mask's kept tokens from its first removed unit
            # (about half of the sequence: the first removed unit is near the start, and half of the rest is kept)
            runs = config.ablations + config.check
            if config.passes == "knockout":  # about the answer and a template's tail per mask, packed
                tail = k + 8
                rows = max(1, request.batch_tokens // tail)
                return Cost(forward_passes=1 + -(-runs // rows), forward_tokens=t - 1 + runs * tail)
            rows = config.batch_size or request.batch_rows or CPU_ROWS
            return Cost(forward_passes=1 + -(-runs // rows), forward_tokens=t - 1 + runs * (t - 1) // 2)
        per_unit = {"paragraph": 250, "sentence": 25, "word": 4}[config.unit]
        count = max(1, n // per_unit)
        if config.depth:
            count = max(1, n // 250) + min(count, config.keep * max(1, count // 10))
        if config.scope == "answer":
            rows = config.batch_size or max(1, request.batch_tokens // k - 1)
            passes = -(-count // rows)
            return Cost(forward_passes=1 + passes, forward_tokens=n - 1 + (count + passes) * k)
        rows = config.batch_size or request.batch_rows or CPU_BATCH_ROWS
        return Cost(forward_passes=1 + -(-count // rows), forward_tokens=t - 1 + count * (t - 1) // 2)

    @classmethod
    def memory(cls, request: MemoryRequest, config: SourcesConfig) -> int:
        """Scope "all": AtMan's need (the prefix cache and one batched pass). Scope "answer": the prompt's cache and
        one packed pass of P positions (`kv.packed_positions`; on an accelerator it is sized to fit, so the smallest
        is counted): their activations and cache, float32 logits twice, and mask and score rows over every key.
        The surrogate: the removal passes are AtMan's layout (the cache and a batch of rows each with its own copy)."""
        if config.fit == "surrogate":
            return prefix_pass_bytes(request, config.batch_size, CPU_ROWS, config.ablations + config.check)
        if config.scope == "all":  # at most a row per prompt token
            return prefix_pass_bytes(request, config.batch_size, CPU_BATCH_ROWS, request.n)
        # `request.batch_tokens` sizes AtMan's passes (up to 65,536 positions on an accelerator); a packed pass is
        # sized by `kv.packed_positions` instead, never below `TOKENS_PER_BATCH`, which is what must fit.
        s, t, p = request.shape, request.t, min(request.batch_tokens, TOKENS_PER_BATCH)
        if config.batch_size:
            p = min(p, (config.batch_size + 1) * max(1, request.k))
        return s.kv_bytes(t + p) + p * (s.activation_bytes(1) + 8 * s.vocab + 4 * (3 + s.heads) * (t + p))

    def explain(self, run: GenerationRun) -> np.ndarray:
        if run.prompt_tokens is None:
            raise InputError("Sources needs the prompt's tokens to find its sentences; run it through explain().")
        with hold(run.model), torch.inference_mode():  # no autograd graph of the passes (GBs at 1,000 tokens)
            return self._surrogate(run) if self.config.fit == "surrogate" else self._explain(run)

    def _surrogate(self, run: GenerationRun) -> np.ndarray:
        """(K, N): every answer token's surrogate weights, each unit's spread over its tokens (module docstring)."""
        cfg, n, k = self.config, run.num_prompt_tokens, run.num_steps
        positions = run.user_positions or list(range(n))
        groups = passages(run.prompt_tokens, positions, cfg)
        ids = run.input_ids[0]  # (T,)
        fitted = fitted_masks(cfg, groups, to_numpy(ids), positions, n)  # (A, U) True = kept
        checks = design(len(groups), cfg.check, "random", [cfg.seed, 1])  # (C, U)
        masks = np.concatenate([np.ones((1, len(groups)), dtype=bool), fitted, checks])  # (R, U) row 0: all kept
        rows = keep_rows(masks, groups, n)  # (R, N)
        keep = torch.as_tensor(rows, device=run.input_ids.device)
        reread = reread_from(groups, n) if cfg.passes == "knockout" else None  # what follows the passages
        given = run.answer_logprobs  # (K,) the generation's own values for row 0, or None: a pass computes them
        start = time.perf_counter()
        logp = response_logprobs(run.model, ids[:n], ids[n:], keep, cfg.batch_size, run.progress, reread, given)
        passed = time.perf_counter()  # the passes' values are on the host: every device's work is done
        a = 1 + len(fitted)
        regulariser = chosen_regulariser(len(groups), cfg.ablations, cfg.regulariser)
        surrogate = surrogate_fit(masks[:a], logp[:a], regulariser)
        seconds = {"passes_seconds": passed - start, "fit_seconds": time.perf_counter() - passed}
        weights, intercepts = surrogate.weights, surrogate.intercepts  # (K, U), (K,)
        raw = spread(weights, [(g.start, g.stop) for g in groups], n)  # (K, N)
        whole = weights.sum(axis=0)  # (U,)
        quality = {
            "held_out_spearman": spearman(logp[a:].sum(axis=1), masks[a:] @ whole) if len(checks) > 1 else None,
            "cross_validated_spearman": spearman(logp[:a].sum(axis=1), surrogate.checked.sum(axis=1)),
        }
        scored = [(g, weights[:, u]) for u, g in enumerate(groups)]
        if regulariser == "lasso":  # the units a sparse fit left at 0 are not listed, so negative ones are
            scored = [(g, w) for g, w in scored if np.any(w != 0)] or scored[:1]
        sentences = len(units(run.prompt_tokens, positions, "sentence"))
        used = forward_positions(rows, n + k - 1, reread, known=given is not None)
        self._meta = {
            **_sources_meta(scored, len(groups), used, sentences, n + k, total=True), "fit": "surrogate",
            "ablations": len(fitted), "checks": len(checks), "regulariser": regulariser,
            "design": design_kind(len(groups), cfg.ablations, cfg.design),
            "penalty": surrogate.penalty, "passes": cfg.passes, **quality, **seconds,
            "unperturbed": "pass" if given is None else "generation",
            "masks": {"units": [[g.start, g.stop] for g in groups], "keep": masks.astype(int).tolist(),
                      "fitted": a, "log_p": logp.tolist(), "intercepts": intercepts.tolist()},
        }  # fmt: skip
        return raw

    def _explain(self, run: GenerationRun) -> np.ndarray:
        cfg, n, k = self.config, run.num_prompt_tokens, run.num_steps
        tokens, positions = run.prompt_tokens, run.user_positions or list(range(n))
        raw = np.zeros((k, n), dtype=np.float32)  # (K, N)
        level = LEVELS.index(cfg.unit) - cfg.depth
        todo = units(tokens, positions, LEVELS[level])
        scored: list[tuple[Group, np.ndarray]] = []
        passes = positions_used = 0
        start = n - 1 if cfg.scope == "answer" else 0  # the answer's first token is predicted at position N - 1
        packed = PackedPasses(run.model, run.input_ids, n, start) if start and cfg.fast else None
        while todo:
            scores, used = self._score_units(run, todo, start, packed)  # (K, U)
            passes, positions_used = passes + len(todo), positions_used + used
            for u, group in enumerate(todo):
                raw[:, group.start : group.stop] = scores[:, u : u + 1]  # finer levels overwrite their parent
                scored.append((group, scores[:, u]))
            if level == LEVELS.index(cfg.unit):
                break
            strongest = [todo[u] for u in sorted(range(len(todo)), key=lambda u: -float(scores[:, u].mean()))]
            level += 1
            todo = _inside(units(tokens, positions, LEVELS[level]), strongest[: cfg.keep])
            refined = {(g.start, g.stop) for g in strongest[: cfg.keep]}
            scored = [(g, s) for g, s in scored if (g.start, g.stop) not in refined]  # their children replace them
        sentences = len(units(tokens, positions, "sentence"))
        positions_used = packed.positions if packed is not None else positions_used
        self._meta = {**_sources_meta(scored, passes, positions_used, sentences, n + k), "scope": cfg.scope}
        return raw

    def _score_units(
        self, run: GenerationRun, todo: list[Group], start: int, packed: PackedPasses | None
    ) -> tuple[np.ndarray, int]:
        """(K, U) loss changes of hiding each unit from the queries from `start` on, and the forward positions the
        batched passes computed (the unperturbed pass and each unit's suffix; `packed` counts its own)."""
        cfg, n, ids = self.config, run.num_prompt_tokens, run.input_ids
        t = ids.shape[1]
        bias = MASK_BIAS if cfg.suppression_factor == 0 else float(np.log(cfg.suppression_factor))
        log_bias = torch.zeros(len(todo), t, dtype=torch.float32, device=ids.device)  # (U, T)
        for u, group in enumerate(todo):
            log_bias[u, group.start : group.stop] = bias
        if packed is not None:
            return np.asarray(packed.scores(log_bias, cfg.batch_size, run.progress), dtype=np.float32), 0
        columns = suppression_scores(
            run.model, ids, n, log_bias, cfg.fast, cfg.batch_size, run.progress, "Sources", from_query=start
        )
        used = (t - 1) + sum(t - 1 - max(g.start, start) for g in todo) if cfg.fast else (len(todo) + 1) * t
        return np.asarray(columns, dtype=np.float32), used

    def meta(self) -> dict:
        return {**super().meta(), **self._meta}


def _sources_meta(scored: list[tuple[Group, np.ndarray]], passes: int, used: int, sentences: int, t: int,
                  total: bool = False) -> dict:  # fmt: skip
    """The top units by mean score over the answer (`total`: the sum, the surrogate's whole-answer weight), and the
    work done against leave-one-sentence-out without a cache (one full pass per sentence and the original) and
    ContextCite's 64 ablations (JSON-able)."""
    ranked = sorted(scored, key=lambda item: -float(item[1].mean()))[:TOP_SOURCES]
    top = [
        {"text": g.text.strip(), "kind": g.kind, "start": g.start, "stop": g.stop,
         "score": float(s.sum() if total else s.mean())}
        for g, s in ranked
    ]
    return {"sources": top, "units_scored": passes, "forward_positions": used,
            "leave_one_sentence_out_positions": (sentences + 1) * t, "contextcite_positions": 64 * t}  # fmt: skip
