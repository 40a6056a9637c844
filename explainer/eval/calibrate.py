"""Fitting `macs_calibrated`'s layer weights with AT2's objective on ablations of training prompts (the `calibrate`
command).

AT2 ("Learning to Attribute with Attention", MadryLab 2025, section 3) fits one weight per attention head so that
attention predicts what ablating the context's sources does to the response: per training prompt, 32 random masks
over the sources (each kept with probability 1/2), the response's log-probability measured under each, and a loss of
minus the Pearson correlation over the masks between the measured values and the surrogate's predictions. Here:

1. Per SQuAD row, the model answers the QA prompt (`evaluate.qa_prompt`) greedily while MACS keeps its per-layer
   factors (`keep_layers`, (K, L, N)); the sources are the context's sentences, as in `lds_eval`; the response is the
   answer's content tokens. The masks' log-probabilities come from `ablate.response_logprobs` (removal over a prefix
   cache). This is the slow part; each row is cached as one .npz file, so a stopped run resumes where it stopped.
2. With weights w (L,), a token's score at step k is exp(sum_l w_l log f_lkn) (`macs_calibrated`), a sentence's score
   the sum over its tokens and the answer's steps (as `lds.source_scores`), a mask's prediction the sum of its kept
   sentences' scores. Loss: minus the mean over rows of the Pearson correlation of prediction and the response's
   log-probability, plus `l2` x mean (w_l - 1)^2 (0.1), which keeps a fit on few rows near MACS (w = 1); L-BFGS.

Image prompts (`collect_image_row`): the sources are the image's regions (its grid of merged image tokens cut into at
most `image_cells` x `image_cells` rectangles, `image_regions`) and the question's sentences; a mask's sources are
hidden from the queries that predict the answer, as the reliance knockout hides the image (`reliance.
knockout_logprobs`: removing image tokens would change the image's layout), and the fit is the same.
"""

from __future__ import annotations

import hashlib
import json
import time
import zlib
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import InputError
from ..explain import explain
from ..methods.calibration import CalibrationWeights, config_fingerprint
from ..methods.macs import MACSConfig
from ..models.vision import encode_image_prompt, full_sequence_inputs
from ..reliance import knockout_logprobs
from ..result.segments import sentence_groups
from ..result.steps import last_content_step
from ..runtime.host import to_numpy
from .ablate import response_logprobs
from .lds import KEEP_PROBABILITY, MASKS, ablation_masks
from .lds_eval import LdsRow, answer_row


@dataclass
class CalibrateConfig:
    max_new_tokens: int = 16  # as the `lds` command: SQuAD answers are short
    masks: int = MASKS  # ablation masks per row (AT2: 32)
    keep: float = KEEP_PROBABILITY  # each sentence kept with this probability (AT2's alpha)
    seed: int = 0  # with each row's id, seeds its masks
    l2: float = 0.1  # pull towards w = 1 (MACS): a fit on few rows stays near it (leave-one-out on the shipped fit's
    # 10 training rows: LDS 0.582 / 0.608 / 0.594 / 0.578 at 0.01 / 0.1 / 1 / 10, MACS 0.570)
    iterations: int = 100  # L-BFGS iterations
    batch_size: int = 0  # most removal runs per forward; 0: from the device
    image_cells: int = 4  # image prompts: each image's token grid cut into at most 4 x 4 regions, the image's sources

    def cache_key(self, fingerprint: str) -> str:
        """What the cached rows depend on (not the fit's own settings): the model, the masks and MACS's settings."""
        facts = [fingerprint, self.max_new_tokens, self.masks, self.keep, self.seed, asdict(MACSConfig()),
                 self.image_cells]  # fmt: skip
        return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:12]


def collect_row(bundle, row: dict[str, Any], cfg: CalibrateConfig) -> dict[str, np.ndarray]:
    """One training row: MACS's log factors over the context's sentence tokens and the masks' measured log-probs.

    Returns:
        {"features": (K, L, P) float32 log f over the P sentence tokens, "source": (P,) int sentence of each,
        "masks": (M, S) bool, "actual": (M,) float64 log p(response) under each mask, "seconds": ()}.

    Raises:
        InputError: no answer, or fewer than 2 context sentences.
    """
    t0 = time.perf_counter()
    answered = answer_row(bundle, row, ["macs"], cfg.max_new_tokens, {"macs": {"keep_layers": True}})
    return ablate_answered(bundle, row, answered, cfg, t0)


def collect_forms_row(bundle, row: dict[str, Any], cfg: CalibrateConfig) -> dict[str, np.ndarray]:
    """`collect_row`'s arrays plus the maps the calibration forms (`forms.py`) blend or check against, over the same
    P sentence tokens: "macs" (K, P) float32, MACS's raw scores (the product of the layer factors, as `lds` reads
    them), and "sources" (K, P) float32, Sources' raw scores (its defaults), both from the same generation."""
    t0 = time.perf_counter()
    answered = answer_row(bundle, row, ["macs", "sources"], cfg.max_new_tokens, {"macs": {"keep_layers": True}})
    arrays = ablate_answered(bundle, row, answered, cfg, t0)
    flat = [p for s in answered.sentences for p in s]
    for name in ("macs", "sources"):
        arrays[name] = np.asarray(answered.attr.methods[name].raw[: answered.k], dtype=np.float32)[:, flat]  # (K, P)
    arrays["seconds"] = np.float64(time.perf_counter() - t0)
    return arrays


def ablate_answered(bundle, row: dict[str, Any], answered: LdsRow, cfg: CalibrateConfig, t0: float) -> dict:
    """`collect_row`'s arrays of a row answered with MACS keeping its layer factors (`lds_eval.answer_row`): its
    masks drawn and their log-probabilities measured by removal (`ablate.response_logprobs`)."""
    attr, sentences, k = answered.attr, answered.sentences, answered.k  # k: the content tokens, no end-of-sequence
    masks, dropped = _masks(row, sentences, attr.num_prompt_tokens, cfg)
    device = bundle.device
    logp = response_logprobs(
        bundle.model, torch.as_tensor(attr.prompt_token_ids, device=device),
        torch.as_tensor(attr.generated_token_ids[:k], device=device), torch.as_tensor(~dropped, device=device),
        cfg.batch_size,
    )  # fmt: skip  # (M, K)
    return _example(attr, sentences, k, masks, logp, t0)


def _masks(row: dict[str, Any], sources: list[list[int]], n: int, cfg: CalibrateConfig) -> tuple[np.ndarray, ...]:
    """((M, S) bool kept sources, seeded by the row's id; (M, N) bool prompt positions of the dropped ones)."""
    masks = ablation_masks(len(sources), cfg.masks, cfg.keep, [cfg.seed, zlib.crc32(str(row["id"]).encode())])
    dropped = np.zeros((len(masks), n), dtype=bool)  # (M, N)
    for i, mask in enumerate(masks):
        dropped[i, [p for s, kept in zip(sources, mask) if not kept for p in s]] = True
    return masks, dropped


def _example(attr, sources: list[list[int]], k: int, masks: np.ndarray, logp: np.ndarray, t0: float) -> dict:
    """A row's arrays (`collect_row`'s Returns) from MACS's kept layer factors and the masks' (M, K) log-probs."""
    flat = [p for s in sources for p in s]
    source = np.concatenate([np.full(len(s), i) for i, s in enumerate(sources)])  # (P,)
    features = np.log(attr.methods["macs"].layers[:k][:, :, flat])  # (K, L, P)
    return {"features": features.astype(np.float32), "source": source, "masks": masks,
            "actual": logp.sum(axis=1).astype(np.float64), "seconds": np.float64(time.perf_counter() - t0)}  # fmt: skip


def image_regions(image: dict[str, Any], cells: int) -> list[list[int]]:
    """The image sources of an image prompt (`Attribution.image`): each image's (h, w) grid of merged tokens cut into
    at most `cells` x `cells` rectangles, row-major, as lists of prompt positions."""
    regions = []
    for one in image.get("images") or [image]:
        h, w = one["grid"]
        grid = np.asarray(one["token_positions"]).reshape(h, w)  # (h, w) prompt positions
        for rows in np.array_split(np.arange(h), min(cells, h)):
            for cols in np.array_split(np.arange(w), min(cells, w)):
                regions.append(grid[np.ix_(rows, cols)].ravel().tolist())
    return regions


def collect_image_row(bundle, row: dict[str, Any], cfg: CalibrateConfig) -> dict[str, np.ndarray]:
    """One image training row ({"id", "image": a path or PIL image, "question"}): as `collect_row`, with the image's
    regions (`image_regions`) and the question's sentences as the sources, hidden from the answer's queries under each
    mask (`reliance.knockout_logprobs`).

    Raises:
        InputError: no answer, or fewer than 2 sources.
    """
    t0 = time.perf_counter()
    question, image = row["question"], row["image"]
    attr = explain(bundle, question, image=image, methods=["macs"], max_new_tokens=cfg.max_new_tokens,
                   method_options={"macs": {"keep_layers": True}}, reliance=False)  # fmt: skip
    shown = set(attr.image_token_positions)
    text = [p for p in attr.user_positions if p not in shown]
    sentences = [list(g.positions) for g in sentence_groups(attr.prompt_tokens, text) if g.kind == "sentence"]
    sources = image_regions(attr.image, cfg.image_cells) + sentences
    if attr.num_steps == 0 or len(sources) < 2:
        raise InputError(f"Row {row['id']!r}: no answer, or fewer than 2 sources to ablate.")
    k = last_content_step(attr) + 1
    masks, dropped = _masks(row, sources, attr.num_prompt_tokens, cfg)
    extra = full_sequence_inputs(encode_image_prompt(bundle, image, question).prefill_inputs, k)
    ids = torch.as_tensor([attr.prompt_token_ids + attr.generated_token_ids[:k]], device=bundle.device)  # (1, N + K)
    logp = knockout_logprobs(bundle.model, ids, attr.num_prompt_tokens, dropped, extra, cfg.batch_size or 8)  # (M, K)
    return _example(attr, sources, k, masks, logp, t0)


def collect(
    bundle, rows: list[dict[str, Any]], cfg: CalibrateConfig, cache: Path, progress: bool = True,
    measure: Callable[..., dict[str, np.ndarray]] | None = None,
) -> dict:  # fmt: skip
    """Every row's arrays (`measure`: `collect_row`, or `collect_image_row` for image rows), read from `cache` when
    measured before and written there when not.

    Returns:
        {"examples": [arrays], "row_ids": [ids used], "skipped": [ids without an answer or two sentences],
        "seconds": the measuring time of the used rows, earlier runs' included}.
    """
    from tqdm.auto import tqdm  # optional nicety of the command, not of the library

    cache.mkdir(parents=True, exist_ok=True)
    examples, used, skipped = [], [], []
    for row in tqdm(rows, desc="ablations", unit="row", disable=not progress):
        path = cache / f"{hashlib.sha1(str(row['id']).encode()).hexdigest()[:16]}.npz"
        if path.is_file():
            data = dict(np.load(path))
        else:
            try:
                data = (measure or collect_row)(bundle, row, cfg)
            except InputError:
                data = {"skipped": np.bool_(True)}
            np.savez(path, **data)
        if "skipped" in data:
            skipped.append(row["id"])
            continue
        examples.append(data)
        used.append(row["id"])
    seconds = float(sum(float(e["seconds"]) for e in examples))
    return {"examples": examples, "row_ids": used, "skipped": skipped, "seconds": seconds}


def _pearson(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    a, b = a - a.mean(), b - b.mean()
    return (a * b).sum() / torch.sqrt((a * a).sum() * (b * b).sum() + 1e-300)


def predictions(weights: torch.Tensor, example: dict[str, torch.Tensor]) -> torch.Tensor:
    """(M,) the surrogate's prediction for each mask: kept sentences' summed exp(sum_l w_l log f) scores. Each row's
    scores are divided by their largest, which the Pearson correlation ignores and float64 needs for deep models."""
    z = torch.einsum("klp,l->kp", example["features"], weights)  # (K, P)
    tokens = torch.exp(z - z.max()).sum(dim=0)  # (P,)
    n_sources = example["masks"].shape[1]
    scores = torch.zeros(n_sources, dtype=z.dtype, device=z.device).index_add(0, example["source"], tokens)  # (S,)
    return example["masks"] @ scores  # (M,)


def mean_pearson(weights: torch.Tensor, examples: list[dict[str, torch.Tensor]]) -> torch.Tensor:
    """The mean over rows of Pearson(prediction, measured log-probability): AT2's objective, to maximise."""
    return torch.stack([_pearson(predictions(weights, e), e["actual"]) for e in examples]).mean()


def _tensors(examples: Iterable[dict[str, np.ndarray]]) -> list[dict[str, torch.Tensor]]:
    out = []
    for e in examples:
        if np.ptp(e["actual"]) <= 0:  # every mask measured the same: no correlation to fit
            continue
        out.append({
            "features": torch.as_tensor(e["features"], dtype=torch.float64),
            "source": torch.as_tensor(e["source"], dtype=torch.long),
            "masks": torch.as_tensor(e["masks"], dtype=torch.float64),
            "actual": torch.as_tensor(e["actual"], dtype=torch.float64),
        })  # fmt: skip
    return out


def fit_weights(examples: list[dict[str, np.ndarray]], l2: float = 0.1, iterations: int = 100) -> dict[str, Any]:
    """Fit L layer weights from w = 1 (MACS) by L-BFGS on minus the mean Pearson plus `l2` x mean (w - 1)^2.

    Returns:
        {"weights": (L,) float64, "pearson_macs": the objective at w = 1, "pearson": at the fit, "rows": rows used,
        "seconds": fit time}.
    """
    t0 = time.perf_counter()
    data = _tensors(examples)
    if not data:
        raise InputError("No training row has both an answer and ablations that change its log-probability.")
    layers = data[0]["features"].shape[1]
    w = torch.ones(layers, dtype=torch.float64, requires_grad=True)
    optimiser = torch.optim.LBFGS([w], lr=1.0, max_iter=iterations, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        optimiser.zero_grad()
        loss = -mean_pearson(w, data) + l2 * ((w - 1.0) ** 2).mean()
        loss.backward()
        return loss

    with torch.no_grad():
        before = float(mean_pearson(torch.ones(layers, dtype=torch.float64), data))
    optimiser.step(closure)
    with torch.no_grad():
        after = float(mean_pearson(w, data))
    return {"weights": to_numpy(w).copy(), "pearson_macs": before, "pearson": after, "rows": len(data),
            "seconds": time.perf_counter() - t0}  # fmt: skip


def calibrate(
    bundle, rows: list[dict[str, Any]], cfg: CalibrateConfig, cache: Path, data_label: str, progress: bool = True,
    images: bool = False,
) -> CalibrationWeights:  # fmt: skip
    """Measure (or read from `cache`) every row's ablations, fit the weights, and return them with how they were made.

    Args:
        data_label: what the rows are, for people reading the file (the --data value, offset and limit).
        images: the rows are image questions ({"id", "image", "question"}, `collect_image_row`), else SQuAD rows.
    """
    fingerprint = config_fingerprint(bundle.model)
    folder = cache / f"{fingerprint}-{cfg.cache_key(fingerprint)}{'-images' if images else ''}"
    collected = collect(bundle, rows, cfg, folder, progress, collect_image_row if images else None)
    fit = fit_weights(collected["examples"], cfg.l2, cfg.iterations)
    info = {
        "data": data_label, "sources": "image regions and question sentences, hidden from the answer" if images
        else "context sentences, removed", "row_ids": collected["row_ids"], "rows_skipped": collected["skipped"],
        "objective": "AT2: -mean Pearson over each row's ablation masks of predicted vs measured log p(response), "
                     f"+ {cfg.l2} x mean (w - 1)^2",
        "pearson_train_macs": fit["pearson_macs"], "pearson_train": fit["pearson"], "rows_fitted": fit["rows"],
        **asdict(cfg), "macs": asdict(MACSConfig()), "dtype": str(next(bundle.model.parameters()).dtype),
        "ablation_seconds": collected["seconds"], "fit_seconds": fit["seconds"],
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }  # fmt: skip
    return CalibrationWeights(fingerprint, bundle.name, [float(x) for x in fit["weights"]], info)
