"""The references' top-k drops (`peers.peer_drops`) are the `lds` command's drops for the same scores, and drop@1 is
what a plain forward of the prompt without the best sentence gives. Runs without the peers' packages: only the
project's removal is used."""

from __future__ import annotations

import numpy as np
import pytest

from explainer import load_model
from explainer.eval.lds import source_scores
from explainer.eval.lds_eval import LdsConfig, answer_row, evaluate_lds_sample
from explainer.eval.peers import PeerConfig, peer_drops, prepare

from ...reference import plain_logp

ROW = {"id": "d0", "question": "Where do penguins live?", "context": "Penguins live in the Southern Hemisphere. "
       "They cannot fly. Most of them eat fish. Some live in Antarctica. Their feathers are black and white. "
       "Chicks are grey.", "answers": [{"text": "x", "answer_start": 0}]}  # fmt: skip
TOKENS = 6


@pytest.fixture(scope="module")
def bundle():
    return load_model(None, device="cpu", dtype="float32")


def test_peer_drops_are_the_lds_commands_drops_for_the_same_scores(bundle):
    measured = evaluate_lds_sample(bundle, ROW, LdsConfig(methods=("macs",), max_new_tokens=TOKENS, masks=4))
    answered = answer_row(bundle, ROW, ["macs"], TOKENS)
    whole = source_scores(np.asarray(answered.attr.methods["macs"].raw[: answered.k]), answered.sentences).sum(0)
    p = prepare(bundle, ROW, PeerConfig(max_new_tokens=TOKENS))
    assert p.response_ids == list(answered.attr.generated_token_ids[: answered.k])
    drops = peer_drops(bundle, p, whole)
    assert set(drops) == {"drop@1", "drop@3", "drop@5"}
    for k in (1, 3, 5):
        assert drops[f"drop@{k}"] == pytest.approx(measured["methods"]["macs"][f"drop@{k}"], abs=1e-4)

    best = int(np.argmax(whole))
    kept = [t for i, t in enumerate(p.prompt_ids) if i not in set(p.row.sentences[best])]
    plain = plain_logp(bundle.model, p.prompt_ids, p.response_ids) - plain_logp(bundle.model, kept, p.response_ids)
    assert drops["drop@1"] == pytest.approx(plain, abs=1e-3)


def test_peer_drops_follow_the_scores_order(bundle):
    p = prepare(bundle, ROW, PeerConfig(max_new_tokens=TOKENS))
    n = len(p.row.sentences)
    first, last = np.arange(n, 0, -1.0), np.arange(1.0, n + 1)  # best sentence first / last
    a, b = peer_drops(bundle, p, first, (1,)), peer_drops(bundle, p, last, (1,))
    assert a["drop@1"] != b["drop@1"]  # a different sentence removed
    assert peer_drops(bundle, p, first, (n,))[f"drop@{n}"] == peer_drops(bundle, p, last, (n,))[f"drop@{n}"]
