"""The references' hit ratio on needle prompts (`peers.peer_needle_row`): a sentence score shared evenly by its tokens,
recomputed by hand from the tokens' characters; a row of the `hitratio` command's results, joinable with its report.
The peers' scoring is stubbed with planted sentence scores, so this runs without `pip install .[peers]`
(tests/explainer/eval/test_peers.py runs the real ones)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from explainer.bench.prompts import prompt_text
from explainer.eval import peers
from explainer.eval.evaluate import merge_results
from explainer.eval.hitratio import HitRatioConfig, evaluate_needle, needle_rows, summarise
from explainer.eval.peers import PeerConfig, peer_needle_row, run_peers
from explainer.models.loading import ModelBundle

CFG = PeerConfig(max_new_tokens=3, peers=("context-cite", "at2"))


@pytest.fixture(scope="module")
def row(tokenizer):
    return needle_rows(tokenizer, prompt_text()[0], [(300, 50, 0)])[0]


def _by_hand(bundle, row, sentences, scores) -> float:
    """The hit ratio of sentence scores, each token holding its sentence's score over its length, from the characters
    of the user's text tokens (an explicit loop, as the methods' test recomputes theirs)."""
    encoded = bundle.encode(row["prompt"], max_new_tokens=CFG.max_new_tokens)
    enc = bundle.tokenizer(encoded.text, add_special_tokens=False, return_offsets_mapping=True)
    base = encoded.text.index(row["prompt"])
    inside = total = 0.0
    for sentence, score in zip(sentences, scores):
        for i in sentence:
            s, _ = enc["offset_mapping"][i]
            share = max(score / len(sentence), 0.0)
            total += share
            if any(base + a <= s < base + b for a, b in row["spans"].values()):
                inside += share
    return inside / total


def test_a_needle_row_of_planted_sentence_scores_recomputed_by_hand(llama, tokenizer, row, monkeypatch):
    bundle = ModelBundle(name="tiny", model=llama, tokenizer=tokenizer)
    seen = {}

    def planted(seed):
        def scores(bundle, p, *rest):
            n = len(p.row.sentences)
            seen["sentences"] = p.row.sentences
            return np.random.default_rng(seed).normal(size=n)  # signed: negative sentences count as 0

        return scores

    monkeypatch.setattr(peers, "context_cite_scores", lambda *a: (planted(1)(*a), None))
    monkeypatch.setattr(peers, "at2_scores", planted(2))
    got = peer_needle_row(bundle, row, "estimator", CFG)
    assert got["id"] == row["id"] and got["length"] == 300 and got["depth"] == 50
    sentences = seen["sentences"]
    assert got["n_sentences"] == len(sentences) >= 3
    covered = sorted(i for s in sentences for i in s)
    assert len(covered) == len(set(covered))  # each user text token in one sentence
    for name, seed in (("context-cite", 1), ("at2", 2)):
        scores = np.random.default_rng(seed).normal(size=len(sentences))
        assert got["peers"][name]["scores"] == pytest.approx(list(scores))
        assert got["methods"][name]["hit_ratio"] == pytest.approx(_by_hand(bundle, row, sentences, scores))


def test_needle_rows_are_resumable_and_join_the_methods_report(llama, tokenizer, row, monkeypatch, tmp_path):
    bundle = ModelBundle(name="tiny", model=llama, tokenizer=tokenizer)
    needle = lambda *a: np.eye(len(a[1].row.sentences))[0]  # noqa: E731  all on the first sentence: the system prompt
    monkeypatch.setattr(peers, "context_cite_scores", lambda *a: (needle(*a), None))
    cfg = PeerConfig(max_new_tokens=3, peers=("context-cite",))
    path = tmp_path / "peers.jsonl"
    first = run_peers(bundle, [row], [], cfg, tmp_path, path, measure=peer_needle_row)
    assert first[0]["methods"]["context-cite"]["hit_ratio"] == pytest.approx(1.0)
    monkeypatch.setattr(peers, "context_cite_scores", lambda *a: pytest.fail("a done prompt was measured again"))
    assert run_peers(bundle, [row], [], cfg, tmp_path, path, measure=peer_needle_row) == first
    methods = tmp_path / "methods.jsonl"  # the `hitratio` command's row of the same prompt: the same answer
    measured = evaluate_needle(bundle, row, HitRatioConfig(methods=("macs",), max_new_tokens=3))
    methods.write_text(json.dumps(measured) + "\n")
    table = summarise(merge_results([str(methods), str(path)]))["lengths"][300]["methods"]
    assert table["macs"][0] == pytest.approx(measured["methods"]["macs"]["hit_ratio"])
    assert table["context-cite"][0] == pytest.approx(1.0)


def test_the_script_writes_rows_the_hitratio_report_reads(monkeypatch, tmp_path, capsys):
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts"))
    import peers_hitratio

    with pytest.raises(SystemExit):  # AT2 needs SQuAD rows to train on
        peers_hitratio.main(["--peers", "at2", "--results", str(tmp_path / "x.jsonl")])
    assert "--train-data" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # the hitratio command's checks of the needle prompts
        peers_hitratio.main(["--peers", "context-cite", "--depths", "50,150", "--results", str(tmp_path / "x.jsonl")])
    assert "--depths are percentages" in capsys.readouterr().err
    needle = lambda *a: np.eye(len(a[1].row.sentences))[0]  # noqa: E731
    monkeypatch.setattr(peers, "context_cite_scores", lambda *a: (needle(*a), None))
    path = tmp_path / "hits.jsonl"
    args = ["--lengths", "200", "--depths", "50", "--samples", "1", "--peers", "context-cite", "--max-new-tokens", "2"]
    assert peers_hitratio.main([*args, "--results", str(path)]) == 0
    (row,) = [json.loads(line) for line in path.read_text().splitlines()]
    assert row["id"] == "needle:200:50:0" and row["methods"]["context-cite"]["hit_ratio"] == pytest.approx(1.0)
    assert row["command"].startswith("python scripts/peers_hitratio.py --lengths 200")
    assert "context-cite" in capsys.readouterr().out  # the table
