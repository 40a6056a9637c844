"""Sources' "informed" design (`surrogate.informed_columns`, `sources.overlap_prior`): a plain Hadamard design whose
columns are placed by a prior, checked on the masks by explicit loops over every three units, and the prior against a
count written out by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from explainer import get_method
from explainer.methods.sources import overlap_prior, passages
from explainer.methods.surrogate import design, design_kind

from .test_sources_surrogate import _alias_words, _words


def _cost(words: list[tuple[int, int, int]], prior: np.ndarray) -> float:
    """The interaction a design aliases with effects, weighted by the prior: each word's three pairs' products."""
    return sum(prior[a] * prior[b] + prior[a] * prior[c] + prior[b] * prior[c] for a, b, c in words)


def _prior(units_: int, seed: int) -> tuple[np.ndarray, list[int]]:
    """A prior with two clearly likeliest units (at random places) and small random values elsewhere."""
    rng = np.random.default_rng(seed)
    prior = rng.uniform(0.0, 0.1, units_)
    top = rng.permutation(units_)[:2].tolist()
    prior[top] = [1.0, 0.9]
    return prior, top


@pytest.mark.parametrize("units_", [9, 10, 11, 12, 13, 14])
def test_the_two_likeliest_units_interaction_lands_on_no_effect(units_):
    """At 9-14 units a 16-run design leaves a column free, and the informed design keeps the likeliest pair's product
    there; the design stays orthogonal and balanced, and aliases less prior-weighted interaction than the
    minimum-aberration design. Columns drawn without the prior alias that pair on some unit's effect in some draws
    (so the check can fail)."""
    hit_by_chance = 0
    for seed in range(8):
        prior, top = _prior(units_, seed)
        m = design(units_, 16, "informed", seed, prior)
        x = m.astype(float) * 2 - 1
        assert m.shape == (16, units_) and (m.sum(axis=0) == 8).all()
        np.testing.assert_array_equal(x.T @ x, 16 * np.eye(units_))
        words = _alias_words(m)
        assert not [w for w in words if set(top) <= set(w)]
        assert _cost(words, prior) < _cost(_alias_words(design(units_, 16, "aberration", seed)), prior)
        likeliest = np.argsort(-prior)[:8].tolist()  # they hold the columns of odd bit count: no word among them
        assert not [w for w in words if set(w) <= set(likeliest)]
        hit_by_chance += any(set(top) <= set(w) for w in _alias_words(design(units_, 16, "hadamard", seed)))
    assert hit_by_chance > 0


def test_a_flat_prior_gives_the_minimum_aberration_word_counts_and_none_the_hadamard_draw():
    for units_ in range(9, 16):
        np.testing.assert_array_equal(design(units_, 16, "informed", 3), design(units_, 16, "hadamard", 3))
        assert len(_alias_words(design(units_, 16, "informed", 3, np.zeros(units_)))) == _words(
            design(units_, 16, "aberration", 3)
        )


def test_the_informed_design_is_the_hadamard_one_where_the_design_is_not_plain():
    """Every mask, the half fraction, the fold and the fallback pairs hold no alias of an effect with a two-unit
    interaction, so the prior changes nothing there; nor in plain designs of 8, 32 or 64 masks (at 32 it was measured
    on development long contexts and not kept, at 8 and 64 not measured)."""
    for units_, k in ((3, 16), (5, 16), (8, 16), (20, 16), (12, 32), (16, 24), (6, 8), (20, 32), (40, 64)):
        prior = np.random.default_rng(units_).random(units_)
        np.testing.assert_array_equal(design(units_, k, "informed", 5, prior), design(units_, k, "hadamard", 5))
    assert design_kind(12, 16, "informed") == "overlap-placed Hadamard"  # the view names it
    assert design_kind(20, 32, "informed") == design_kind(12, 16, "hadamard") == "Hadamard"


def test_the_overlap_prior_counts_shared_tokens_weighted_by_the_units_that_hold_them():
    """Hand-written ids: units [0, 4), [4, 8), [8, 12); positions 12-13 a question, 14-15 the answer."""
    from explainer.result.segments import Group

    ids = np.array([5, 6, 7, 8, 5, 9, 10, 11, 5, 12, 13, 14, 9, 7, 7, 20])
    groups = [Group(0, 4, "", "sentence"), Group(4, 8, "", "sentence"), Group(8, 12, "", "sentence")]
    readers = [12, 13, 14, 15]  # ids 9, 7, 7, 20
    # unit 0 shares 7 (held by 1 unit); unit 1 shares 9 (held by 1 unit); unit 2 shares nothing; 5 is read by none
    np.testing.assert_allclose(overlap_prior(ids, groups, readers), [1.0, 1.0, 0.0])
    readers = [0, 12, 14]  # id 5 (held by all three units) counts a third to each
    np.testing.assert_allclose(overlap_prior(ids, groups, readers), [1 + 1 / 3, 1 + 1 / 3, 1 / 3])


PROMPT = (
    "Paris is the capital of France. The quick brown fox jumps. Berlin is the capital of Germany. Numbers 0123 follow. "
    "Rome is in Italy. Snow is cold. Madrid lies in Spain. Tea is hot. Lisbon sits by the sea. Cats sleep a lot."
)
ANSWER = " Rome is in Italy, and Lisbon sits by the sea."


def test_sources_places_its_masks_by_the_answer_s_overlap_on_the_model(tokenizer):
    """On the model, with an answer that quotes two sentences: ten sentences at k = 16 make a plain 16-run design,
    and the masks Sources ran are the informed design of a prior counted here by explicit loops over the prompt's
    and the answer's tokens (not the design a flat prior gives)."""
    from explainer.methods import GenerationRun

    from ...conftest import build_model

    prompt, answer = tokenizer(PROMPT)["input_ids"], tokenizer(ANSWER)["input_ids"]
    ids, n = prompt + answer, len(prompt)
    model = build_model("llama")
    r = GenerationRun(model=model, input_ids=torch.tensor([ids]), num_prompt_tokens=n,
                      prompt_tokens=[tokenizer.decode([t]) for t in prompt])  # fmt: skip
    groups = passages(r.prompt_tokens, list(range(n)), get_method("sources").config)
    inside = {p for g in groups for p in range(g.start, g.stop)}
    read = {ids[p] for p in range(len(ids)) if p not in inside}
    held = [{ids[p] for p in range(g.start, g.stop)} for g in groups]
    prior = np.array([sum(1.0 / sum(t in h2 for h2 in held) for t in h if t in read) for h in held])
    method = get_method("sources", design="informed", ablations=16)
    method.explain(r)
    keep = np.array(method.meta()["masks"]["keep"], dtype=bool)
    assert len(groups) == 10 and method.meta()["design"] == "overlap-placed Hadamard" and prior.max() > 0
    np.testing.assert_array_equal(keep[1:17], design(10, 16, "informed", 0, prior))
    assert not (keep[1:17] == design(10, 16, "aberration", 0)).all()
