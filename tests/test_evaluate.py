"""`python -m explainer eval`: JSON layout, resumability, context location and the best-step statistic."""

from __future__ import annotations

import json

import pytest

from explainer import bundle_from_objects
from explainer.cli import EXIT_USER_ERROR, main
from explainer.evaluate import (
    QA_PROMPT,
    EvalConfig,
    answer_step,
    context_positions,
    format_tables,
    make_methods,
    merge_results,
    summarise,
)

from .conftest import build_model

ROWS = [
    {
        "id": "q1", "title": "t", "question": "What is the capital of France?",
        "context": "Paris is the capital of France, and Berlin is the capital of Germany.",
        "answers": [{"text": "Paris", "answer_start": 0}, {"text": "Paris is", "answer_start": 0}],
    },
    {
        "id": "q2", "title": "t", "question": "Which dog is lazy?",
        "context": "The quick brown fox jumps over the lazy dog.",
        "answers": [{"text": "the lazy dog", "answer_start": 31}],
    },
]  # fmt: skip


@pytest.fixture()
def data_file(tmp_path):
    path = tmp_path / "squad.json"
    path.write_text(json.dumps({"source": "test", "rows": ROWS}))
    return path


def test_eval_json_layout_and_resume(tiny_model_dir, data_file, tmp_path, capsys):
    out, results = tmp_path / "eval.json", tmp_path / "results.jsonl"
    args = ["eval", "--data", str(data_file), "--model", str(tiny_model_dir), "--methods", "macs,random",
            "--max-new-tokens", "3", "--json", str(out), "--results", str(results)]  # fmt: skip
    assert main(args) == 0
    d = json.loads(out.read_text())
    assert d["n"] == 2 and [s["id"] for s in d["samples"]] == ["q1", "q2"]
    assert set(d["methods"]) == {"macs", "random"}
    for entry in d["methods"].values():
        for key in ("mAUC_PR", "mSRG_logit", "mSRG_ppl", "mSRG_rougeL", "mSRG_bleu"):
            assert key in entry and key + "_ci" in entry
        assert 0.0 <= entry["mAUC_PR"] <= 1.0
    sample = d["samples"][0]["methods"]["macs"]
    assert {"auc_pr", "best_step", "srg_ppl", "mif_logit", "lif_bleu"} <= set(sample)
    printed = capsys.readouterr()
    assert "Table 2 layout" in printed.out and "Table 5 layout" in printed.out and "ETA" in printed.err
    assert len(results.read_text().splitlines()) == 2

    # a rerun skips finished ids: no new lines, same summary
    assert main(args) == 0
    assert len(results.read_text().splitlines()) == 2
    assert "resuming: 2 of 2" in capsys.readouterr().err
    assert json.loads(out.read_text())["methods"]["macs"]["mAUC_PR"] == d["methods"]["macs"]["mAUC_PR"]


def test_eval_skip_faithfulness_and_limit(tiny_model_dir, data_file, tmp_path):
    out = tmp_path / "e.json"
    rc = main(["eval", "--data", str(data_file), "--model", str(tiny_model_dir), "--methods", "macs",
               "--max-new-tokens", "2", "--limit", "1", "--skip-faithfulness", "--json", str(out)])  # fmt: skip
    assert rc == 0
    d = json.loads(out.read_text())
    assert d["n"] == 1 and "mAUC_PR" in d["methods"]["macs"] and "mSRG_ppl" not in d["methods"]["macs"]


@pytest.mark.parametrize(
    "args, message",
    [(["--data", "/no/such.json"], "Cannot read data file"), (["--methods", "macs,nope"], "Unknown method")],
)
def test_eval_bad_input(tiny_model_dir, data_file, capsys, args, message):
    base = ["eval", "--data", str(data_file), "--model", str(tiny_model_dir)]
    assert main(base + args) == EXIT_USER_ERROR
    assert message in capsys.readouterr().err


def test_context_positions_cover_the_context(tokenizer):
    bundle = bundle_from_objects(build_model("llama"), tokenizer)
    row = ROWS[0]
    head = QA_PROMPT.partition("{context}")[0].format(question=row["question"])
    prompt = head + row["context"]
    enc = bundle.encode(prompt)
    positions, spans = context_positions(bundle, enc, prompt, len(head))
    text = "".join(bundle.readable([enc.input_ids[0, i].item() for i in positions]))
    assert text.strip() == row["context"]
    assert spans[0][0] <= 0 and spans[-1][1] == len(row["context"])


def test_answer_step():
    toks = ["The", " answer", " is", " Paris", "."]
    assert answer_step(toks, ["paris"]) == 3
    assert answer_step(toks, ["Berlin"]) is None
    assert answer_step(toks, ["answer is", "Paris"]) == 1


def test_ablation_variants_have_distinct_names():
    names = [m.name for m in make_methods(EvalConfig(ablation=True))]
    assert len(set(names)) == len(names) == 7 and "macs_min_pooling" in names


def test_summary_and_tables_with_errors():
    samples = [
        {"id": "a", "methods": {"macs": {"auc_pr": 0.5, "best_before_answer": True}}},
        {"id": "b", "methods": {"macs": {"auc_pr": 1.0, "best_before_answer": None}}},
        {"id": "c", "error": "too long"},
    ]
    s = summarise(samples)
    assert s["n"] == 2 and s["methods"]["macs"]["mAUC_PR"] == pytest.approx(0.75)
    assert s["methods"]["macs"]["best_before_answer_rate"] == 1.0
    assert "0.750 ±" in format_tables(s)


def _jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_results_of_separate_runs_join_by_sample(tmp_path, capsys):
    first = _jsonl(tmp_path / "a.jsonl", [
        {"id": "a", "answer": "x", "seconds": 2.0, "methods": {"macs": {"auc_pr": 0.5}, "random": {"auc_pr": 0.1}}},
        {"id": "b", "answer": "y", "seconds": 3.0, "methods": {"macs": {"auc_pr": 1.0}}},
        {"id": "c", "error": "too long"},
    ])  # fmt: skip
    second = _jsonl(tmp_path / "b.jsonl", [
        {"id": "a", "answer": "x", "seconds": 5.0, "methods": {"atman": {"auc_pr": 0.25}}},
        {"id": "d", "answer": "z", "seconds": 1.0, "methods": {"atman": {"auc_pr": 0.75}}},
    ])  # fmt: skip
    merged = {s["id"]: s for s in merge_results([first, second])}
    assert set(merged) == {"a", "b", "d"}
    assert set(merged["a"]["methods"]) == {"macs", "random", "atman"} and merged["a"]["seconds"] == 7.0
    summary = summarise(list(merged.values()))
    assert summary["methods"]["atman"]["mAUC_PR"] == pytest.approx(0.5)  # over the two samples that have it
    assert summary["methods"]["macs"]["mAUC_PR"] == pytest.approx(0.75)

    out = tmp_path / "summary.json"
    assert main(["eval", "--report", f"{first},{second}", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "N = 3 samples" in printed and "atman" in printed and "compute recorded in the results: 11 s" in printed
    assert json.loads(out.read_text())["methods"]["atman"]["mAUC_PR"] == pytest.approx(0.5)

    clash = _jsonl(tmp_path / "c.jsonl", [{"id": "a", "answer": "other", "methods": {"rollout": {"auc_pr": 0.0}}}])
    assert main(["eval", "--report", f"{first},{clash}"]) == EXIT_USER_ERROR
    assert "different answers" in capsys.readouterr().err
    assert main(["eval", "--report", str(tmp_path / "missing.jsonl")]) == EXIT_USER_ERROR
    assert main(["eval"]) == EXIT_USER_ERROR
    assert "--data is required" in capsys.readouterr().err
