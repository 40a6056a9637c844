"""Sources' surrogate (`explainer/methods/sources.py`, `surrogate.py`) against a straightforward computation: every
ablated prompt run on its own (its units' tokens taken out, one plain forward), and the ridge fit written out with
explicit leave-one-out refits; the per-token maps summed over units; the design; bad input and cancellation."""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest
import torch

from explainer import bundle_from_objects, explain, get_method
from explainer.capture import registered_names
from explainer.errors import Cancelled, InputError
from explainer.eval.lds import source_scores
from explainer.methods import GenerationRun
from explainer.methods.lasso import LASSO_GRID, lasso
from explainer.methods.saturating import saturating
from explainer.methods.sources import SourcesConfig, passages, units
from explainer.methods.surrogate import (
    RIDGE_GRID,
    SPARSE_KEEP,
    chosen_regulariser,
    design,
    design_kind,
    distinct_pairs,
    lasso_fit,
    sparse_columns,
    surrogate_fit,
)
from explainer.runtime.memory import BUDGET_ENV, MemoryLimitError
from explainer.runtime.session import CancelToken, hold, model_lock

from ...conftest import BUILDERS, build_model
from ...reference import reference_knockout_logprobs
from .test_atman import greedy_sequences

PROMPT = (
    "Paris is the capital of France. The quick brown fox jumps. Berlin is the capital of Germany. "
    "Numbers 0123456789 follow. Rome is in Italy. Question: What is the capital of France?"
)
K = 4


@pytest.fixture(scope="module")
def run(tokenizer):
    out = {}
    for kind, (model, ids, n) in greedy_sequences(tokenizer, PROMPT, K).items():
        tokens = bundle_from_objects(model, tokenizer, name=kind).readable(ids[0, :n].tolist())
        out[kind] = GenerationRun(model=model, input_ids=ids, num_prompt_tokens=n, prompt_tokens=tokens)
    return out


def _solo_logprobs(model, ids: list[int], answer: list[int]) -> np.ndarray:
    """(K,) log p of each answer token after `ids`: one plain forward, no cache, no batch."""
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=torch.tensor([ids + answer])).logits[0].double(), dim=-1)
    return np.array([float(logp[len(ids) - 1 + k, t]) for k, t in enumerate(answer)])


def _explicit_ridge(x: np.ndarray, y: np.ndarray, penalty: float) -> np.ndarray:
    """(U + 1, K) ridge coefficients, intercept unpenalised, as the least-squares solution of the augmented system."""
    a = np.concatenate([np.ones((len(x), 1)), x], axis=1)
    root = np.sqrt(penalty) * np.eye(a.shape[1])[1:]  # (U, U + 1) rows: sqrt(penalty) * w_u = 0
    coef, *_ = np.linalg.lstsq(np.concatenate([a, root]), np.concatenate([y, np.zeros((len(root), y.shape[1]))]),
                               rcond=None)  # fmt: skip
    return coef


def _reference(r: GenerationRun, masks: np.ndarray, fitted: int):
    """Each mask's prompt run alone, and the ridge whose penalty has the least explicit leave-one-out error."""
    n, ids = r.num_prompt_tokens, r.input_ids[0].tolist()
    groups = units(r.prompt_tokens, list(range(n)), "sentence")
    logp = []
    for mask in masks:
        drop = {p for u, g in enumerate(groups) if not mask[u] for p in range(g.start, g.stop) if p != n - 1}
        logp.append(_solo_logprobs(r.model, [t for i, t in enumerate(ids[:n]) if i not in drop], ids[n:]))
    logp = np.array(logp)  # (R, K)
    x, y = masks[:fitted].astype(float), logp[:fitted]
    errors = []
    for penalty in RIDGE_GRID:
        scaled = penalty * len(x) / 4
        loo = [y[i] - np.concatenate([[1.0], x[i]]) @ _explicit_ridge(np.delete(x, i, 0), np.delete(y, i, 0), scaled)
               for i in range(len(x))]  # fmt: skip
        errors.append(float(np.sum(np.square(loo))))
    best = RIDGE_GRID[int(np.argmin(errors))]
    return groups, logp, _explicit_ridge(x, y, best * len(x) / 4), best


@pytest.mark.parametrize("kind", list(BUILDERS))
@pytest.mark.parametrize("ablations", [5, 16])
def test_the_fit_equals_solo_runs_and_an_explicit_ridge(run, kind, ablations):
    r = run[kind]
    method = get_method("sources", ablations=ablations, check=3, batch_size=4, regulariser="ridge")
    raw = method.explain(r)
    meta = method.meta()
    masks = np.array(meta["masks"]["keep"], dtype=bool)
    assert masks.shape[0] == 1 + ablations + 3 and masks[0].all() and meta["ablations"] == ablations
    groups, logp, coef, penalty = _reference(r, masks, 1 + ablations)
    assert [tuple(u) for u in meta["masks"]["units"]] == [(g.start, g.stop) for g in groups] and len(groups) == 6
    np.testing.assert_allclose(meta["masks"]["log_p"], logp, atol=2e-4)  # batched over the cache == one by one
    assert meta["penalty"] == penalty and meta["regulariser"] == "ridge"
    spans = [list(range(g.start, g.stop)) for g in groups]
    np.testing.assert_allclose(source_scores(raw, spans), coef[1:].T, atol=2e-3)  # (K, U): per token, per unit
    np.testing.assert_allclose(meta["masks"]["intercepts"], coef[0], atol=2e-3)
    assert raw.dtype == np.float32 and raw.shape == (K, r.num_prompt_tokens)
    for g in groups:  # a unit's weight spread evenly over its tokens
        assert np.allclose(raw[:, g.start : g.stop], raw[:, g.start : g.start + 1])
    whole = coef[1:].sum(axis=1)  # the whole answer's weights: the sum of the tokens' fits
    starts = [g.start for g in groups]
    listed = {s["start"]: s["score"] for s in meta["sources"]}  # a unit's whole-answer weight
    assert sorted(listed) == starts
    np.testing.assert_allclose([listed[s] for s in starts], whole, atol=4e-3)
    assert list(listed.values()) == sorted(listed.values(), reverse=True)
    assert meta["held_out_spearman"] is None or -1 <= meta["held_out_spearman"] <= 1
    assert registered_names() == []


def test_a_saturating_surrogate_is_the_saturating_fit_of_solo_runs(run):
    """`regulariser=saturating` where the 6 sentences are fewer than the masks: the map is `saturating` fitted to
    each mask's prompt run alone."""
    r = run["llama"]
    method = get_method("sources", ablations=8, check=0, regulariser="saturating")
    raw = method.explain(r)
    meta = method.meta()
    masks = np.array(meta["masks"]["keep"], dtype=bool)
    groups, logp, _, _ = _reference(r, masks, len(masks))
    weights, intercepts, penalty, _ = saturating(masks, logp)  # the same rows, measured one by one
    spans = [list(range(g.start, g.stop)) for g in groups]
    np.testing.assert_allclose(source_scores(raw, spans), weights, atol=2e-3)
    np.testing.assert_allclose(meta["masks"]["intercepts"], intercepts, atol=2e-3)
    assert meta["regulariser"] == "saturating" and meta["penalty"] == penalty


def test_signed_scores_and_the_fit_s_quality_are_recorded(run):
    method = get_method("sources", ablations=24, check=6)
    start = time.perf_counter()
    raw = method.explain(run["llama"])
    took = time.perf_counter() - start
    meta = method.meta()
    passes, fit = meta["passes_seconds"], meta["fit_seconds"]  # its time split: the passes, then the fit
    assert 0 < passes and 0 < fit and passes + fit < took
    assert meta["fit"] == "surrogate" and meta["checks"] == 6
    assert meta["design"] == design_kind(meta["units_scored"], 24, "hadamard")
    assert isinstance(meta["held_out_spearman"], float) and isinstance(meta["cross_validated_spearman"], float)
    assert (raw < 0).any() or (raw > 0).all()  # signed: nothing clips them


def test_the_pairs_design_is_complementary_balanced_and_nested():
    m = design(7, 16, "pairs", seed=3)
    assert m.shape == (16, 7) and m.dtype == bool
    assert (m[0::2] == ~m[1::2]).all() and (m.sum(axis=0) == 8).all()
    assert (design(7, 256, "pairs", seed=3)[:16] == m).all()  # a smaller design is the start of a larger one
    odd = design(5, 9, "pairs", seed=1)
    assert odd.shape == (9, 5) and (odd[0:8:2] == ~odd[1:8:2]).all() and (odd == design(5, 10, "pairs", 1)[:9]).all()
    assert (design(4, 6, "pairs", seed=2) == design(4, 6, "pairs", seed=2)).all()
    assert design(3, 1, "pairs").shape == (1, 3)
    with pytest.raises(ValueError, match="design"):
        design(3, 4, "plackett")


@pytest.mark.parametrize("bad", [{"ablations": 0}, {"ablations": 257}, {"check": -1}, {"fit": "lasso"},
                                 {"design": "plackett"}, {"passes": "attention"}])  # fmt: skip
def test_bad_options_are_refused_with_a_clear_message(bad):
    with pytest.raises(InputError, match=next(iter(bad))):
        get_method("sources", **bad)


def test_a_prompt_with_one_unit_says_it_needs_two(tokenizer):
    (model, ids, n) = greedy_sequences(tokenizer, "What is the capital of France?", 2)["llama"]
    tokens = bundle_from_objects(model, tokenizer, name="llama").readable(ids[0, :n].tolist())
    with pytest.raises(InputError, match="at least two"):
        get_method("sources").explain(GenerationRun(model, ids, n, prompt_tokens=tokens))


def test_a_request_too_large_for_memory_is_refused_before_it_runs(tokenizer, monkeypatch):
    bundle = bundle_from_objects(build_model("llama"), tokenizer, name="tiny-llama")
    monkeypatch.setenv(BUDGET_ENV, "2KB")
    with pytest.raises(MemoryLimitError, match="sources"):
        explain(bundle, PROMPT, methods=["sources"], max_new_tokens=3)


def test_a_cancel_between_the_ablation_passes_stops_and_leaves_nothing_running(run):
    r = run["qwen2"]
    token, seen = CancelToken(), []

    def progress(fraction, message):
        seen.append(fraction)
        token.cancel()

    with pytest.raises(Cancelled), hold(r.model, token):
        get_method("sources", ablations=16, batch_size=2).explain(
            GenerationRun(r.model, r.input_ids, r.num_prompt_tokens, prompt_tokens=r.prompt_tokens, progress=progress)
        )
    assert len(seen) == 1 and seen[0] < 1
    assert registered_names() == [] and r.model.config._attn_implementation == "sdpa"
    assert not model_lock(r.model).locked()


def test_a_label_marker_and_its_punctuation_stay_out_of_the_passages():
    tokens = ["Question", ":", " Who", "?", "\n", "Context", ":", " Norman", " art", " rose", ".", " They", " built",
              "."]  # fmt: skip
    positions = list(range(len(tokens)))

    def spans(cfg):
        return [(g.start, g.stop) for g in passages(tokens, positions, cfg)]

    sentence = SourcesConfig(context="Context")
    assert spans(sentence) == [(7, 11), (11, 14)]  # " Norman art rose.", " They built."; "Context:" stays
    assert spans(SourcesConfig(context="Context", unit="word"))[:2] == [(7, 8), (8, 9)]  # the label's ":" is no unit
    alone = ["Question", ":", " Who", "?", "\n", "Context", ":", "\n", "Norman", " art", ".", " They", " built", "."]
    assert [(g.start, g.stop) for g in passages(alone, positions, sentence)][0][0] == 8  # nothing after the label
    assert spans(SourcesConfig(context="art"))[0] == (9, 11)  # a marker inside a sentence: the rest of it, then on
    with pytest.raises(InputError, match="needs at least two"):
        passages(tokens, positions, SourcesConfig(context="built"))  # nothing but the final "." after it


def test_the_default_design_leaves_units_out_one_at_a_time_then_pairs():
    m = design(5, 16, "loo_pairs", seed=0)
    assert m.shape == (16, 5) and (m[:5].sum(axis=1) == 4).all() and sorted(np.argmin(m[:5], axis=1)) == [0, 1, 2, 3, 4]
    assert (m[5:] == design(5, 11, "pairs", seed=0)).all()
    few = design(6, 6, "loo_pairs", seed=1)  # at most half of the masks leave one out
    assert (few[:3].sum(axis=1) == 5).all() and (few[3:] == design(6, 3, "pairs", seed=1)).all()


def test_the_passages_start_after_a_marker_and_what_precedes_them_scores_zero(run):
    r = run["llama"]
    groups = units(r.prompt_tokens, list(range(r.num_prompt_tokens)), "sentence")
    method = get_method("sources", context="Berlin", ablations=8)
    raw = method.explain(r)
    spans = [tuple(u) for u in method.meta()["masks"]["units"]]
    after = next(p for p in range(groups[2].start, groups[2].stop) if "Berlin" in "".join(r.prompt_tokens[:p]))
    assert r.prompt_tokens[after].strip() and "Berlin" not in "".join(r.prompt_tokens[after : groups[2].stop])
    assert spans == [(after, groups[2].stop)] + [(g.start, g.stop) for g in groups[3:]]  # " is the capital of ..." on
    assert (raw[:, :after] == 0).all() and np.abs(raw[:, after:]).sum() > 0
    keep = np.array(method.meta()["masks"]["keep"])
    assert keep.shape == (1 + 8, 4)  # no check masks by default
    with pytest.raises(InputError, match="holds 'Paris, Texas'"):
        get_method("sources", context="Paris, Texas").explain(r)




def _interactions_aliased(m: np.ndarray) -> float:
    """The largest correlation, over the masks, of a unit's +-1 column with any two units' product (0: every main
    effect is free of every two-unit interaction)."""
    x = m.astype(float) * 2 - 1
    worst = 0.0
    for a in range(x.shape[1]):
        for b in range(x.shape[1]):
            for c in range(b + 1, x.shape[1]):
                worst = max(worst, abs(float(x[:, a] @ (x[:, b] * x[:, c]))) / len(x))
    return worst


@pytest.mark.parametrize("units_", [3, 4, 5, 8, 9, 15])
def test_the_hadamard_design_is_orthogonal_balanced_and_folded_where_it_fits(units_):
    m = design(units_, 16, "hadamard", seed=2)
    x = m.astype(float) * 2 - 1
    if units_ <= 4:  # every mask but the unperturbed one, each once: nothing left to fill
        assert len(m) == 2**units_ - 1 and len({r.tobytes() for r in m}) == len(m) and not m.all(axis=1).any()
        return
    assert m.shape == (16, units_) and (m.sum(axis=0) == 8).all()  # balanced
    np.testing.assert_array_equal(x.T @ x, 16 * np.eye(units_))  # orthogonal columns, an explicit check
    if units_ == 5:  # the half fraction: checked in its own test
        return
    if units_ <= 8:  # folded: the second half is the first's complement, and no effect carries an interaction
        assert (m[8:] == ~m[:8]).all() and _interactions_aliased(m) == 0
    else:
        assert _interactions_aliased(m) > 0  # 16 masks cannot fold 9 units: resolution III
    assert not (design(units_, 16, "hadamard", seed=3) == m).all()  # the seed draws another design


@pytest.mark.parametrize("units_", [2, 3, 4, 5, 8, 9, 15, 16, 40])
def test_the_design_s_name_says_what_its_masks_are(units_):
    """`design_kind`, which the Sources view shows, against the masks themselves: every mask once, a fold (the second
    half the first's complement, columns orthogonal), a plain orthogonal design, or sparse columns."""
    m = design(units_, 16, "hadamard", seed=4)
    x = m.astype(float) * 2 - 1
    orthogonal = len(m) == 16 and (x.T @ x == 16 * np.eye(units_)).all()
    expected = (
        "every mask" if len({r.tobytes() for r in m}) == 2**units_ - 1 == len(m)
        else "half fraction" if orthogonal and len(m) == 2 ** (units_ - 1) and ((~m).sum(axis=1) % 2 == 1).all()
        else "folded Hadamard" if orthogonal and (m[8:] == ~m[:8]).all()
        else "Hadamard" if orthogonal
        else "complementary pairs" if (m[::2] == ~m[1::2]).all()
        else "sparse" if (m.sum(axis=0) == round(SPARSE_KEEP * 16)).all()
        else None
    )  # fmt: skip
    assert design_kind(units_, 16, "hadamard") == expected
    assert design_kind(units_, 16, "loo_pairs") == "leave-one-out then pairs"


def _alias_words(m: np.ndarray) -> list[tuple[int, int, int]]:
    """Every three units whose +-1 columns multiply to a constant over the masks (each unit's effect aliased in full
    with the other two's interaction), by explicit loops."""
    x = m.astype(float) * 2 - 1
    u = x.shape[1]
    return [(a, b, c) for a in range(u) for b in range(a + 1, u) for c in range(b + 1, u)
            if abs(float(np.prod(x[:, [a, b, c]], axis=1).sum())) == len(x)]  # fmt: skip


def _words(m: np.ndarray) -> int:
    """How many such words the masks hold."""
    return len(_alias_words(m))


@pytest.mark.parametrize(("units_", "fewest"), [(9, 4), (10, 8), (11, 12), (12, 16), (13, 22), (14, 28), (15, 35)])
def test_the_aberration_design_aliases_the_fewest_interactions_a_16_run_design_can(units_, fewest):
    """The minimum-aberration 16-run designs' word counts (Box, Hunter & Hunter, ch. 6), checked on the masks; the
    design stays orthogonal and balanced, and random columns average more words where a choice exists."""
    for seed in range(6):
        m = design(units_, 16, "aberration", seed)
        x = m.astype(float) * 2 - 1
        assert m.shape == (16, units_) and (m.sum(axis=0) == 8).all()
        np.testing.assert_array_equal(x.T @ x, 16 * np.eye(units_))
        assert _words(m) == fewest
    drawn = np.mean([_words(design(units_, 16, "hadamard", seed)) for seed in range(12)])
    assert drawn >= fewest and (drawn > fewest or units_ >= 13)  # 13-15 units: every choice has as many


def test_the_aberration_design_is_the_hadamard_one_where_the_design_is_not_plain():
    for units_, k in ((3, 16), (8, 16), (20, 16), (12, 32), (16, 24), (5, 8), (7, 8)):  # 8 runs: no choice
        np.testing.assert_array_equal(design(units_, k, "aberration", 5), design(units_, k, "hadamard", 5))
    assert design_kind(12, 16, "aberration") == "Hadamard"


def test_the_hadamard_design_falls_back_where_no_orthogonal_design_fits():
    assert (design(16, 16, "hadamard", seed=1) == sparse_columns(16, 16, seed=1)).all()
    assert (design(16, 16, "distinct_pairs", seed=1) == distinct_pairs(16, 16, seed=1)).all()  # the former fallback
    m = design(6, 24, "hadamard", seed=0)  # 16 folded masks, then 8 pairs
    assert m.shape == (24, 6) and (m[8:16] == ~m[:8]).all() and (m[16::2] == ~m[17::2]).all()
    m = design(5, 24, "hadamard", seed=0)  # the half fraction's 16 masks, then 8 pairs
    assert m.shape == (24, 5) and ((~m[:16]).sum(axis=1) % 2 == 1).all() and (m[16::2] == ~m[17::2]).all()


def _shortest_word(m: np.ndarray) -> int:
    """The fewest units whose +-1 columns multiply to a constant (the design's resolution), by explicit loops over
    every set of units."""
    x = m.astype(float) * 2 - 1
    u = x.shape[1]
    sets = (s for size in range(1, u + 1) for s in itertools.combinations(range(u), size))
    return min((len(s) for s in sets if abs(float(np.prod(x[:, list(s)], axis=1).sum())) == len(x)), default=u + 1)


@pytest.mark.parametrize(("units_", "k"), [(5, 16), (5, 20), (6, 32), (7, 64)])
def test_the_half_fraction_has_resolution_u_and_holds_every_leave_one_out_mask(units_, k):
    """From 5 units, where 2^(U - 1) masks fit but not every mask: the masks that remove an odd number of units, each
    once. Its one word holds every unit (a fold's shortest has 4), each unit's leave-one-out mask is among them and
    the unperturbed prompt is not (its row is the fit's 17th point); every seed gives the same set."""
    n = 2 ** (units_ - 1)
    m = design(units_, k, "hadamard", seed=3)
    half = m[:n]
    x = half.astype(float) * 2 - 1
    assert len({r.tobytes() for r in half}) == n and ((~half).sum(axis=1) % 2 == 1).all()
    np.testing.assert_array_equal(x.T @ x, n * np.eye(units_))  # balanced and orthogonal
    assert _shortest_word(half) == units_
    assert _shortest_word(design(units_ + 1, n, "hadamard", seed=3)) == 4  # the fold a unit more gets (resolution IV)
    assert {r.tobytes() for r in ~np.eye(units_, dtype=bool)} <= {r.tobytes() for r in half}
    assert not half.all(axis=1).any()
    other = design(units_, k, "hadamard", seed=4)[:n]
    assert {r.tobytes() for r in other} == {r.tobytes() for r in half}
    assert design_kind(units_, k, "hadamard") == "half fraction"
    assert design_kind(4, 8, "hadamard") == "folded Hadamard"  # below 5 units a fold is as good: kept


def test_the_sparse_fallback_keeps_each_unit_in_the_same_few_masks_and_gives_it_its_own_column():
    """Each column holds exactly round(SPARSE_KEEP x k) kept masks (so a mask keeps about that share of the prompt),
    and, as for the pairs, no two units share a column while the units are at most C(k, m)."""
    m_kept = round(SPARSE_KEEP * 16)
    for count in (16, 43, 175, 1000):
        m = design(count, 16, "hadamard", seed=0)
        assert m.shape == (16, count) and (m.sum(axis=0) == m_kept).all()
        assert len({m[:, u].tobytes() for u in range(count)}) == count
        assert abs(m.mean() - m_kept / 16) < 1e-12 and not (m[::2] == ~m[1::2]).all()
    assert sparse_columns(43, 16, seed=0, keep=0.25).sum(axis=0).tolist() == [4] * 43
    few = sparse_columns(12, 4, seed=0, keep=0.5)  # C(4, 2) = 6 columns for 12 units: repeats remain, still a design
    assert few.shape == (4, 12) and (few.sum(axis=0) == 2).all()
    assert not (sparse_columns(43, 16, seed=1) == sparse_columns(43, 16, seed=0)).all()
    assert (sparse_columns(2, 1, seed=0) == 1).all()  # one mask: it keeps every unit (m is clamped to 1)


def test_the_distinct_pairs_give_every_unit_its_own_column():
    """Two units removed by the same masks can never be told apart: plain pairs of 16 masks have 2^8 codes, so among
    175 units some share one; `distinct_pairs` (the fallback before 2026-12-03) draws a repeated code again while
    the units are at most 256."""
    for count in (16, 46, 175, 256):
        m = design(count, 16, "distinct_pairs", seed=0)
        assert m.shape == (16, count) and (m[::2] == ~m[1::2]).all() and (m.sum(axis=0) == 8).all()
        assert len({m[:, u].tobytes() for u in range(count)}) == count
    plain = design(175, 16, "pairs", seed=0)
    assert len({plain[:, u].tobytes() for u in range(175)}) < 175
    assert design(300, 16, "distinct_pairs", seed=0).shape == (16, 300)  # beyond 256 codes repeats remain
    odd = distinct_pairs(43, 15, seed=2)  # 7 pairs and one unpaired mask
    assert odd.shape == (15, 43) and (odd[0:14:2] == ~odd[1:14:2]).all()
    assert len({odd[:14, u].tobytes() for u in range(43)}) == 43


def test_knockout_passes_recompute_only_what_follows_the_passages(run):
    r = run["llama"]
    n, ids = r.num_prompt_tokens, r.input_ids[0]
    method = get_method("sources", ablations=6, check=0, passes="knockout", context="Paris")
    method.explain(r)
    meta = method.meta()
    spans = meta["masks"]["units"]
    reread = min(spans[-1][1], n - 1)  # the last prompt position is always re-read: it predicts the first token
    keep = np.array(meta["masks"]["keep"], dtype=bool)
    for mask, got in zip(keep, meta["masks"]["log_p"]):
        removed = {p for u, (a, b) in enumerate(spans) if not mask[u] for p in range(a, b) if p != n - 1}
        want = reference_knockout_logprobs(r.model, ids[:n].tolist(), ids[n : n + K].tolist(), removed, reread)
        np.testing.assert_allclose(got, want, atol=2e-4)
    assert meta["passes"] == "knockout"
    assert meta["forward_positions"] == (n + K - 1) * len(keep) - reread * (len(keep) - 1)


def test_removal_passes_compute_only_their_kept_tokens_and_count_them(run):
    """Run alone (one row a pass), each removal computes the kept tokens from its first removed one, no more: what the
    model's forwards ran (counted by a hook) is meta.forward_positions."""
    r = run["llama"]
    seen = []
    handle = r.model.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(kwargs["input_ids"].numel()), with_kwargs=True
    )
    try:
        method = get_method("sources", ablations=6, check=2, batch_size=1, context="Paris")
        method.explain(r)
    finally:
        handle.remove()
    meta = method.meta()
    keep = np.array(meta["masks"]["keep"], dtype=bool)
    n, t = r.num_prompt_tokens, r.num_prompt_tokens + K - 1
    spans = meta["masks"]["units"]
    runs = [m for m in keep if not m.all()]
    assert seen[0] == t and len(seen) == 1 + len(runs)
    want = t
    for mask in runs:  # by hand: the prompt's kept positions from the first removed unit's start, then the answer's
        removed = {p for u, (a, b) in enumerate(spans) if not mask[u] for p in range(a, b) if p != n - 1}
        want += sum(1 for p in range(min(removed), n) if p not in removed) + K - 1
    assert sum(seen) == meta["forward_positions"] == want < t * len(keep)


def test_the_lasso_meets_its_optimality_conditions_and_soft_thresholds_an_orthogonal_design():
    rng = np.random.default_rng(4)
    x = design(24, 16, "random", 0).astype(float)  # more units than masks: a sparse fit's case
    truth = np.zeros((24, 3))
    truth[[3, 7, 11]] = [[2.0, 1.0, 0.4], [-1.5, -0.7, 0.0], [1.0, 0.5, 0.2]]
    y = x @ truth + rng.normal(scale=0.05, size=(16, 3)) - 4.0
    penalty = np.array([0.05, 0.02, 0.01])
    w, b = lasso(x, y, penalty)
    xc, r = x - x.mean(axis=0), y - b - x @ w  # (R, U), (R, K)
    grad = xc.T @ r / len(x)  # (U, K): the subgradient conditions, checked unit by unit
    for j in range(24):
        for k in range(3):
            if w[j, k] == 0:
                assert abs(grad[j, k]) <= penalty[k] + 2e-5  # the solver stops at 1e-4 of the targets' range
            else:
                assert grad[j, k] == pytest.approx(penalty[k] * np.sign(w[j, k]), abs=2e-5)
    np.testing.assert_allclose(r.mean(axis=0), 0.0, atol=1e-9)  # the intercept is unpenalised
    h = design(6, 16, "hadamard", 0).astype(float)  # folded Hadamard: balanced, orthogonal columns (norm 16 / 4)
    z = h @ np.array([[2.0], [-1.0], [0.05], [0.5], [-0.02], [0.0]]) + 3.0
    ols = np.linalg.lstsq(np.c_[np.ones(16), h], z, rcond=None)[0][1:]
    want = np.sign(ols) * np.maximum(np.abs(ols) - 0.1 * 16 / 4, 0.0)
    np.testing.assert_allclose(lasso(h, z, np.array([0.1]))[0], want, atol=1e-9)


def test_the_lasso_fit_recovers_a_sparse_answer_that_the_ridge_smears():
    rng = np.random.default_rng(5)
    x = np.concatenate([np.ones((1, 24), dtype=bool), design(24, 16, "random", 3)])
    truth = np.zeros(24)
    truth[[3, 7, 11]] = [2.0, -1.5, 1.0]
    y = (x @ truth)[:, None] * np.array([[1.0, 0.5, 0.2]]) + rng.normal(scale=0.02, size=(17, 3))
    lasso_error = np.abs(lasso_fit(x, y).weights.sum(axis=0) - 1.7 * truth).sum()
    ridge_error = np.abs(surrogate_fit(x, y, "ridge").weights.sum(axis=0) - 1.7 * truth).sum()
    assert lasso_error < 0.3 * ridge_error
    got = surrogate_fit(x, y, "lasso")
    assert got.checked.shape == y.shape and 0 <= got.penalty <= max(LASSO_GRID)
    with pytest.raises(ValueError, match="regulariser"):
        surrogate_fit(x, y, "elastic")
    with pytest.raises(ValueError, match="ridge, lasso or saturating here"):
        surrogate_fit(x, y, "auto")
    with pytest.raises(InputError, match="regulariser must be one of auto, ridge, lasso"):
        get_method("sources", regulariser="l0")


def test_auto_fits_the_ridge_where_units_are_fewer_than_masks_and_the_lasso_elsewhere():
    assert chosen_regulariser(5, 6, "auto") == "ridge" and chosen_regulariser(15, 16, "auto") == "ridge"
    assert chosen_regulariser(6, 6, "auto") == "lasso" and chosen_regulariser(43, 16, "auto") == "lasso"
    assert chosen_regulariser(43, 16, "ridge") == "ridge" and chosen_regulariser(3, 16, "lasso") == "lasso"
    with pytest.raises(ValueError, match="regulariser must be one of auto, ridge, lasso"):
        chosen_regulariser(3, 16, "l1")


@pytest.mark.parametrize("options", [{"regulariser": "lasso"}, {}], ids=["lasso", "auto"])
def test_a_lasso_surrogate_is_the_lasso_of_solo_runs(run, options):
    """Explicitly, and by default where the 6 sentences outnumber the 5 masks."""
    r = run["llama"]
    method = get_method("sources", ablations=5, check=0, **options)
    raw = method.explain(r)
    meta = method.meta()
    masks = np.array(meta["masks"]["keep"], dtype=bool)
    groups, logp, _, _ = _reference(r, masks, len(masks))
    want = lasso_fit(masks, logp)  # the same rows, measured one by one
    spans = [list(range(g.start, g.stop)) for g in groups]
    np.testing.assert_allclose(source_scores(raw, spans), want.weights, atol=2e-3)
    assert meta["regulariser"] == "lasso" and meta["penalty"] == want.penalty
    nonzero = {(g.start, g.stop) for u, g in enumerate(groups) if np.any(want.weights[:, u] != 0)}
    listed = {(s["start"], s["stop"]) for s in meta["sources"]}
    assert listed == nonzero or (not nonzero and len(listed) == 1)  # the units left at 0 are not listed
