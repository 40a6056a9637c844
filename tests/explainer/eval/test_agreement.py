"""Agreement of low-precision maps with float32 maps: the statistics against hand computations, the measurement on a
tiny model (teacher forcing, resume) and the `agreement` command."""

from __future__ import annotations

import json

import numpy as np
import pytest

from explainer.cli import main
from explainer.errors import InputError
from explainer.eval.agreement import (
    AgreementConfig,
    compare_rows,
    example_prompts,
    format_table,
    run_agreement,
    summarise,
    top_k,
    top_k_overlap,
)
from explainer.eval.metrics import average_ranks, spearman
from explainer.models.loading import load_model


def brute_ranks(x: np.ndarray) -> np.ndarray:
    """Rank of each value: 1 + how many are smaller + half of the others equal to it."""
    x = np.asarray(x, dtype=np.float64)
    return np.array([1 + (x < v).sum() + ((x == v).sum() - 1) / 2 for v in x])


def reference_spearman(a, b) -> float:
    return float(np.corrcoef(brute_ranks(a), brute_ranks(b))[0, 1])


def test_average_ranks_known_and_random_with_ties():
    assert average_ranks(np.array([5.0, 1.0, 5.0])).tolist() == [2.5, 1.0, 2.5]
    assert average_ranks(np.array([3.0, 3.0, 3.0, 3.0])).tolist() == [2.5] * 4
    assert average_ranks(np.array([0.3, -1.0, 2.0])).tolist() == [2.0, 1.0, 3.0]
    rng = np.random.default_rng(0)
    for _ in range(50):
        x = rng.integers(0, 6, size=int(rng.integers(1, 30))).astype(np.float32)  # many ties
        np.testing.assert_array_equal(average_ranks(x), brute_ranks(x))


def test_spearman_matches_pearson_of_ranks():
    rng = np.random.default_rng(1)
    for _ in range(50):
        n = int(rng.integers(3, 40))
        a = rng.normal(size=n)
        b = np.round(a + rng.normal(scale=0.7, size=n), 1)  # correlated, with ties from rounding
        a[rng.integers(0, n, size=n // 4)] = 0.0  # ties in the other row too
        assert spearman(a, b) == pytest.approx(reference_spearman(a, b), abs=1e-12)


def test_spearman_known_cases():
    x = np.arange(6, dtype=np.float32)
    assert spearman(x, x) == 1.0
    assert spearman(x, -x) == -1.0
    assert spearman(x, np.exp(x)) == 1.0  # any increasing transform
    # ranks (1..5) and (1, 2, 3.5, 5, 3.5); centred (-2, -1, 0, 1, 2) and (-2, -1, 0.5, 2, 0.5): 8 / sqrt(10 * 9.5)
    assert spearman([1, 2, 3, 4, 5], [5, 6, 7, 8, 7]) == pytest.approx(8 / np.sqrt(95), abs=1e-12)
    assert spearman(x, np.ones(6)) is None  # a constant row has no ranking
    assert spearman([1.0], [2.0]) is None
    # non-finite positions are left out of both rows
    assert spearman([1, 2, np.nan, 4], [1, 2, 3, 4]) == 1.0
    assert spearman([1, 2, 3, np.inf], [3, 2, 1, 0]) == -1.0


def test_top_k_and_overlap():
    a = np.array([0.1, 0.9, 0.5, 0.7, 0.3, 0.8, 0.0])
    assert top_k(a, 3) == [1, 5, 3]
    assert top_k(np.array([1.0, 2.0, 2.0, 1.0]), 2) == [1, 2]  # ties: the earlier position first
    assert top_k(np.array([np.nan, 1.0, 0.0]), 5) == [1, 2]  # k cut to the finite values
    b = a.copy()
    assert top_k_overlap(a, b) == 5
    b[[1, 5]] = -1.0  # two of the top five fall out, replaced by positions 0 and 6
    assert top_k_overlap(a, b) == 3
    assert top_k_overlap(a, -a) == 3  # top five of 7 and bottom five of 7 share 3
    assert top_k_overlap(a, b, k=1) == 0
    c = a.copy()
    c[1] = np.nan  # position 1 is left out of both rows
    assert top_k_overlap(a, c) == 5


def test_compare_rows_per_step_and_over_positions():
    rng = np.random.default_rng(2)
    ref = rng.normal(size=(3, 12)).astype(np.float32)
    other = ref.copy()
    other[1] = -other[1]
    out = compare_rows(ref, other)
    assert out["spearman"] == [1.0, -1.0, 1.0] and out["top5"] == [5, 0, 5]
    sub = compare_rows(ref, other, positions=[0, 1, 2])
    assert sub["spearman"][1] == -1.0 and sub["top5"] == [3, 3, 3]  # k cut to the 3 positions: all of them
    with pytest.raises(ValueError, match="differ in shape"):
        compare_rows(ref, other[:, :5])


def _row(pid, spearmans, overlaps, method="macs"):
    per = {"spearman": spearmans, "top5": overlaps}
    return {"id": pid, "methods": {method: per}, "user_methods": {method: per}}


def test_summary_pools_the_steps_of_all_prompts():
    rows = [
        _row("a", [0.9, 1.0, None], [5, 4, 3]),
        _row("b", [0.5, 0.8], [2, 5]),
        {"id": "c", "error": "too long"},
        _row("d", [0.7], [4], method="rollout"),
    ]
    s = summarise(rows)
    m = s["macs"]
    assert m["median_spearman"] == pytest.approx(np.median([0.9, 1.0, 0.5, 0.8]))
    assert m["p25_spearman"] == pytest.approx(np.percentile([0.9, 1.0, 0.5, 0.8], 25))
    assert m["median_top5"] == 4.0 and m["frac_top5_good"] == pytest.approx(3 / 5)
    assert (m["prompts"], m["steps"], m["undefined"]) == (2, 5, 1)
    assert s["rollout"]["prompts"] == 1 and summarise(rows, "user") == s
    table = format_table(s)
    lines = table.splitlines()
    assert lines[0].startswith("| method | median Spearman | 25th pct Spearman | median top-5 overlap |")
    assert lines[2] == f"| macs | 0.8500 | {np.percentile([0.9, 1.0, 0.5, 0.8], 25):.4f} | 4.0 | 60.0% | 2 | 5 | 1 |"
    assert lines[3] == "| rollout | 0.7000 | 0.7000 | 4.0 | 100.0% | 1 | 1 | 0 |"
    undefined = format_table(summarise([_row("e", [None], [5])])).splitlines()[2]
    assert undefined == "| macs | - | - | 5.0 | 100.0% | 1 | 1 | 1 |"
    with pytest.raises(InputError, match="positions"):
        summarise(rows, "context")


def test_example_prompts_are_the_apps_text_examples(tmp_path):
    shipped = example_prompts()
    assert len(shipped) >= 2 and all(p["source"] == "example" and p["prompt"].strip() for p in shipped)
    assert shipped[0]["id"] == "example:0"
    path = tmp_path / "examples.json"
    path.write_text(json.dumps([{"prompt": "a"}, {"prompt": "b", "image": "x.png"}, {"label": "no prompt"}]))
    assert example_prompts(path) == [{"id": "example:0", "source": "example", "prompt": "a"}]
    path.write_text("{")
    with pytest.raises(InputError, match="Cannot read the example prompts"):
        example_prompts(path)


PROMPTS = [
    {"id": "p1", "source": "example", "prompt": "Where is Paris?"},
    {"id": "p2", "source": "squad", "prompt": "Which dog is lazy? The quick brown fox jumps over the lazy dog."},
]


@pytest.fixture(scope="module")
def bundles(tiny_model_dir):
    path = str(tiny_model_dir)
    return load_model(path, device="cpu"), load_model(path, device="cpu", dtype="bfloat16")


def test_same_precision_agrees_exactly(bundles):
    """float32 against itself, teacher-forced: the pipeline compares the same steps, so the rows are equal."""
    reference, _ = bundles
    cfg = AgreementConfig(methods=("macs", "rollout"), max_new_tokens=4)
    rows = run_agreement(reference, reference, PROMPTS[:1], cfg)
    for name in ("macs", "rollout"):
        per = rows[0]["methods"][name]
        assert len(per["spearman"]) == rows[0]["answer_tokens"] >= 1
        assert all(v in (1.0, None) for v in per["spearman"]) and set(per["top5"]) == {5}


def test_bfloat16_rows_resume_and_refuse_another_precision(bundles, tmp_path, capsys):
    reference, low = bundles
    cfg = AgreementConfig(methods=("macs", "rollout"), max_new_tokens=4)
    results = tmp_path / "r.jsonl"
    rows = run_agreement(reference, low, PROMPTS, cfg, results)
    assert [r["id"] for r in rows] == ["p1", "p2"] and len(results.read_text().splitlines()) == 2
    for r in rows:
        assert (r["reference_dtype"], r["dtype"], r["source"]) == ("float32", "bfloat16", r["source"])
        for key in ("methods", "user_methods"):
            for name in ("macs", "rollout"):
                per = r[key][name]
                assert len(per["spearman"]) == len(per["top5"]) == r["answer_tokens"]
                assert all(v is None or -1 <= v <= 1 for v in per["spearman"])
                assert all(0 <= v <= 5 for v in per["top5"])
    logged = []
    again = run_agreement(reference, low, PROMPTS, cfg, results, log=logged.append)
    assert again == rows and len(results.read_text().splitlines()) == 2 and "resuming: 2 of 2" in logged[0]
    with pytest.raises(InputError, match="write to another --results file"):
        run_agreement(reference, reference, PROMPTS, cfg, results)  # float32 vs float32 into a bf16 file


def test_agreement_command_measures_resumes_and_reports(tiny_model_dir, tmp_path, capsys):
    data, results = tmp_path / "squad.json", tmp_path / "a.jsonl"
    rows = [{"id": "q1", "title": "t", "question": "Which dog?", "context": "The lazy dog sleeps.",
             "answers": [{"text": "lazy dog", "answer_start": 4}]}]  # fmt: skip
    data.write_text(json.dumps(rows))
    argv = ["agreement", "--model", str(tiny_model_dir), "--device", "cpu", "--methods", "macs,rollout",
            "--data", str(data), "--limit", "1", "--max-new-tokens", "3", "--results", str(results)]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    ids = [json.loads(line)["id"] for line in results.read_text().splitlines()]
    assert ids == [p["id"] for p in example_prompts()] + ["q1"]
    assert out.startswith(f"bfloat16 vs float32; {len(ids)} prompts; over the prompt tokens")
    assert "| macs |" in out and "| rollout |" in out
    assert main(["agreement", "--report", str(results), "--positions", "user"]) == 0
    assert "over the user tokens" in capsys.readouterr().out


@pytest.mark.parametrize(
    "args, message",
    [
        (["--dtype", "float32", "--results", "r.jsonl"], "--dtype must name the precision compared with float32"),
        (["--dtype", "half", "--results", "r.jsonl"], "Unknown dtype 'half'"),
        ([], "--results FILE.jsonl is required"),
        (["--results", "/no/such/folder/r.jsonl"], "its folder does not exist"),
        (["--methods", "nope", "--results", "r.jsonl"], "nope"),
        (["--no-examples", "--results", "r.jsonl"], "No prompts"),
        (["--report", "/no/such/file.jsonl"], "does not exist"),
    ],
)
def test_bad_input_is_one_line_before_any_model_loads(args, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["agreement", "--model", "/no/such/model", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and message in err and len(err.splitlines()) == 1
