"""The external references (ContextCite, AT2) on the embedded model: their LDS equals ours on their scores, and their
ablation log-probabilities equal ours (explainer/eval/peers.py). Skipped without `pip install .[peers]`.

Small on purpose (short contexts, 8 masks, a 4-token answer, 3 AT2 steps): it checks agreement, not quality."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

pytest.importorskip("context_cite", reason="context-cite is not installed (optional: pip install .[peers])")
pytest.importorskip("at2", reason="at2 is not installed (optional: pip install .[peers])")

from explainer import load_model  # noqa: E402
from explainer.bench.prompts import prompt_text  # noqa: E402
from explainer.eval import peers  # noqa: E402
from explainer.eval.hitratio import needle_rows  # noqa: E402
from explainer.eval.peer_rescore import rescored_row  # noqa: E402
from explainer.eval.peers import (  # noqa: E402
    PeerConfig,
    at2_row,
    context_cite_row,
    peer_needle_row,
    peer_row,
    prepare,
    train_at2,
)

LOGP_TOLERANCE = 1e-4  # float32, their solo forwards against our cached, batched ones; measured ~1.5e-5
CFG = PeerConfig(max_new_tokens=4, masks=8, context_cite_ablations=8, at2_steps=3)


def _row(i: int, question: str, context: str) -> dict:
    return {"id": f"p{i}", "question": question, "context": context, "answers": [{"text": "x", "answer_start": 0}]}


ROWS = [
    _row(0, "What colour is the sky?", "The sky is blue on a clear day. Grass is green. Snow is white in winter. "
         "Coal is black."),  # fmt: skip
    _row(1, "Where do penguins live?", "Penguins live in the Southern Hemisphere. They cannot fly. "
         "Most of them eat fish. Some live in Antarctica."),  # fmt: skip
    _row(2, "What is the capital of France?", "France is a country in Europe. Its capital is Paris. "
         "Paris lies on the Seine. Lyon is its third city."),  # fmt: skip
]


@pytest.fixture(scope="module")
def bundle():
    return load_model(None, device="cpu", dtype="float32")  # the agreement is stated for float32


@pytest.fixture(scope="module")
def prepared(bundle):
    return [prepare(bundle, row, CFG) for row in ROWS]


def _check_agreement(entry: dict, bundle, p) -> None:
    assert entry["n_masks"] == CFG.masks
    assert entry["lds"] is not None and entry["lds_theirs"] is not None
    assert entry["lds"] == pytest.approx(entry["lds_theirs"], abs=1e-9)
    assert entry["max_abs_logp_diff"] < LOGP_TOLERANCE
    assert len(entry["scores"]) == len(p.row.sentences) and np.isfinite(entry["scores"]).all()


def test_the_peers_see_the_projects_sentences(prepared):
    for row, p in zip(ROWS, prepared):
        assert len(p.row.sentences) == 4
        assert p.row.prompt[p.spans[0][0] : p.spans[-1][1]].strip() == row["context"]
        assert all(b[0] >= a[1] for a, b in zip(p.spans, p.spans[1:]))  # in order, not overlapping


def test_context_cite_lds_and_ablations_agree_with_ours(bundle, prepared):
    p = prepared[0]
    entry = context_cite_row(bundle, p, CFG)
    assert entry["retokenised_masks"] == 0  # its re-tokenised prompts are our prompts with the tokens removed
    _check_agreement(entry, bundle, p)


def test_at2_trained_by_its_trainer_agrees_with_ours(bundle, prepared, tmp_path):
    estimator = train_at2(bundle, prepared[1:], CFG, tmp_path)
    weights = estimator.linear.weight.detach().float().numpy().ravel()
    assert weights.shape == (bundle.model.config.num_hidden_layers * bundle.model.config.num_attention_heads,)
    assert np.abs(weights).sum() == pytest.approx(1.0, rel=1e-4)  # its finalize_parameters L1-normalises
    assert not np.allclose(weights, weights[0])  # training moved the uniform start
    entry = at2_row(bundle, prepared[0], estimator, CFG)
    _check_agreement(entry, bundle, prepared[0])


def test_both_peers_score_a_needle_prompts_sentences(bundle, prepared, tmp_path):
    row = needle_rows(bundle.tokenizer, prompt_text()[0], [(250, 10, 0)])[0]
    assert 0 < row["spans"]["needles"][0][0] < len(row["prompt"])
    estimator = train_at2(bundle, prepared[1:], CFG, tmp_path)
    cfg = dataclasses.replace(CFG, max_new_tokens=16)  # long enough to write the password on this prompt
    got = peer_needle_row(bundle, row, estimator, cfg)  # their ids checked against ours (PeerMismatch otherwise)
    assert got["found"] and 0 < got["chance"] < 1 and got["n_hits"] > 0
    for name in ("context-cite", "at2"):
        scores = np.asarray(got["peers"][name]["scores"])
        assert len(scores) == got["n_sentences"] > 5 and np.isfinite(scores).all()
        entry = got["methods"][name]
        assert 0.0 <= entry["mass"] <= 1.0 and 0.0 < entry["ap"] <= 1.0


def test_the_peers_do_not_run_where_the_answer_lacks_the_password(bundle, monkeypatch):
    row = needle_rows(bundle.tokenizer, prompt_text()[0], [(250, 10, 0)])[0]

    def never(*args, **kwargs):
        raise AssertionError("a peer ran on a row nobody scores")

    monkeypatch.setattr(peers, "context_cite_scores", never)
    monkeypatch.setattr(peers, "at2_scores", never)
    got = peer_needle_row(bundle, row, None, CFG)  # 4 tokens: "The secret password is", no password yet
    assert not got["found"]
    assert got["peers"] == {}
    assert got["methods"] == {name: {"mass": None, "ap": None} for name in CFG.peers}


def test_a_rescore_gives_each_peers_stored_lds_back(bundle, prepared, tmp_path):
    """`lds --rescore` draws each peer's own held-out masks again (`held_out_masks`): on them the stored scores give
    the stored raw LDS back, and the centred LDS the row computed."""
    estimator = train_at2(bundle, prepared[1:], CFG, tmp_path)
    stored = peer_row(bundle, ROWS[0], estimator, CFG)
    got = rescored_row(bundle, ROWS[0], stored, CFG)
    for name in ("context-cite", "at2"):
        assert stored["methods"][name]["lds_centred"] is not None
        assert got["methods"][name]["lds"] == pytest.approx(stored["methods"][name]["lds"], abs=1e-9)
        assert got["methods"][name]["lds_centred"] == pytest.approx(stored["methods"][name]["lds_centred"], abs=1e-9)
