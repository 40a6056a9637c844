"""The external references of the LDS table, run on the same model, rows, sentences and response: ContextCite
(`context-cite` 0.0.4, Cohen-Wang et al. 2024) and AT2 (`at2` 0.0.1, "Learning to Attribute with Attention", 2025).

Both are optional (`pip install .[peers]`) and imported inside the functions that use them; nothing else of the
library or the app imports them. The `lds` and `hitratio` commands run them with `--peers context-cite,at2`
(`parse_peers` says what to install when they are absent).

What each peer is handed, so that both measure what the `lds` command measures (`lds_eval.answer_row`):
- the model and tokenizer of the project's `ModelBundle`, read-only;
- the QA prompt in the model's chat template, and the greedy answer's content tokens as the response (ContextCite
  keeps a generated text in its cache entry "output", which we fill; AT2 takes it with `set_generation`);
- the context's sentences of `segments.sentence_groups` as sources, instead of their nltk / spaCy splitters whose data
  cannot be downloaded here: a `BaseContextPartitioner` over the sentences' characters (ContextCite re-tokenises the
  kept text), and AT2's `_get_source_token_ranges` hook returning the sentences' token ranges.
Both are checked to see exactly the project's prompt and response token ids (`PeerMismatch` otherwise).

Their target is the response's logit-probability, log p - log(1 - p) (ContextCite's and AT2's
`aggregate_logit_probs`), per token the logit of p(token). Ours (`ablate.response_logprobs`) is log p per token,
summed. log p = logsigmoid(their logit), so the per-token log-probabilities are compared directly, and the sequence
logit is an increasing function of the summed log p, so a Spearman correlation, hence an LDS, is the same on both.

Their top-k drops (`peer_drops`) are measured as the methods' whole-answer ones: the project's removal of the k
sentences their scores rank first.

Their needle scores (`peer_needle_row`, the `hitratio` command's needle prompts) are the methods' mass share and AP of
their sentence scores, each shared evenly by its sentence's tokens; the sources are then the sentences of the whole
user message.

Each peer's LDS is measured on 32 ablation masks drawn by its own code (ContextCite: seeds after its training masks;
AT2: `create_masks`), with removal of the masked sentences: their LDS (scipy's Spearman of their surrogate against
their own measured logit-probabilities) and ours (`lds.lds` of the same scores against `ablate.response_logprobs`).

AT2 0.0.1's `get_masks_and_logit_probs(ablation_method="remove")` reads the target at its position in the unablated
text, which the shortened input no longer has there, so we take AT2's removed inputs (`get_ablated_inputs`) and its
`compute_logit_probs`, reading the target as the input's last K tokens. Its trainer ablates with `"mask"` (the
attention mask hides the tokens; positions stay), what it is trained on; the LDS is on removal, as ContextCite's.
"""

from __future__ import annotations

import importlib.util
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import ExplainerError, InputError
from ..runtime.host import to_numpy
from ..runtime.precision import without_cuda_autocast
from .ablate import response_logprobs
from .hitratio import needle_layout, needle_result, score_maps
from .lds import (
    KEEP_PROBABILITY,
    MASKS,
    TOP_K,
    centred_sources,
    raw_and_centred,
    spread,
    top_sources,
    without,
)
from .lds_eval import LdsRow, answer_prompt, answer_row
from .resumable import measure_rows, read_results

PEERS = ("context-cite", "at2")
PEER_MODULES = {"context-cite": "context_cite", "at2": "at2"}  # what each peer imports
CONTEXT_CITE_ABLATIONS = 64  # ContextCite's default number of ablations to fit its surrogate
AT2_STEPS = 50  # training steps of the check (the paper: 1000 over many examples); agreement, not a result
AT2_LEARNING_RATE = 1e-3  # AT2's default
AT2_MODEL_TYPES = ("llama", "qwen2", "phi3", "gemma3")  # the architectures at2's attention code knows


class PeerMismatch(ExplainerError):
    """A peer does not see the prompt or response the project measures (tokenisation or template differ)."""


@dataclass
class PeerConfig:
    max_new_tokens: int = 16  # as the `lds` command
    masks: int = MASKS  # evaluation masks per row
    keep: float = KEEP_PROBABILITY
    context_cite_ablations: int = CONTEXT_CITE_ABLATIONS
    at2_steps: int = AT2_STEPS
    at2_learning_rate: float = AT2_LEARNING_RATE
    peers: tuple[str, ...] = PEERS  # which references run (AT2 is trained only when it is one)
    top_k: tuple[int, ...] = TOP_K  # their top-k log-probability drops, measured by the project's removal
    seed: int = 0  # numpy's and torch's global seeds for AT2's training (it samples with them)
    command: str | None = None  # kept in every row, as the `lds` command does


@dataclass
class PeerRow:
    """What both peers are handed for one row: `LdsRow` plus the ids and the sentences' characters."""

    row: LdsRow
    prompt_ids: list[int]  # (N,)
    response_ids: list[int]  # (K,)
    response_text: str
    spans: list[tuple[int, int]]  # each sentence's characters in the user's prompt (start, end)


def prepare(bundle, row: dict[str, Any], cfg: PeerConfig) -> PeerRow:
    """Answer the row as the `lds` command does and locate its sentences' characters in the user's prompt."""
    answered = answer_row(bundle, row, ["random"], cfg.max_new_tokens)  # a method is needed; the answer is greedy
    return peer_row_of(bundle, answered)


def peer_row_of(bundle, answered: LdsRow) -> PeerRow:
    """What the peers are handed for a row answered by `lds_eval.answer_row` or `answer_prompt`."""
    tok, text = bundle.tokenizer, answered.encoded.text
    offsets = tok(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    base = text.rfind(answered.prompt)
    spans = [(max(offsets[s[0]][0] - base, 0), offsets[s[-1]][1] - base) for s in answered.sentences]
    response = list(answered.attr.generated_token_ids[: answered.k])
    return PeerRow(answered, list(answered.attr.prompt_token_ids), response, tok.decode(response), spans)


def _check_ids(peer: str, what: str, theirs, ours) -> None:
    if list(theirs) != list(ours):
        raise PeerMismatch(f"{peer} sees other {what} token ids than the project ({len(theirs)} vs {len(ours)}).")


def _kept_prompts(p: PeerRow, masks: np.ndarray) -> torch.Tensor:
    """(M, N) bool: the prompt tokens each (M, S) sentence mask keeps."""
    keep = np.ones((len(masks), len(p.prompt_ids)), dtype=bool)
    for s, positions in enumerate(p.row.sentences):
        keep[~masks[:, s], positions[0] : positions[-1] + 1] = False
    return torch.as_tensor(keep)


def our_logprobs(bundle, p: PeerRow, masks: np.ndarray) -> np.ndarray:
    """(M, K) float32: the project's log p of each response token with each mask's removed sentences taken out."""
    device = bundle.device
    prompt = torch.as_tensor(p.prompt_ids, dtype=torch.long, device=device)
    response = torch.as_tensor(p.response_ids, dtype=torch.long, device=device)
    return response_logprobs(bundle.model, prompt, response, _kept_prompts(p, masks))


def peer_drops(bundle, p: PeerRow, scores: np.ndarray, top_k: tuple[int, ...] = TOP_K) -> dict[str, float]:
    """A peer's top-k log-probability drops, as `lds_eval` measures the methods' whole-answer ones: log p(response)
    with every sentence minus with the k best-scored sentences (its (S,) `scores`) removed, by the project's removal."""
    n = len(p.row.sentences)
    masks = np.stack([np.ones(n, dtype=bool)] + [without(n, top_sources(scores, k)) for k in top_k])  # (1 + k's, S)
    logp = our_logprobs(bundle, p, masks).sum(axis=1)  # (1 + k's,)
    return {f"drop@{k}": float(logp[0] - logp[i + 1]) for i, k in enumerate(top_k)}


def _spearman(a: np.ndarray, b: np.ndarray) -> float | None:
    from scipy.stats import spearmanr  # scipy comes with the peers (scikit-learn)

    value = float(spearmanr(a, b).statistic)
    return None if math.isnan(value) else value


def centred_of(p: PeerRow, scores: np.ndarray) -> np.ndarray:
    """(S,) a peer's sentence scores centred as the methods' are for the centred LDS (`lds.centred_sources`)."""
    return centred_sources(scores, p.row.sentences, p.row.positions, len(p.prompt_ids))


def _compare(masks: np.ndarray, scores: np.ndarray, their_logit: np.ndarray, their_target: np.ndarray,
             ours: np.ndarray, centred_scores: np.ndarray) -> dict[str, Any]:  # fmt: skip
    """Their LDS, ours (raw and centred), and how far their per-token log p lies from ours (over the same masks)."""
    their_logp = -np.logaddexp(0.0, -np.asarray(their_logit, dtype=np.float64))  # logsigmoid: log p
    return {
        **raw_and_centred(ours.sum(axis=1), masks, scores, centred_scores),
        "lds_theirs": _spearman(masks.astype(np.float64) @ scores, their_target),
        "max_abs_logp_diff": float(np.abs(their_logp - ours).max()),
        "n_masks": int(len(masks)),
        "scores": [float(s) for s in scores],
    }


def context_cite_scores(bundle, p: PeerRow, cfg: PeerConfig):
    """ContextCite's (S,) sentence scores on one row (its Lasso surrogate fitted on `cfg.context_cite_ablations` of
    its own ablations), and its `ContextCiter`."""
    from context_cite import ContextCiter
    from context_cite.context_partitioner import BaseContextPartitioner

    prompt, spans = p.row.prompt, p.spans
    lo, hi = spans[0][0], spans[-1][1]
    parts = [prompt[s:e] for s, e in spans]
    gaps = [prompt[a[1] : b[0]] for a, b in zip(spans, spans[1:])]  # text between sentences: never removed

    class Sentences(BaseContextPartitioner):
        @property
        def num_sources(self) -> int:
            return len(parts)

        def split_context(self) -> None:
            pass

        def get_source(self, index: int) -> str:
            return parts[index]

        def get_context(self, mask=None) -> str:
            keep = np.ones(len(parts), dtype=bool) if mask is None else np.asarray(mask, dtype=bool)
            return "".join((gaps[i - 1] if i else "") + (parts[i] if keep[i] else "") for i in range(len(parts)))

    def escape(text: str) -> str:
        return text.replace("{", "{{").replace("}", "}}")

    template = escape(prompt[:lo]) + "{context}" + escape(prompt[hi:])
    cc = ContextCiter(
        bundle.model, bundle.tokenizer, prompt[lo:hi], "", prompt_template=template,
        partitioner=Sentences(prompt[lo:hi]), num_ablations=cfg.context_cite_ablations, ablation_keep_prob=cfg.keep,
        batch_size=1,
    )  # fmt: skip
    cc._cache["output"] = p.row.encoded.text + p.response_text  # its cache of the generated text (no public hook)
    _check_ids("ContextCite", "prompt", cc._get_prompt_ids(), p.prompt_ids)
    _check_ids("ContextCite", "response", cc._response_ids, p.response_ids)
    with without_cuda_autocast(bundle.model.device):  # its passes in the model's dtype, as on a CPU
        return np.asarray(cc.get_attributions(verbose=False), dtype=np.float64), cc  # (S,)


def context_cite_row(bundle, p: PeerRow, cfg: PeerConfig) -> dict[str, Any]:
    """ContextCite on one row: its scores (`context_cite_scores`), then its LDS and ours on `cfg.masks` further
    ablations drawn and measured by its code."""
    from context_cite.utils import aggregate_logit_probs, get_masks_and_logit_probs

    scores, cc = context_cite_scores(bundle, p, cfg)
    with without_cuda_autocast(bundle.model.device):
        masks, logit = get_masks_and_logit_probs(
            bundle.model, bundle.tokenizer, cfg.masks, len(p.spans), cc._get_prompt_ids, cc._response_ids, cfg.keep,
            1, base_seed=cfg.context_cite_ablations,
        )  # fmt: skip  # held-out: the seeds after its training masks'
    mismatched = sum(cc._get_prompt_ids(mask=m) != [p.prompt_ids[i] for i in np.flatnonzero(k)]
                     for m, k in zip(masks, to_numpy(_kept_prompts(p, masks))))  # fmt: skip
    out = _compare(masks, scores, logit, aggregate_logit_probs(logit), our_logprobs(bundle, p, masks),
                   centred_of(p, scores))  # fmt: skip
    return {**out, "retokenised_masks": int(mismatched)}


def held_out_masks(name: str, sources: int, cfg: PeerConfig) -> np.ndarray:
    """(M, S) bool: the masks a peer's own code draws for its LDS (`context_cite_row`, `at2_row`): ContextCite's
    seeds after its training masks', AT2's `create_masks` from seed 0."""
    if name == "context-cite":
        from context_cite.utils import _create_mask  # the draw of its get_masks_and_logit_probs

        return np.stack([_create_mask(sources, cfg.keep, cfg.context_cite_ablations + i) for i in range(cfg.masks)])
    from at2.tasks.base import create_masks

    return np.asarray(create_masks(cfg.masks, sources, cfg.keep, seed=0), dtype=bool)


def _at2_task(bundle, p: PeerRow):
    """An AT2 `ContextAttributionTask` over the row's prompt whose sources are the project's sentences."""
    from at2.tasks import ContextAttributionTask

    class SentenceTask(ContextAttributionTask):
        @property
        def prompt(self) -> str:
            return p.row.prompt

        def _get_document_ranges(self):
            return [(p.spans[0][0], p.spans[-1][1])]

        def _get_source_token_ranges(self):  # AT2's hook: (start, end) token ranges of the sources
            return [(s[0], s[-1] + 1) for s in p.row.sentences]

    task = SentenceTask(bundle.model, bundle.tokenizer, source_type="sentence")
    task.set_generation(p.response_text)
    _check_ids("AT2", "prompt", task.get_tokens()["input_ids"][: len(p.prompt_ids)], p.prompt_ids)
    _check_ids("AT2", "response", task.target_ids, p.response_ids)
    return task


def _at2_removal_logits(task, masks: np.ndarray, k: int) -> np.ndarray:
    """(M, K) AT2's logit-probabilities of the response after removing each mask's sources (its own inputs and
    arithmetic; the target read as the last K tokens, see the module docstring)."""
    from at2.tasks.base import compute_logit_probs

    out = np.zeros((len(masks), k), dtype=np.float32)
    model = task.model
    for i, mask in enumerate(masks):
        ids = torch.tensor([task.get_ablated_inputs(mask=mask, ablation_method="remove")["input_ids"]],
                           device=model.device)  # fmt: skip  # (1, T_i)
        with torch.no_grad():
            logits = model(input_ids=ids).logits[:, -k - 1 : -1]  # (1, K, V) predicting the last K tokens
        out[i] = to_numpy(compute_logit_probs(logits, ids[:, -k:])[0], np.float32)
    return out


def train_at2(bundle, rows: list[PeerRow], cfg: PeerConfig, workdir: str | Path):
    """AT2's linear score estimator, trained by its own trainer (`AT2Trainer`, Pearson loss on 32 "mask" ablations
    per row) on `rows`, with the project's responses as its generations and the whole response as the target."""
    from at2 import AT2FeatureExtractor, AT2Trainer
    from datasets import Dataset

    model_type = bundle.model.config.model_type
    if model_type not in AT2_MODEL_TYPES:
        raise PeerMismatch(f"at2 0.0.1 computes attention for {', '.join(AT2_MODEL_TYPES)} only, not {model_type!r}.")
    config = bundle.model.config
    features = AT2FeatureExtractor(config.num_hidden_layers, config.num_attention_heads, model_type=model_type)
    work = Path(workdir)
    (work / "generations").mkdir(parents=True, exist_ok=True)
    (work / "generations" / "0_of_1.json").write_text(json.dumps({i: r.response_text for i, r in enumerate(rows)}))

    def task_from_example(example, model, tokenizer):
        return _at2_task(bundle, rows[example["index"]])

    dataset = Dataset.from_dict({"index": list(range(len(rows)))})
    trainer = AT2Trainer(work, dataset, bundle.model, bundle.tokenizer, task_from_example,
                         feature_extractor=features, split_target_by=None, num_masks=cfg.masks)  # fmt: skip
    trainer.generate()  # our generations are there: it only records each row's number of sources and targets
    trainer.compute_features_and_outputs(batch_size=1)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    return trainer.train(num_iterations=cfg.at2_steps, learning_rate=cfg.at2_learning_rate, batch_size=len(rows),
                         device=str(bundle.device), print_every=max(cfg.at2_steps, 1))  # fmt: skip


def at2_scores(bundle, p: PeerRow, estimator) -> np.ndarray:
    """AT2's (S,) sentence scores on one row: its attributor with the trained `estimator`."""
    return _at2_attributed(_at2_task(bundle, p), estimator)


def _at2_attributed(task, estimator) -> np.ndarray:
    from at2 import AT2Attributor

    return np.asarray(AT2Attributor(task, estimator).get_attribution_scores(), dtype=np.float64)  # (S,)


def at2_row(bundle, p: PeerRow, estimator, cfg: PeerConfig) -> dict[str, Any]:
    """AT2 on one row: its scores (`at2_scores`), then its LDS and ours on `cfg.masks` ablations of its
    `create_masks`."""
    from at2.attribution.utils import aggregate_logit_probs

    task = _at2_task(bundle, p)
    scores = _at2_attributed(task, estimator)
    masks = held_out_masks("at2", task.num_sources, cfg)  # (M, S)
    logit = _at2_removal_logits(task, masks, len(p.response_ids))
    return _compare(masks, scores, logit, aggregate_logit_probs(logit), our_logprobs(bundle, p, masks),
                    centred_of(p, scores))  # fmt: skip


def _prepared(bundle, row: dict[str, Any], cfg: PeerConfig) -> PeerRow | None:
    try:
        return prepare(bundle, row, cfg)
    except InputError:
        return None


def peer_row(bundle, row: dict[str, Any], estimator, cfg: PeerConfig) -> dict[str, Any]:
    """The peers of `cfg.peers` on one row, as a row of the `lds` command's results (see `run_peers`): each one's LDS
    and whole-answer top-k drops (`peer_drops`).

    Raises:
        InputError: no answer, or fewer than 2 context sentences to ablate.
    """
    t0 = time.perf_counter()
    p = prepare(bundle, row, cfg)
    run = {"context-cite": lambda: context_cite_row(bundle, p, cfg), "at2": lambda: at2_row(bundle, p, estimator, cfg)}
    peers = {name: run[name]() for name in cfg.peers}
    drops = {name: peer_drops(bundle, p, np.asarray(entry["scores"]), cfg.top_k) for name, entry in peers.items()}
    return {"id": row["id"], "answer": p.row.attr.generated_text, "dtype": p.row.attr.meta.get("dtype"),
            "n_sentences": len(p.row.sentences), "n_response_tokens": p.row.k,
            "methods": {name: {"lds": entry["lds"], "lds_centred": entry["lds_centred"], **drops[name]}
                        for name, entry in peers.items()}, "peers": peers,
            "seconds": time.perf_counter() - t0, "command": cfg.command}  # fmt: skip


def peer_needle_row(bundle, row: dict[str, Any], estimator, cfg: PeerConfig) -> dict[str, Any]:
    """The peers of `cfg.peers` on one needle prompt (`hitratio.needle_rows`), as a row of the `hitratio` command's
    results (joinable with `hitratio --report`): each one's mass share and AP on the needle.

    A peer scores sentences, so its sources are the sentences of the whole user message (instruction, haystack,
    needles and question; `lds_eval.answer_prompt`), and its map is read at token level by sharing each sentence's
    score evenly among its tokens (`lds.spread`). It explains the whole response, so its one map stands for every step
    that writes the password; then it is scored as the methods are (`hitratio.score_maps`: the needle and haystack
    tokens only, rows whose answer holds a password). On a row whose answer holds none, the peers do not run (a
    third to a quarter of ContextCite's half hour a 1k prompt on a CPU would go to a map nobody scores).

    Raises:
        InputError: no answer.
    """
    t0 = time.perf_counter()
    p = peer_row_of(bundle, answer_prompt(bundle, row["id"], row["prompt"], 0, ["random"], cfg.max_new_tokens))
    layout = needle_layout(bundle, p.row.encoded, row)
    out = needle_result(row, p.row.attr, layout)
    run = {"context-cite": lambda: context_cite_scores(bundle, p, cfg)[0],
           "at2": lambda: at2_scores(bundle, p, estimator)}  # fmt: skip
    out["peers"] = {}
    for name in cfg.peers:
        if not out["found"]:  # unscored, as the methods' maps of such a row: its ablations would be wasted
            out["methods"][name] = {"mass": None, "ap": None}
            continue
        start = time.perf_counter()
        scores = run[name]()
        whole = spread(scores, p.row.sentences, len(p.prompt_ids))  # (N,)
        out["methods"][name] = {"seconds": time.perf_counter() - start}
        score_maps(out, layout, {name: whole})
        out["peers"][name] = {"scores": [float(s) for s in scores]}
    out["n_sentences"], out["seconds"], out["command"] = len(p.row.sentences), time.perf_counter() - t0, cfg.command
    return out


def run_peers(bundle, rows: list[dict[str, Any]], train_rows: list[dict[str, Any]], cfg: PeerConfig,
              workdir: str | Path, results_path: str | Path | None = None,
              log: Callable[[str], None] | None = None,
              measure: Callable | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """The peers of `cfg.peers` on every row not yet in `results_path` (each appended as it finishes, so a rerun
    resumes; AT2 is trained first, and not at all when every row is done or it is not asked for), as rows of the `lds`
    command's results (joinable with `lds --report`): id, answer, dtype, "methods" {"context-cite": {"lds",
    "drop@k"}, "at2": {...}} (our LDS of their scores, our top-k drops) and "peers" with the rest: their own LDS
    ("lds_theirs"), the largest per-token log p difference, their scores. A row without an answer or with fewer than 2
    sentences is kept as {id, error}. `measure` (default `peer_row`) measures a row from (bundle, row, estimator,
    cfg): `peer_needle_row` measures the hit ratio's needle prompts instead.

    Returns:
        The results of `rows`, in row order (those read back from `results_path` included).
    """
    done = {r["id"]: r for r in read_results(results_path)}
    todo = [r for r in rows if r["id"] not in done]
    if todo:
        estimator = None
        if "at2" in cfg.peers:
            train = [p for p in (_prepared(bundle, r, cfg) for r in train_rows) if p]
            estimator = train_at2(bundle, train, cfg, workdir)
        one = measure or peer_row
        measure_rows(todo, lambda row: one(bundle, row, estimator, cfg), done, results_path, bundle.model, log)
    return [done[r["id"]] for r in rows if r["id"] in done]


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def parse_peers(text: str) -> tuple[str, ...]:
    """The peers of `--peers context-cite,at2`, checked to be known and installed.

    Raises:
        InputError: an unknown name, or a peer whose optional package is not installed (says how to install it).
    """
    peers = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    if not peers or set(peers) - set(PEERS):
        raise InputError(f"--peers: choose from {', '.join(PEERS)}, got {text!r}.")
    missing = [n for n in peers if not _installed(PEER_MODULES[n])]
    if missing:
        raise InputError(
            f"--peers {','.join(missing)} needs the optional extras, which are not installed: pip install '.[peers]' "
            "(context-cite 0.0.4 and at2 0.0.1; best in a separate virtual environment)."
        )
    return peers
