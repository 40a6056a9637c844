"""A committed row of `lds --peers` measured again from its stored scores (`peer_rescore`): the raw LDS comes back,
and the centred LDS is the one of each sentence's score minus the context's mean token score times its length, against
log p of the answer from a plain forward of each shortened prompt. Runs without the peers' packages: their mask draw
is replaced by planted masks (tests/explainer/eval/test_peers.py checks the real draw against their rows)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from explainer import load_model
from explainer.cli import EXIT_USER_ERROR, main
from explainer.eval import peer_rescore
from explainer.eval.lds import lds
from explainer.eval.peer_rescore import rescore_lines, rescore_peers, rescored_row
from explainer.eval.peers import PeerConfig, PeerMismatch, prepare

from ...reference import plain_logp
from .test_peer_drops import ROW, TOKENS

CFG = PeerConfig(max_new_tokens=TOKENS, peers=("context-cite", "at2"))


@pytest.fixture(scope="module")
def bundle():
    return load_model(None, device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def answered(bundle):
    return prepare(bundle, ROW, CFG)


def _masks(sources: int, seed: int, count: int = CFG.masks) -> np.ndarray:
    return np.random.default_rng(seed).random((count, sources)) < 0.5  # (M, S)


def _plain(bundle, p, masks: np.ndarray) -> np.ndarray:
    """(M,) log p of the answer from a plain forward of each shortened prompt (its removed sentences' tokens out)."""
    logp = []
    for mask in masks:
        gone = {i for j, sentence in enumerate(p.row.sentences) if not mask[j] for i in sentence}
        logp.append(plain_logp(bundle.model, [t for i, t in enumerate(p.prompt_ids) if i not in gone], p.response_ids))
    return np.array(logp)


def _centred(p, scores: np.ndarray) -> np.ndarray:
    """Each token holds s_j / len_j; minus the mean over the context's tokens, summed back: s_j - mean * len_j."""
    lengths = np.array([len(s) for s in p.row.sentences], dtype=np.float64)
    return scores - scores.sum() / len(p.row.positions) * lengths


def _stored(p, answer: str) -> dict:
    n = len(p.row.sentences)
    scores = {"context-cite": np.linspace(2.0, -1.0, n), "at2": np.abs(np.sin(np.arange(n)))}
    return {"id": ROW["id"], "answer": answer,
            "methods": {name: {"lds": 0.5, "drop@1": 1.25} for name in scores},
            "peers": {name: {"lds": 0.5, "scores": list(s)} for name, s in scores.items()}}  # fmt: skip


def test_a_rescored_row_is_the_hand_computed_raw_and_centred_lds(bundle, answered, monkeypatch):
    planted = {"context-cite": 1, "at2": 2}
    drawn = lambda name, sources, cfg: _masks(sources, planted[name], cfg.masks)  # noqa: E731
    monkeypatch.setattr(peer_rescore, "held_out_masks", drawn)
    measured = []
    real = peer_rescore.our_logprobs
    monkeypatch.setattr(peer_rescore, "our_logprobs", lambda *a: measured.append(real(*a)) or measured[-1])
    stored = _stored(answered, answered.row.attr.generated_text)
    got = rescored_row(bundle, ROW, stored, CFG)
    for (name, seed), logp in zip(planted.items(), measured):
        scores, masks = np.asarray(stored["peers"][name]["scores"]), _masks(len(stored["peers"][name]["scores"]), seed)
        total = logp.sum(axis=1)  # (M,)
        assert total == pytest.approx(_plain(bundle, answered, masks), abs=1e-4)  # the removal, by plain forwards
        assert got["methods"][name]["lds"] == lds(total, masks @ scores)
        assert got["methods"][name]["lds_centred"] == pytest.approx(lds(total, masks @ _centred(answered, scores)))
        assert got["methods"][name]["drop@1"] == 1.25  # the stored drops are kept
        assert got["peers"][name]["lds_stored"] == 0.5 and got["peers"][name]["scores"] == list(scores)
    assert len(measured) == 2 and all(len(logp) == CFG.masks for logp in measured)
    fewer = {**stored, "peers": {n: {**e, "n_masks": 5} for n, e in stored["peers"].items()}}
    measured.clear()
    rescored_row(bundle, ROW, fewer, CFG)  # as many masks as the stored row was scored on
    assert [len(logp) for logp in measured] == [5, 5]
    assert not np.isclose(got["methods"]["at2"]["lds"], got["methods"]["at2"]["lds_centred"])  # all positive: moves
    lines = rescore_lines([got])
    assert len(lines) == 2 and all("0.5000 stored, over 1 rows; the same to 1e-6 on 0" in line for line in lines)


def test_a_row_whose_answer_changed_is_refused_and_a_rerun_resumes(bundle, answered, monkeypatch, tmp_path):
    monkeypatch.setattr(peer_rescore, "held_out_masks", lambda name, sources, cfg: _masks(sources, 3))
    with pytest.raises(PeerMismatch, match="not the stored answer"):
        rescored_row(bundle, ROW, _stored(answered, "something else"), CFG)
    stored = tmp_path / "stored.jsonl"
    stored.write_text(json.dumps(_stored(answered, answered.row.attr.generated_text)) + "\n" +
                      json.dumps({"id": "other", "error": "no answer"}) + "\n")  # fmt: skip
    out = tmp_path / "rescored.jsonl"
    first = rescore_peers(bundle, [ROW, {**ROW, "id": "other"}], stored, CFG, out)
    assert [r["id"] for r in first] == [ROW["id"]]  # a stored row without scores is not measured
    monkeypatch.setattr(peer_rescore, "rescored_row", lambda *a: pytest.fail("a done row was measured again"))
    assert rescore_peers(bundle, [ROW], stored, CFG, out) == first


def test_the_rescore_option_refuses_a_missing_file(tmp_path, capsys, monkeypatch):
    from explainer.eval import peers

    monkeypatch.setattr(peers, "_installed", lambda module: True)
    data = tmp_path / "squad.json"
    data.write_text(json.dumps({"data": [{"paragraphs": [{"context": ROW["context"], "qas": [
        {"id": "d0", "question": ROW["question"], "answers": ROW["answers"], "is_impossible": False}]}]}]}))
    code = main(["lds", "--data", str(data), "--peers", "context-cite", "--rescore", str(tmp_path / "none.jsonl")])
    assert code == EXIT_USER_ERROR and "--rescore" in capsys.readouterr().err
