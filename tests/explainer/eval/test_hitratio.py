"""ABO's hit ratio on needle prompts (`explainer/eval/hitratio.py`, the `hitratio` command): the prompts are
deterministic, about the asked length, with the needle at the asked depth and spans that point at the right text; a
row's hit ratio recomputed by hand from the method's scores and the tokens' characters; the command resumed, sharded
and reported."""

from __future__ import annotations

import json

import numpy as np
import pytest

from explainer.bench.prompts import prompt_text
from explainer.cli import main
from explainer.eval.hitratio import NEEDLE, QUERY, SYSTEM, HitRatioConfig, evaluate_needle, needle_rows, needle_specs
from explainer.explain import explain
from explainer.models.loading import ModelBundle


@pytest.fixture(scope="module")
def paragraphs():
    return prompt_text()[0]  # the shipped essays


def test_needle_prompts_place_the_needle_and_name_their_spans(tokenizer, paragraphs):
    specs = needle_specs(lengths=(400, 900), depths=(10, 50, 90), samples=2)
    assert specs[:4] == [(400, 10, 0), (400, 50, 0), (400, 90, 0), (400, 10, 1)]  # whole depth sweeps first
    rows = needle_rows(tokenizer, paragraphs, specs, seed=1)
    assert rows == needle_rows(tokenizer, paragraphs, specs, seed=1)  # anyone can rebuild them
    assert len({r["password"] for r in rows}) == len(rows)  # a new made-up password per prompt
    for row in rows:
        text, spans = row["prompt"], row["spans"]
        assert text[slice(*spans["system"])] == SYSTEM and text[slice(*spans["query"])] == QUERY
        assert text[slice(*spans["needle"])] == NEEDLE.format(password=row["password"])
        assert text.count(row["password"]) == 1
        tokens = len(tokenizer(text, add_special_tokens=False)["input_ids"])
        assert row["length"] <= tokens <= row["length"] + 200  # whole sentences: it stops at the first past it
        haystack = (spans["system"][1], spans["query"][0])  # the needle's place among the haystack's characters
        where = (spans["needle"][0] - haystack[0]) / (haystack[1] - haystack[0])
        assert abs(100 * where - row["depth"]) < 20, (row["id"], where)


def test_a_row_recomputed_by_hand(llama, tokenizer, paragraphs):
    bundle = ModelBundle(name="tiny", model=llama, tokenizer=tokenizer)
    row = needle_rows(tokenizer, paragraphs, [(300, 50, 0)])[0]
    got = evaluate_needle(bundle, row, HitRatioConfig(methods=("macs", "random"), max_new_tokens=3))
    attr = explain(bundle, row["prompt"], methods=["macs", "random"], max_new_tokens=3)
    encoded = bundle.encode(row["prompt"])
    enc = tokenizer(encoded.text, add_special_tokens=False, return_offsets_mapping=True)
    base = encoded.text.index(row["prompt"])
    text, hits = [], []
    for i, (s, e) in enumerate(enc["offset_mapping"]):  # the user's text tokens, by their characters
        if e > s and base <= s < base + len(row["prompt"]):
            text.append(i)
            if any(base + a <= s < base + b for a, b in row["spans"].values()):
                hits.append(i)
    assert got["chance"] == pytest.approx(len(hits) / len(text))
    tokens = attr.generated_tokens  # the answer up to its last content token (no end-of-sequence token)
    k = max((j + 1 for j, t in enumerate(tokens) if t.strip() and t not in ("<|im_end|>", "<|endoftext|>")), default=1)
    for name in ("macs", "random"):
        raw = attr.methods[name].raw
        whole = [sum(float(raw[j, p]) for j in range(k)) for p in range(raw.shape[1])]
        on_hits, on_text = (sum(max(whole[p], 0.0) for p in ps) for ps in (hits, text))
        assert got["methods"][name]["hit_ratio"] == pytest.approx(on_hits / on_text, rel=1e-5)
    assert got["methods"]["random"]["hit_ratio"] == pytest.approx(got["chance"], abs=0.1)  # uniform: about chance


def test_hitratio_command_resumes_shards_and_reports(tiny_model_dir, tmp_path, capsys, monkeypatch):
    results = tmp_path / "hits.jsonl"
    args = ["hitratio", "--model", str(tiny_model_dir), "--methods", "macs,random", "--lengths", "250,350",
            "--depths", "20,80", "--samples", "1", "--max-new-tokens", "2", "--device", "cpu"]  # fmt: skip
    assert main([*args, "--limit", "2", "--results", str(results)]) == 0
    first = [json.loads(line)["id"] for line in results.read_text().splitlines()]
    assert first == ["needle:250:20:0", "needle:250:80:0"]
    assert main([*args, "--results", str(results)]) == 0
    assert len(results.read_text().splitlines()) == 4  # resumed: two new rows
    out = capsys.readouterr().out
    assert "~250 tokens" in out and "~350 tokens" in out and "chance" in out and "command: python -m explainer" in out
    single = {r["id"]: r for r in map(json.loads, results.read_text().splitlines())}
    sharded = tmp_path / "sharded.jsonl"
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        assert main([*args, "--results", str(sharded)]) == 0
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    ranks = [[json.loads(line) for line in (tmp_path / f"sharded.rank{r}-of-2.jsonl").read_text().splitlines()]
             for r in (0, 1)]  # fmt: skip
    assert [[row["id"] for row in rows] for rows in ranks] == [list(single)[:2], list(single)[2:]]
    for row in ranks[0] + ranks[1]:
        assert row["methods"]["macs"]["hit_ratio"] == pytest.approx(single[row["id"]]["methods"]["macs"]["hit_ratio"])
    capsys.readouterr()
    assert main(["hitratio", "--report", str(sharded)]) == 0
    out = capsys.readouterr().out
    assert "N = 2, depths [20, 80]" in out and "command: python -m explainer hitratio" in out
    assert np.isfinite(float(out.split("\nmacs")[1].split()[0]))


def test_a_joined_report_prints_every_files_command(tmp_path, capsys):
    def row(depth: int, method: str, command: str) -> str:
        entry = {"hit_ratio": 0.5, "seconds": 1.0}
        return json.dumps({"id": f"needle:1024:{depth}:0", "length": 1024, "depth": depth, "answer": "Kalo-1234",
                           "found": True, "chance": 0.05, "dtype": "float32", "methods": {method: entry},
                           "command": command}) + "\n"  # fmt: skip

    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    first.write_text(
        row(10, "macs", "python -m explainer hitratio --methods macs")
        + row(50, "macs", "python -m explainer hitratio --methods macs")
    )
    second.write_text(row(10, "attnlrp", "python -m explainer hitratio --methods attnlrp"))
    assert main(["hitratio", "--report", f"{first},{second}"]) == 0
    out = capsys.readouterr().out
    assert "N = 2" in out and "attnlrp" in out
    assert "command: python -m explainer hitratio --methods macs\n" in out
    assert "command: python -m explainer hitratio --methods attnlrp" in out
