"""`python -m explainer eval`: JSON layout, resumability, context location and the best-step statistic."""

from __future__ import annotations

import json
import urllib.error
from pathlib import Path

import pytest

from explainer import bundle_from_objects
from explainer.cli import EXIT_USER_ERROR, main
from explainer.errors import InputError
from explainer.eval.evaluate import (
    QA_PROMPT,
    EvalConfig,
    answer_step,
    context_positions,
    format_tables,
    load_squad,
    make_methods,
    merge_results,
    summarise,
)

from ...conftest import build_model

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
    assert [s["id"] for s in d["samples"]] == ["q1"]
    # the second part of a split run: rows from --offset on
    rc = main(["eval", "--data", str(data_file), "--model", str(tiny_model_dir), "--methods", "macs",
               "--max-new-tokens", "2", "--offset", "1", "--skip-faithfulness", "--json", str(out)])  # fmt: skip
    assert rc == 0 and [s["id"] for s in json.loads(out.read_text())["samples"]] == ["q2"]


def test_load_squad_offset_and_limit(data_file):
    assert [r["id"] for r in load_squad(data_file)] == ["q1", "q2"]
    assert [r["id"] for r in load_squad(data_file, offset=1)] == ["q2"]
    assert [r["id"] for r in load_squad(data_file, limit=1, offset=1)] == ["q2"]
    assert [r["id"] for r in load_squad(data_file, limit=1)] == ["q1"]
    assert load_squad(data_file, offset=5) == []
    with pytest.raises(InputError, match="--offset"):
        load_squad(data_file, offset=-1)


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

    # the same method in two files (an AUC-PR-only part and a part with removal curves): both sets of fields kept
    aucpr = _jsonl(tmp_path / "d.jsonl", [{"id": "b", "answer": "y", "methods": {"macs": {"auc_pr": 1.0}}}])
    curves = _jsonl(tmp_path / "e.jsonl", [{"id": "b", "answer": "y", "methods": {"macs": {"srg_logit": 0.2}}}])
    for order in ([aucpr, curves], [curves, aucpr]):
        assert merge_results(order)[0]["methods"]["macs"] == {"auc_pr": 1.0, "srg_logit": 0.2}
    assert summarise(merge_results([curves, first]))["methods"]["macs"]["mSRG_logit"] == pytest.approx(0.2)

    clash = _jsonl(tmp_path / "c.jsonl", [{"id": "a", "answer": "other", "methods": {"rollout": {"auc_pr": 0.0}}}])
    assert main(["eval", "--report", f"{first},{clash}"]) == EXIT_USER_ERROR
    assert "different answers" in capsys.readouterr().err
    assert main(["eval", "--report", str(tmp_path / "missing.jsonl")]) == EXIT_USER_ERROR
    assert main(["eval"]) == EXIT_USER_ERROR
    assert "--data is required" in capsys.readouterr().err


# --- SQuAD layouts and the squad_v2-dev download (explainer/datasets.py) ---

SHARED_SQUAD = Path(__file__).resolve().parents[4] / "shared" / "data" / "squad2-dev-350.json"


def _official(rows: list[dict] = ROWS, impossible: int = 1) -> dict:
    """ROWS in the official SQuAD 2.0 layout, one article per title, with repeated answers (several annotators) and
    `impossible` unanswerable questions added to the first paragraph."""
    paragraphs = []
    for r in rows:
        answers = [*r["answers"], r["answers"][0]]  # the first answer given twice
        qas = [{"id": r["id"], "question": r["question"], "answers": answers, "is_impossible": False}]
        paragraphs.append({"context": r["context"], "qas": qas})
    for i in range(impossible):
        paragraphs[0]["qas"].append(
            {"id": f"no{i}", "question": "Who?", "answers": [], "plausible_answers": [], "is_impossible": True}
        )
    return {"version": "v2.0", "data": [{"title": "t", "paragraphs": paragraphs}]}


def test_rows_of_different_prompts_with_the_same_answer_are_not_joined(tmp_path, capsys):
    """A long context's distractor passages come from the rows a command selects, so the same id and answer can sit
    in another prompt: rows that record different prompt lengths are refused, rows that agree (or do not record
    them) still join."""
    row = {"id": "h", "answer": "x", "n_prompt_tokens": 835, "n_sentences": 24, "methods": {"sources": {"lds": 0.7}}}
    same = _jsonl(tmp_path / "a.jsonl", [row])
    for key, value in (("n_prompt_tokens", 828), ("n_sentences", 22)):
        other = _jsonl(tmp_path / f"{key}.jsonl", [{**row, key: value, "methods": {"least-squares": {"lds": 0.6}}}])
        with pytest.raises(InputError, match=f"different prompts.*{key}"):
            merge_results([same, other])
        assert main(["lds", "--report", f"{same},{other}"]) == EXIT_USER_ERROR
        assert "different prompts" in capsys.readouterr().err
    unrecorded = {k: v for k, v in row.items() if k not in ("n_prompt_tokens", "n_sentences")}
    agreeing = _jsonl(tmp_path / "b.jsonl", [{**unrecorded, "methods": {"least-squares": {"lds": 0.6}}}])
    assert set(merge_results([same, agreeing])[0]["methods"]) == {"sources", "least-squares"}
    recorded = _jsonl(tmp_path / "c.jsonl", [{**row, "methods": {"least-squares": {"lds": 0.6}}}])
    assert set(merge_results([same, recorded])[0]["methods"]) == {"sources", "least-squares"}


def test_official_layout_converts_to_our_rows():
    from explainer.eval.datasets import is_official_layout, rows_from_official

    data = _official()
    rows = rows_from_official(data)

    assert is_official_layout(data) and not is_official_layout({"rows": ROWS}) and not is_official_layout(ROWS)
    assert rows == ROWS  # unanswerable question dropped, repeated answer kept once
    assert [r["id"] for r in rows_from_official(data, answerable_only=False)] == ["q1", "no0", "q2"]
    for r in rows:  # every answer is a span of its context
        assert all(r["context"][a["answer_start"] :].startswith(a["text"]) for a in r["answers"])


@pytest.mark.parametrize("layout", ["official", "rows", "list"])
def test_load_squad_reads_every_layout(tmp_path, layout):
    payload = {"official": _official(), "rows": {"rows": ROWS}, "list": ROWS}[layout]
    path = tmp_path / "data.json"
    path.write_text(json.dumps(payload), encoding="utf-8")

    assert load_squad(path) == ROWS
    assert load_squad(path, limit=1) == ROWS[:1]


@pytest.mark.parametrize(
    "payload, message",
    [
        ({"data": [{"title": "t", "paragraphs": [{"qas": []}]}]}, "lacks 'context'"),
        ({"data": [{"title": "t", "paragraphs": [{"context": "c", "qas": [{"id": "x"}]}]}]}, "lacks 'question'"),
        ({"something": 1}, "neither a list of rows"),
        (["not a row"], "not an object"),
    ],
)
def test_malformed_squad_files_are_input_errors(tmp_path, payload, message):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(payload), encoding="utf-8")
    with pytest.raises(InputError, match=message):
        load_squad(path)


class _FakeResponse:
    def __init__(self, body: bytes):
        self.body = body

    def read(self) -> bytes:
        return self.body

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EXPLAINER_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_squad_v2_dev_downloads_once_then_reuses_the_cache(cache, monkeypatch):
    from explainer.eval import datasets

    calls = []

    def opener(url, timeout):
        calls.append((url, timeout))
        return _FakeResponse(json.dumps(_official()).encode())

    monkeypatch.setattr(datasets, "_open_url", opener)

    path = datasets.resolve_data("squad_v2-dev")

    assert calls == [(datasets.DOWNLOADS["squad_v2-dev"], datasets.DOWNLOAD_TIMEOUT)]
    assert path == cache / "data" / "squad_v2-dev-answerable.json" and path.is_file()
    assert load_squad(path) == ROWS  # stored converted, answerable questions only
    assert "answerable" in json.loads(path.read_text())["source"]
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left

    def offline(url, timeout):
        raise AssertionError("the cached file must be reused")

    monkeypatch.setattr(datasets, "_open_url", offline)
    assert datasets.resolve_data("squad_v2-dev") == path


@pytest.mark.parametrize(
    "failure",
    [
        urllib.error.URLError(OSError(101, "Network is unreachable")),
        TimeoutError("timed out"),
        b"<html>not json</html>",
        b'{"rows": []}',
    ],
)
def test_failed_download_says_what_to_do_and_leaves_no_cache(cache, monkeypatch, failure):
    from explainer.eval import datasets

    def opener(url, timeout):
        if isinstance(failure, bytes):
            return _FakeResponse(failure)
        raise failure

    monkeypatch.setattr(datasets, "_open_url", opener)

    with pytest.raises(InputError) as info:
        datasets.resolve_data("squad_v2-dev")

    message = str(info.value)
    assert "dev-v2.0.json" in message and "--data" in message and len(message.splitlines()) == 1
    assert not datasets.cached_file("squad_v2-dev").exists()


def test_eval_cli_downloads_squad_v2_dev_and_reads_the_official_layout(tiny_model_dir, cache, tmp_path, monkeypatch):
    from explainer.eval import datasets

    monkeypatch.setattr(datasets, "_open_url", lambda url, timeout: _FakeResponse(json.dumps(_official()).encode()))
    out = tmp_path / "e.json"
    base = ["--model", str(tiny_model_dir), "--methods", "random", "--max-new-tokens", "2", "--skip-faithfulness"]

    assert main(["eval", "--data", "squad_v2-dev", *base, "--json", str(out)]) == 0
    assert json.loads(out.read_text())["n"] == len(ROWS)

    official = tmp_path / "dev-v2.0.json"
    official.write_text(json.dumps(_official()), encoding="utf-8")
    assert main(["eval", "--data", str(official), *base, "--limit", "1", "--json", str(out)]) == 0
    assert [s["id"] for s in json.loads(out.read_text())["samples"]] == ["q1"]


def test_eval_cli_offline_is_one_line(tiny_model_dir, cache, monkeypatch, capsys):
    from explainer.eval import datasets

    def offline(url, timeout):
        raise urllib.error.URLError("Name or service not known")

    monkeypatch.setattr(datasets, "_open_url", offline)
    assert main(["eval", "--data", "squad_v2-dev", "--model", str(tiny_model_dir)]) == EXIT_USER_ERROR
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Name or service not known" in err and "pass its path" in err


@pytest.mark.skipif(not SHARED_SQUAD.is_file(), reason=f"real data absent: {SHARED_SQUAD} (a checkout without shared/)")
def test_shared_squad_subset_reads_as_answerable_rows():
    rows = load_squad(SHARED_SQUAD)
    assert len(rows) == 350 and len({r["id"] for r in rows}) == 350
    for r in rows:
        assert r["answers"] and all(r["context"][a["answer_start"] :].startswith(a["text"]) for a in r["answers"])
