"""LDS and top-k drop on a tiny model (`explainer/eval/ablate.py`, `explainer/eval/lds_eval.py`, the `lds` command):
the batched removal runs against a solo forward of each shortened prompt, a row's LDS and drops recomputed with
plain loops from solo forwards, and the command resumed, sharded into rank files and reported."""

from __future__ import annotations

import hashlib
import json
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

from explainer.cli import main
from explainer.errors import InputError
from explainer.eval.ablate import response_logprobs
from explainer.eval.datasets import haystack_rows, question_key, select_rows
from explainer.eval.evaluate import context_positions, load_squad, qa_prompt
from explainer.eval.lds import ablation_masks
from explainer.eval.lds_eval import LdsConfig, evaluate_lds_sample, format_table, summarise
from explainer.eval.metrics import spearman
from explainer.explain import explain
from explainer.models.loading import ModelBundle
from explainer.result.segments import sentence_groups
from explainer.result.steps import last_content_step

from ...conftest import build_model
from ...reference import reference_knockout_logprobs

SHARED_DEV = Path(__file__).resolve().parents[4] / "shared" / "data" / "squad2-dev-350.json"
CONTEXT = (
    "Paris is the capital of France. Berlin is the capital of Germany. The quick brown fox jumps over the lazy dog. "
    "Numbers 0123456789 and punctuation."
)
ROW = {"id": "q1", "title": "t", "question": "What is the capital of France?", "context": CONTEXT,
       "answers": [{"text": "Paris", "answer_start": 0}]}  # fmt: skip


def solo_logprobs(model, ids: list[int], response: list[int]) -> np.ndarray:
    """(K,) log p of each response token after `ids`, from one plain forward of the whole sequence."""
    seq = torch.tensor([ids + response])
    with torch.no_grad():
        logits = model(input_ids=seq).logits[0].float()  # (T, V)
    logp = torch.log_softmax(logits, dim=-1)
    return np.array([float(logp[len(ids) - 1 + k, t]) for k, t in enumerate(response)])


@pytest.mark.parametrize("kind", ["llama", "qwen2_sliding"])
def test_removal_runs_equal_a_solo_forward_of_the_shortened_prompt(kind):
    model = build_model(kind)
    g = torch.Generator().manual_seed(0)
    prompt, response = torch.randint(3, 300, (40,), generator=g), torch.randint(3, 300, (5,), generator=g)
    keep = torch.rand(12, 40, generator=g) > 0.4
    keep[0], keep[1, :3], keep[:, -1] = True, False, True  # the unperturbed run; a removal from position 0
    got = response_logprobs(model, prompt, response, keep, batch_size=3)
    for i in range(12):
        want = solo_logprobs(model, prompt[keep[i]].tolist(), response.tolist())
        np.testing.assert_allclose(got[i], want, atol=2e-4)
    with pytest.raises(ValueError, match="last token"):
        response_logprobs(model, prompt, response, ~keep[:1])


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_removal_runs_that_drop_their_removed_tokens_equal_a_solo_forward(attention):
    """Rows removed from after a shared prefix leave their removed tokens out and are left-padded to the longest in
    their batch: rows of very different lengths share a pass (one removes 4 tokens late, one most of the prompt)."""
    model = build_model("llama")
    model.set_attn_implementation(attention)
    g = torch.Generator().manual_seed(2)
    prompt, response = torch.randint(3, 300, (48,), generator=g), torch.randint(3, 300, (6,), generator=g)
    keep = torch.rand(10, 48, generator=g) > 0.5
    keep[:, :12], keep[:, -1] = True, True  # every removal starts at 12 or later: the dropped layout
    keep[1, 12:] = True
    keep[1, 40:44] = False  # a short removal late in the prompt beside long ones
    keep[2, 12:40] = False  # most of the prompt removed
    got = response_logprobs(model, prompt, response, keep, batch_size=5)
    for i in range(10):
        want = solo_logprobs(model, prompt[keep[i]].tolist(), response.tolist())
        np.testing.assert_allclose(got[i], want, atol=2e-4)
    assert not np.allclose(got[2], got[1], atol=1e-2)  # the removals change the answer's log-probabilities


def test_knockout_runs_equal_one_forward_with_the_blinding_mask():
    model = build_model("llama")
    g = torch.Generator().manual_seed(1)
    prompt, response = torch.randint(3, 300, (40,), generator=g), torch.randint(3, 300, (5,), generator=g)
    keep = torch.rand(9, 40, generator=g) > 0.4
    keep[0], keep[:, -1] = True, True
    keep[1, 30:] = True  # removes only before the re-read positions
    keep[2, :32] = True  # removes only among them
    got = response_logprobs(model, prompt, response, keep, batch_size=4, reread_from=32)
    for i in range(9):
        removed = set(torch.where(~keep[i])[0].tolist())
        want = reference_knockout_logprobs(model, prompt.tolist(), response.tolist(), removed, 32)
        np.testing.assert_allclose(got[i], want, atol=2e-4)
    assert not np.allclose(got[1], got[0])  # the knockout changes what the re-read positions see
    with pytest.raises(ValueError, match="reread_from"):
        response_logprobs(model, prompt, response, keep, reread_from=40)


def test_a_row_recomputed_from_solo_forwards(llama, tokenizer):
    bundle = ModelBundle(name="tiny", model=llama, tokenizer=tokenizer)
    cfg = LdsConfig(methods=("macs", "random"), max_new_tokens=4, masks=10, top_k=(1, 2))
    got = evaluate_lds_sample(bundle, ROW, cfg)
    # the same generation, then every quantity by hand
    prompt, start = qa_prompt(ROW)
    attr = explain(bundle, prompt, methods=["macs", "random"], max_new_tokens=4)
    positions, _ = context_positions(bundle, bundle.encode(prompt, max_new_tokens=4), prompt, start)
    sentences = [list(s.positions) for s in sentence_groups(attr.prompt_tokens, positions) if s.kind == "sentence"]
    assert got["n_sentences"] == len(sentences) == 4
    k = last_content_step(attr) + 1
    response, ids = attr.generated_token_ids[:k], attr.prompt_token_ids

    def logp_without(removed: set[int]) -> np.ndarray:
        drop = {p for s in removed for p in sentences[s]}
        return solo_logprobs(llama, [t for i, t in enumerate(ids) if i not in drop], response)

    full = logp_without(set())
    assert got["log_p"] == pytest.approx(full.sum(), abs=1e-3)
    masks = ablation_masks(4, 10, 0.5, [0, zlib.crc32(b"q1")])
    measured = np.stack([logp_without({s for s in range(4) if not m[s]}) for m in masks])  # (M, K)
    for name in ("macs", "random"):
        raw = np.nan_to_num(attr.methods[name].raw[:k].astype(np.float64))  # (K, N)
        per_step = np.array([[sum(raw[j, p] for p in s) for s in sentences] for j in range(k)])  # (K, S)
        whole = per_step.sum(axis=0)
        predicted = [sum(whole[s] for s in range(4) if m[s]) for m in masks]
        entry = got["methods"][name]
        assert entry["lds"] == pytest.approx(spearman(measured.sum(axis=1), predicted), abs=1e-6)
        tokens = [spearman(measured[:, j], [sum(per_step[j, s] for s in range(4) if m[s]) for m in masks])
                  for j in range(k)]  # fmt: skip
        assert entry["lds_token"] == pytest.approx(np.mean([t for t in tokens if t is not None]), abs=1e-6)
        # centred: each step's token scores minus their mean over the context tokens, then summed into sentences
        cen = np.array([[sum(raw[j, p] - np.mean([raw[j, q] for q in positions]) for p in s) for s in sentences]
                        for j in range(k)])  # fmt: skip  # (K, S)
        predicted_c = [sum(cen.sum(axis=0)[s] for s in range(4) if m[s]) for m in masks]
        assert entry["lds_centred"] == pytest.approx(spearman(measured.sum(axis=1), predicted_c), abs=1e-6)
        tokens_c = [spearman(measured[:, j], [sum(cen[j, s] for s in range(4) if m[s]) for m in masks])
                    for j in range(k)]  # fmt: skip
        assert entry["lds_token_centred"] == pytest.approx(np.mean([t for t in tokens_c if t is not None]), abs=1e-6)
        for top in (1, 2):
            best = set(np.argsort(-whole, kind="stable")[:top].tolist())
            assert entry[f"drop@{top}"] == pytest.approx(full.sum() - logp_without(best).sum(), abs=1e-3)
            drops = [full[j] - logp_without(set(np.argsort(-per_step[j], kind="stable")[:top].tolist()))[j]
                     for j in range(k)]  # fmt: skip
            assert entry[f"drop_token@{top}"] == pytest.approx(np.mean(drops), abs=1e-3)
    assert set(got["methods"]) == {"macs", "random"}  # centred is a column of every method, not a pseudo-method


def _rows() -> list[dict]:
    out = []
    for i, question in enumerate(["What is the capital of France?", "Which dog is lazy?"]):
        out.append({**ROW, "id": f"q{i}", "question": question})
    return out


def test_lds_command_resumes_shards_and_reports(tiny_model_dir, tmp_path, capsys, monkeypatch):
    data = tmp_path / "squad.json"
    data.write_text(json.dumps(_rows()))
    results = tmp_path / "lds.jsonl"
    args = ["lds", "--data", str(data), "--model", str(tiny_model_dir), "--methods", "macs,random", "--masks", "4",
            "--max-new-tokens", "2", "--device", "cpu", "--results", str(results)]  # fmt: skip
    assert main([*args, "--limit", "1"]) == 0
    assert [json.loads(line)["id"] for line in results.read_text().splitlines()] == ["q0"]
    out = capsys.readouterr().out
    assert "N = 1 rows" in out and "lds_centred" in out and "lds_token_centred" in out
    assert "command: python -m explainer lds" in out
    assert main(args) == 0 and len(results.read_text().splitlines()) == 2  # resumed: one new row
    single = {json.loads(line)["id"]: json.loads(line) for line in results.read_text().splitlines()}
    sharded = tmp_path / "sharded.jsonl"
    for rank in (0, 1):  # what torchrun sets for each of two processes
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        assert main([*args[:-1], str(sharded)]) == 0
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    capsys.readouterr()
    assert main(["lds", "--report", str(sharded)]) == 0
    assert "N = 2 rows" in capsys.readouterr().out
    ranks = [[json.loads(line) for line in (tmp_path / f"sharded.rank{r}-of-2.jsonl").read_text().splitlines()]
             for r in (0, 1)]  # fmt: skip
    assert [[row["id"] for row in rows] for rows in ranks] == [["q0"], ["q1"]]  # one contiguous block per rank
    for row in ranks[0] + ranks[1]:
        assert row["methods"]["macs"] == pytest.approx(single[row["id"]]["methods"]["macs"])


def test_lds_command_builds_the_long_contexts_that_the_surrogate_command_builds(tiny_model_dir, tmp_path):
    rows = [{**ROW, "id": f"q{i}", "title": f"T{i}", "context": f"{ROW['context']} Row {i}."} for i in range(2)]
    data = tmp_path / "squad.json"
    data.write_text(json.dumps(rows))
    args = ["lds", "--data", str(data), "--model", str(tiny_model_dir), "--methods", "random", "--masks", "4",
            "--max-new-tokens", "2", "--device", "cpu"]  # fmt: skip
    short, long = tmp_path / "short.jsonl", tmp_path / "long.jsonl"
    assert main([*args, "--results", str(short)]) == 0
    assert main([*args, "--paragraphs", "2", "--results", str(long)]) == 0
    short_rows, long_rows = ([json.loads(x) for x in f.read_text().splitlines()] for f in (short, long))
    assert [r["id"] for r in long_rows] == [r["id"] for r in haystack_rows(rows, 2)] == ["haystack:q0", "haystack:q1"]
    assert [r["n_sentences"] for r in long_rows] == [2 * r["n_sentences"] for r in short_rows]  # both paragraphs
    assert "--paragraphs 2" in long_rows[0]["command"]


@pytest.mark.skipif(not SHARED_DEV.is_file(), reason=f"{SHARED_DEV} is absent (the shared SQuAD 2.0 dev sample)")
def test_lds_runs_on_a_squad_dev_row(tiny_model_dir, capsys):
    # row 67 has the shortest context: the tiny model's 512 positions hold it with the tiny tokenizer
    assert main(["lds", "--data", str(SHARED_DEV), "--offset", "67", "--limit", "1", "--model", str(tiny_model_dir),
                 "--methods", "random", "--masks", "4", "--max-new-tokens", "2", "--device", "cpu"]) == 0  # fmt: skip
    assert "N = 1 rows" in capsys.readouterr().out


def test_a_joined_report_prints_every_files_command(tmp_path, capsys):
    def row(i: int, method: str, command: str) -> str:
        entry = {"lds": 0.1 * i, "lds_token": 0.0, "drop@1": 1.0, "drop_token@1": 0.1}
        return json.dumps({"id": f"q{i}", "answer": "Paris", "dtype": "float32", "methods": {method: entry},
                           "command": command}) + "\n"  # fmt: skip

    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    first.write_text(
        row(1, "macs", "python -m explainer lds --methods macs")
        + row(2, "macs", "python -m explainer lds --methods macs")
    )
    second.write_text(row(1, "atman", "python -m explainer lds --methods atman --limit 1"))
    assert main(["lds", "--report", f"{first},{second}"]) == 0
    out = capsys.readouterr().out
    assert "N = 2 rows" in out and "(1)" in out  # AtMan on one of the two rows
    assert "command: python -m explainer lds --methods macs\n" in out
    assert "command: python -m explainer lds --methods atman --limit 1" in out


def test_ids_pick_questions_by_id_or_text_key_in_their_order(tmp_path, capsys, tiny_model_dir):
    official = {"data": [{"title": "T", "paragraphs": [{"context": ROW["context"], "qas": [
        {"id": f"official{i}", "question": q, "answers": [{"text": "fox", "answer_start": 16}], "is_impossible": False}
        for i, q in enumerate(["What is the capital of France?", "Which dog is lazy?", "Who jumps?"])]}]}]}  # fmt: skip
    data = tmp_path / "dev.json"
    data.write_text(json.dumps(official))
    rows = load_squad(data)
    ids = tmp_path / "run.ids"
    lines = ["# a comment", f"mine2 {question_key(rows[2])}", "", "official0  # by its own id",
             f"mine1 {question_key(rows[1])}"]  # fmt: skip
    ids.write_text("\n".join(lines) + "\n")
    chosen = select_rows(rows, ids)
    assert [r["id"] for r in chosen] == ["mine2", "official0", "mine1"]  # the file's order and ids
    assert [r["question"] for r in chosen] == ["Who jumps?", "What is the capital of France?", "Which dog is lazy?"]
    assert question_key(rows[0]) == hashlib.sha1(f"T\n{ROW['context']}\nWhat is the capital of France?".encode()
                                                 ).hexdigest()[:16]  # fmt: skip
    ids.write_text("mine9 0123456789abcdef\n")
    with pytest.raises(InputError, match="1 questions of .* are not in the data"):
        select_rows(rows, ids)
    ids.write_text("a b c\n")
    with pytest.raises(InputError, match="expected 'ID' or 'ID KEY'"):
        select_rows(rows, ids)
    ids.write_text(f"mine2 {question_key(rows[2])}\nmine1 {question_key(rows[1])}\n")
    results = tmp_path / "lds.jsonl"
    assert main(["lds", "--data", str(data), "--ids", str(ids), "--offset", "1", "--limit", "1", "--model",
                 str(tiny_model_dir), "--methods", "random", "--masks", "4", "--max-new-tokens", "2", "--device", "cpu",
                 "--results", str(results)]) == 0  # fmt: skip
    assert [json.loads(line)["id"] for line in results.read_text().splitlines()] == ["mine1"]
    assert "--ids" in json.loads(results.read_text().splitlines()[0])["command"]


def test_the_table_leaves_out_the_per_token_block_where_no_row_has_one():
    reference = {"id": "a", "methods": {"context-cite": {"lds": 0.5, "lds_centred": 0.25}}}
    method = {"id": "b", "methods": {"macs": {"lds": 0.75, "lds_token": 0.5}}}
    alone = format_table(summarise([reference, {**reference, "id": "c"}]))
    assert "whole answer" in alone and "per answer token" not in alone and "0.250" in alone
    assert "per answer token" in format_table(summarise([reference, method]))


def test_a_single_row_prints_its_value_without_an_interval():
    one = {"id": "a", "methods": {"macs": {"lds": 0.75, "lds_token": 0.5}}}
    table = format_table(summarise([one]))
    assert "0.750" in table and "nan" not in table and "±" not in table.split("\n", 1)[1]
    two = format_table(summarise([one, {"id": "b", "methods": {"macs": {"lds": 0.25, "lds_token": 0.5}}}]))
    assert "0.500 ± " in two and "nan" not in two
