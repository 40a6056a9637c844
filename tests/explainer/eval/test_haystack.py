"""Haystack prompts (a SQuAD paragraph among paragraphs of other articles) and the source-finding evaluation: the
generator is deterministic and places the answer right; the hit rules and Wilson intervals against hand counts; the
command end to end on a tiny model, resumed and reported."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from explainer.cli import main
from explainer.errors import InputError
from explainer.eval.datasets import haystack_rows
from explainer.eval.haystack import rank_sentences, wilson
from explainer.result.segments import Group


def squad_rows(articles: int = 3, paragraphs: int = 3) -> list[dict]:
    rows = []
    for a in range(articles):
        for p in range(paragraphs):
            context = f"Article {a} paragraph {p} opens here. The key fact is number {a}{p}7. It closes now."
            start = context.index(f"{a}{p}7")
            rows.append({"id": f"q{a}{p}", "title": f"T{a}", "question": f"Which number in {a}/{p}?",
                         "context": context, "answers": [{"text": f"{a}{p}7", "answer_start": start}]})  # fmt: skip
    return rows


def test_haystack_rows_hide_the_gold_paragraph_among_other_articles_deterministically():
    rows = squad_rows()
    built = haystack_rows(rows, paragraphs=5, seed=1)
    assert built == haystack_rows(rows, paragraphs=5, seed=1)  # anyone can rebuild them
    assert built != haystack_rows(rows, paragraphs=5, seed=2)
    positions = set()
    for row, h in zip(rows, built, strict=True):
        parts = h["context"].split("\n\n")
        assert len(parts) == 5 and parts.count(row["context"]) == 1 and len(set(parts)) == 5
        titles = {r["context"]: r["title"] for r in rows}
        assert [titles[p] for p in parts].count(row["title"]) == 1  # the distractors come from other articles
        g0, g1 = h["gold_paragraph"]
        assert h["context"][g0:g1] == row["context"]
        a = h["answers"][0]
        assert h["context"][a["answer_start"] : a["answer_start"] + len(a["text"])] == a["text"]
        s0, s1 = h["gold_sentence"]
        assert h["context"][s0:s1].strip().startswith("The key fact") and s0 <= a["answer_start"] < s1
        positions.add(parts.index(row["context"]))
        assert h["id"] == f"haystack:{row['id']}" and h["source_id"] == row["id"]
    assert len(positions) > 1  # the gold paragraph moves around
    with pytest.raises(InputError, match="paragraphs of other articles"):
        haystack_rows(squad_rows(articles=2, paragraphs=2), paragraphs=5)


def _row() -> dict:
    # context characters: sentence A [0, 10), B [10, 20) holds the answer at [12, 15), C [20, 30) in the gold paragraph
    return {"answers": [{"text": "abc", "answer_start": 12}], "gold_paragraph": [10, 30]}


def _groups():
    return [Group(0, 2, "A", "sentence"), Group(2, 3, "\n", "space"), Group(3, 5, "B", "sentence"),
            Group(5, 7, "C", "sentence")]  # fmt: skip


SPANS = {0: (0, 5), 1: (5, 10), 2: (10, 10), 3: (10, 12), 4: (12, 20), 5: (20, 25), 6: (25, 30)}


@pytest.mark.parametrize(
    ("z", "sentence", "paragraph", "top3", "rank"),
    [
        ([5, 5, 9, 0, 0, 1, 1], False, False, True, 3),  # A first, C second, B third; the space is never ranked
        ([0, 0, 0, 2, 2, 1, 1], True, True, True, 1),  # B first
        ([0, 0, 0, 1, 1, 2, 2], False, True, True, 2),  # C first: the gold paragraph, not the answer's sentence
        ([0, 0, 0, np.nan, np.nan, 2, 2], False, True, False, None),  # B has no score: never ranked
    ],
)
def test_rank_sentences_counts_hits_by_hand(z, sentence, paragraph, top3, rank):
    got = rank_sentences(np.asarray(z, dtype=np.float32), _groups(), SPANS, _row())
    assert (got["sentence_hit"], got["paragraph_hit"], got["sentence_hit3"], got["gold_rank"]) == (
        sentence, paragraph, top3, rank,
    )  # fmt: skip


def test_wilson_interval_against_the_closed_form_by_hand():
    p, lo, hi = wilson(5, 10)
    assert p == 0.5 and lo == pytest.approx(0.2366, abs=1e-4) and hi == pytest.approx(0.7634, abs=1e-4)
    p, lo, hi = wilson(0, 2)
    assert p == 0.0 and lo == pytest.approx(0.0, abs=1e-12) and hi == pytest.approx(0.6576, abs=1e-4)
    assert all(math.isnan(v) for v in wilson(0, 0))


def test_haystack_command_runs_resumes_and_reports(tiny_model_dir, tmp_path, capsys):
    data = tmp_path / "squad.json"
    data.write_text(json.dumps({"rows": squad_rows()}))
    results = tmp_path / "haystack.jsonl"
    args = ["haystack", "--data", str(data), "--model", str(tiny_model_dir), "--methods",
            "macs,random,sources:scope=all:depth=0", "--paragraphs", "4", "--limit", "2", "--max-new-tokens", "3",
            "--results", str(results)]  # fmt: skip
    assert main(args) == 0
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert [r["id"] for r in rows] == ["haystack:q00", "haystack:q01"]
    for r in rows:  # a method run with options is named with them, so variants in separate files stay apart
        assert set(r["methods"]) == {"macs", "random", "sources:scope=all:depth=0"} and r["n_sentences"] >= 4
        assert {"sentence_hit", "paragraph_hit", "sentence_hit3", "gold_rank", "top"} <= set(r["methods"]["macs"])
    out = capsys.readouterr().out
    assert "N = 2 haystack prompts" in out and "chance" in out
    assert main(args) == 0 and len(results.read_text().splitlines()) == 2  # resumed: nothing new
    assert main(["haystack", "--report", str(results)]) == 0
    assert "N = 2 haystack prompts" in capsys.readouterr().out


def test_merge_rows_joins_methods_of_the_prompts_every_file_finished():
    from explainer.eval.haystack import merge_rows

    first = [{"id": "a", "answer": "x", "methods": {"macs": 1}}, {"id": "b", "answer": "y", "methods": {"macs": 2}},
             {"id": "c", "error": "too long"}]  # fmt: skip
    later = [{"id": "a", "answer": "x", "methods": {"sources": 3}}]
    assert merge_rows([first, later]) == [{"id": "a", "answer": "x", "methods": {"macs": 1, "sources": 3}}]
    assert [r["id"] for r in merge_rows([first])] == ["a", "b"]
    with pytest.raises(InputError, match="different answers"):
        merge_rows([first, [{"id": "a", "answer": "z", "methods": {}}]])


def test_merge_rows_refuses_the_same_answer_from_another_haystack_or_precision():
    """A haystack's distractor passages come from the rows its command selects, so one id and answer can sit in
    another prompt: `merge_rows` refuses what `evaluate.merge_results` refuses (one check, `check_joinable`)."""
    from explainer.eval.haystack import merge_rows

    row = {"id": "a", "answer": "x", "dtype": "float32", "n_prompt_tokens": 835, "n_sentences": 24, "methods": {"m": 1}}
    for key, value, message in (("n_prompt_tokens", 828, "different prompts.*n_prompt_tokens"),
                                ("n_sentences", 22, "different prompts.*n_sentences"),
                                ("dtype", "bfloat16", "float32 and in bfloat16")):  # fmt: skip
        with pytest.raises(InputError, match=message):
            merge_rows([[row], [{**row, key: value, "methods": {"s": 2}}]])
    unrecorded = {k: v for k, v in row.items() if k not in ("dtype", "n_prompt_tokens", "n_sentences")}
    assert merge_rows([[row], [{**unrecorded, "methods": {"s": 2}}]])[0]["methods"] == {"m": 1, "s": 2}
