"""The references' needle scores (`peers.peer_needle_row`): a sentence score shared evenly by its tokens, scored as the
methods' maps and recomputed by hand from the tokens' characters; a row of the `hitratio` command's results, joinable
with its report; `hitratio --peers` and `lds --peers` (and the message when the extras are absent). The peers' scoring
is stubbed with planted sentence scores, so this runs without `pip install .[peers]` (tests/explainer/eval/test_peers.py
runs the real ones)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from explainer.bench.prompts import prompt_text
from explainer.cli import EXIT_USER_ERROR, main
from explainer.eval import peers
from explainer.eval.evaluate import merge_results
from explainer.eval.hitratio import HitRatioConfig, evaluate_needle, needle_rows, summarise
from explainer.eval.hitscore import average_precision
from explainer.eval.lds_eval import answer_prompt
from explainer.eval.peers import PeerConfig, peer_needle_row, run_peers
from explainer.models.loading import ModelBundle

CFG = PeerConfig(max_new_tokens=24, peers=("context-cite", "at2"))
ANSWER = lambda row: f"It is {row['password']}."  # noqa: E731  a planted answer that holds the password


def _planted_answer(row):
    """`answer_prompt` with the answer teacher-forced (the tiny model does not find the password)."""

    def answer(bundle, row_id, prompt, start, methods, max_new_tokens, method_options=None):
        from explainer.eval import lds_eval

        original = lds_eval.explain
        forced = lambda *a, **k: original(*a, **{**k, "answer": ANSWER(row)})  # noqa: E731
        lds_eval.explain = forced
        try:
            return answer_prompt(bundle, row_id, prompt, start, methods, max_new_tokens, method_options)
        finally:
            lds_eval.explain = original

    return answer


@pytest.fixture(scope="module")
def row(tokenizer):
    return needle_rows(tokenizer, prompt_text()[0], [(300, 50, 0)])[0]


def _by_hand(bundle, row, sentences, scores, written: int) -> tuple[float, np.ndarray, np.ndarray]:
    """The mass share of sentence scores, each token holding its sentence's score over its length (positive part,
    normalised over the needle and haystack tokens), from the characters of the user's text tokens; and that map
    and its hit flags for the AP."""
    encoded = bundle.encode(row["prompt"], max_new_tokens=CFG.max_new_tokens)
    enc = bundle.tokenizer(encoded.text, add_special_tokens=False, return_offsets_mapping=True)
    base = encoded.text.index(row["prompt"])
    share = {i: max(score / len(sentence), 0.0) for sentence, score in zip(sentences, scores) for i in sentence}
    body, needle = row["spans"]["body"], row["spans"]["needles"][written]
    values, hits = [], []
    for i, (s, e) in enumerate(enc["offset_mapping"]):
        if e > s and base + body[0] <= s < base + body[1]:
            values.append(share.get(i, 0.0))
            hits.append(base + needle[0] <= s < base + needle[1])
    m = np.array(values) / sum(values)
    return float(m[np.array(hits)].sum()), m, np.array(hits)


def test_a_needle_row_of_planted_sentence_scores_recomputed_by_hand(llama, tokenizer, row, monkeypatch):
    bundle = ModelBundle(name="tiny", model=llama, tokenizer=tokenizer)
    seen = {}

    def planted(seed):
        def scores(bundle, p, *rest):
            n = len(p.row.sentences)
            seen["sentences"] = p.row.sentences
            return np.random.default_rng(seed).normal(size=n) + 1.0  # signed: negative sentences count as 0

        return scores

    monkeypatch.setattr(peers, "context_cite_scores", lambda *a: (planted(1)(*a), None))
    monkeypatch.setattr(peers, "at2_scores", planted(2))
    monkeypatch.setattr(peers, "answer_prompt", _planted_answer(row))
    got = peer_needle_row(bundle, row, "estimator", CFG)
    assert got["id"] == row["id"] and got["length"] == 300 and got["depth"] == 50 and got["found"]
    sentences = seen["sentences"]
    assert got["n_sentences"] == len(sentences) >= 3
    covered = sorted(i for s in sentences for i in s)
    assert len(covered) == len(set(covered))  # each user text token in one sentence
    for name, seed in (("context-cite", 1), ("at2", 2)):
        scores = np.random.default_rng(seed).normal(size=len(sentences)) + 1.0
        assert got["peers"][name]["scores"] == pytest.approx(list(scores))
        mass, m, hits = _by_hand(bundle, row, sentences, scores, 0)
        assert got["methods"][name]["mass"] == pytest.approx(mass)
        assert got["methods"][name]["ap"] == pytest.approx(average_precision(m, hits))


def test_needle_rows_are_resumable_and_join_the_methods_report(llama, tokenizer, row, monkeypatch, tmp_path):
    bundle = ModelBundle(name="tiny", model=llama, tokenizer=tokenizer)
    needle = lambda *a: np.eye(len(a[1].row.sentences))[0]  # noqa: E731  all on the first sentence: the instruction
    monkeypatch.setattr(peers, "context_cite_scores", lambda *a: (needle(*a), None))
    monkeypatch.setattr(peers, "answer_prompt", _planted_answer(row))
    cfg = PeerConfig(max_new_tokens=24, peers=("context-cite",))
    path = tmp_path / "peers.jsonl"
    first = run_peers(bundle, [row], [], cfg, tmp_path, path, measure=peer_needle_row)
    assert first[0]["methods"]["context-cite"]["mass"] == 0.0  # the instruction is left out: blind, 0 mass
    monkeypatch.setattr(peers, "context_cite_scores", lambda *a: pytest.fail("a done prompt was measured again"))
    assert run_peers(bundle, [row], [], cfg, tmp_path, path, measure=peer_needle_row) == first
    methods = tmp_path / "methods.jsonl"  # the `hitratio` command's row of the same prompt: the same answer
    measured = evaluate_needle(bundle, row, HitRatioConfig(methods=("macs",), max_new_tokens=24), answer=ANSWER(row))
    methods.write_text(json.dumps(measured) + "\n")
    table = summarise(merge_results([str(methods), str(path)]))["groups"][(300, "plain")]["methods"]
    assert table["macs"]["mass"][0] == pytest.approx(measured["methods"]["macs"]["mass"])
    assert table["context-cite"]["mass"][0] == 0.0


def test_the_peers_option_writes_rows_the_report_reads(monkeypatch, tmp_path, capsys, tiny_model_dir):
    monkeypatch.setattr(peers, "_installed", lambda module: False)
    # absent extras: a clear message, before any model is loaded
    assert main(["hitratio", "--peers", "context-cite", "--results", str(tmp_path / "x.jsonl")]) == EXIT_USER_ERROR
    assert "pip install '.[peers]'" in capsys.readouterr().err
    monkeypatch.setattr(peers, "_installed", lambda module: True)
    # AT2 needs SQuAD rows to train on
    assert main(["hitratio", "--peers", "at2", "--results", str(tmp_path / "x.jsonl")]) == EXIT_USER_ERROR
    assert "--train-data" in capsys.readouterr().err
    assert main(["lds", "--data", "x.json", "--peers", "context-cite,shapley"]) == EXIT_USER_ERROR
    assert "choose from context-cite, at2" in capsys.readouterr().err
    needle = lambda *a: np.eye(len(a[1].row.sentences))[-2]  # noqa: E731  the last haystack sentence
    monkeypatch.setattr(peers, "context_cite_scores", lambda *a: (needle(*a), None))
    path = tmp_path / "hits.jsonl"
    args = ["hitratio", "--lengths", "200", "--depths", "50", "--samples", "1", "--peers", "context-cite",
            "--max-new-tokens", "2", "--model", str(tiny_model_dir), "--device", "cpu"]  # fmt: skip
    assert main([*args, "--results", str(path)]) == 0
    (row,) = [json.loads(line) for line in path.read_text().splitlines()]
    assert row["id"] == "needle:plain:200:50:0" and not row["found"]  # 2 tokens of the tiny model: no password
    assert row["methods"]["context-cite"] == {"mass": None, "ap": None} and row["peers"] == {}  # so it did not run
    assert row["command"].startswith("python -m explainer hitratio --lengths 200")
    assert "~200 tokens, plain" in capsys.readouterr().out  # the table
