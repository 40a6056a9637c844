"""Data-parallel `eval`: under torchrun each rank evaluates its block of rows into its own results file, and
`eval --report` on the base path joins them into exactly the tables (and rows) of a single-process run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from explainer.cli import EXIT_USER_ERROR, main
from explainer.errors import InputError
from explainer.eval.parallel import Rank, rank_from_env, rank_path, results_files, shard

ROOT = Path(__file__).resolve().parents[3]
FACTS = [
    ("What is the capital of France?", "Paris is the capital of France, Berlin that of Germany.", "Paris"),
    ("Which dog is lazy?", "The quick brown fox jumps over the lazy dog.", "the lazy dog"),
    ("What is the capital of Germany?", "Berlin is the capital of Germany, Paris that of France.", "Berlin"),
    ("What jumps over the dog?", "The quick brown fox jumps over the lazy dog.", "The quick brown fox"),
    ("Where is France?", "France is a country in Europe.", "Europe"),
]


def _rows() -> list[dict]:
    rows = []
    for i, (question, context, answer) in enumerate(FACTS):
        start = context.index(answer)
        rows.append({"id": f"q{i}", "title": "t", "question": question, "context": context,
                     "answers": [{"text": answer, "answer_start": start}]})  # fmt: skip
    return rows


def _eval_command(launcher: list[str], data: Path, model: Path, results: Path) -> list[str]:
    return [*launcher, "explainer", "eval", "--data", str(data), "--model", str(model), "--methods", "macs,random",
            "--max-new-tokens", "3", "--device", "cpu", "--results", str(results)]  # fmt: skip


def _run(command: list[str], **env: str) -> subprocess.CompletedProcess:
    # One thread per process, as torchrun sets it: both runs compute with the same reductions.
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)  # packages found so far too
    environ = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path, **env}
    proc = subprocess.run(command, cwd=ROOT, env=environ, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _report(path: Path, capsys) -> tuple[str, list[dict]]:
    """The printed tables (without the line of recorded compute seconds) and the joined rows without timings."""
    out = path.parent / f"{path.stem}.summary.json"
    assert main(["eval", "--report", str(path), "--json", str(out)]) == 0
    tables = capsys.readouterr().out.split("\ncompute recorded")[0]
    samples = json.loads(out.read_text())["samples"]
    for s in samples:
        s.pop("seconds")
        for fields in s["methods"].values():
            fields.pop("seconds")
    return tables, samples


def test_torchrun_eval_joins_into_the_single_process_tables(tiny_model_dir, tmp_path, capsys):
    data = tmp_path / "squad.json"
    data.write_text(json.dumps(_rows()))
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m"]
    parallel = tmp_path / "parallel.jsonl"
    _run(_eval_command(launcher, data, tiny_model_dir, parallel))
    single = tmp_path / "single.jsonl"
    _run(_eval_command([sys.executable, "-m"], data, tiny_model_dir, single))

    assert not parallel.exists()
    ids = [[json.loads(line)["id"] for line in rank_path(parallel, r, 2).read_text().splitlines()] for r in (0, 1)]
    assert ids == [["q0", "q1"], ["q2", "q3", "q4"]]  # contiguous blocks, in the dataset's order
    tables, samples = _report(parallel, capsys)
    expected_tables, expected_samples = _report(single, capsys)
    assert "N = 5 samples" in tables and "macs" in tables
    assert tables == expected_tables
    assert samples == expected_samples


def test_ranks_take_contiguous_blocks_that_cover_the_rows():
    rows = list(range(7))
    for world in (1, 2, 3, 7, 9):
        blocks = [shard(rows, r, world) for r in range(world)]
        assert sum(blocks, []) == rows
        assert max(map(len, blocks)) - min(map(len, blocks)) <= 1


def test_rank_from_env():
    assert rank_from_env({}) == Rank(0, 1, 0, 1)
    env = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
    assert rank_from_env(env) == Rank(3, 4, 1, 2)
    bad_envs = ({"RANK": "2", "WORLD_SIZE": "2"}, {"RANK": "x", "WORLD_SIZE": "2"}, {"WORLD_SIZE": "0"},
                {**env, "LOCAL_RANK": "2"})  # fmt: skip
    for bad in bad_envs:
        with pytest.raises(InputError):
            rank_from_env(bad)


def test_report_finds_rank_files_and_refuses_an_incomplete_run(tmp_path):
    base = tmp_path / "results.jsonl"
    assert rank_path(base, 1, 2).name == "results.rank1-of-2.jsonl"
    assert rank_path(tmp_path / "results", 0, 3).name == "results.rank0-of-3"
    with pytest.raises(InputError, match="does not exist"):
        results_files(base)
    for r in (1, 0):
        rank_path(base, r, 2).write_text("")
    (tmp_path / "results.rank0-of-2.jsonl.bak").write_text("")  # not a rank file
    (tmp_path / "other.rank0-of-1.jsonl").write_text("")  # another run
    assert results_files(base) == [rank_path(base, 0, 2), rank_path(base, 1, 2)]
    base.write_text("")
    assert results_files(base) == [base, rank_path(base, 0, 2), rank_path(base, 1, 2)]
    rank_path(base, 2, 3).write_text("")
    with pytest.raises(InputError, match=r"results\.rank0-of-3\.jsonl, results\.rank1-of-3\.jsonl"):
        results_files(base)


def test_rank_without_results_file_is_refused(tiny_model_dir, tmp_path, capsys, monkeypatch):
    data = tmp_path / "squad.json"
    data.write_text(json.dumps(_rows()))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main(["eval", "--data", str(data), "--model", str(tiny_model_dir)]) == EXIT_USER_ERROR
    assert "--results" in capsys.readouterr().err
    results = tmp_path / "r.jsonl"
    args = ["eval", "--data", str(data), "--model", str(tiny_model_dir), "--results", str(results)]
    assert main([*args, "--device-map", "auto"]) == EXIT_USER_ERROR  # two ranks on this machine, each on all GPUs
    assert "one process per machine" in capsys.readouterr().err
