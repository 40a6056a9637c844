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
from explainer.cli.hitratio import comparisons, needle_plan
from explainer.errors import InputError
from explainer.eval.hitratio import (
    NEEDLE,
    QUERY,
    SYSTEM,
    VARIANTS,
    HitRatioConfig,
    evaluate_needle,
    needle_layout,
    needle_rows,
    needle_specs,
    other_depth,
    score_maps,
    summarise,
    written,
)
from explainer.eval.hitscore import average_precision
from explainer.explain import explain
from explainer.models.loading import ModelBundle


@pytest.fixture(scope="module")
def paragraphs():
    return prompt_text()[0]  # the shipped essays


def test_needle_prompts_place_the_needle_and_name_their_spans(tokenizer, paragraphs):
    specs = needle_specs(lengths=(400, 900), depths=(10, 50, 90), samples=2)
    assert specs[:4] == [(400, 10, 0, "plain"), (400, 50, 0, "plain"), (400, 90, 0, "plain"), (400, 10, 1, "plain")]
    rows = needle_rows(tokenizer, paragraphs, specs, seed=1)
    assert rows == needle_rows(tokenizer, paragraphs, specs, seed=1)  # anyone can rebuild them
    assert len({r["password"] for r in rows}) == len(rows)  # a new made-up password per prompt
    for row in rows:
        text, spans = row["prompt"], row["spans"]
        assert text[slice(*spans["system"])] == SYSTEM and text[slice(*spans["query"])] == QUERY
        assert text[slice(*spans["needles"][0])] == NEEDLE.format(password=row["password"])
        assert text.count(row["password"]) == 1
        body = text[slice(*spans["body"])]
        assert body.startswith(body.strip()) and SYSTEM not in body and QUERY not in body
        tokens = len(tokenizer(text, add_special_tokens=False)["input_ids"])
        assert row["length"] <= tokens <= row["length"] + 200  # whole sentences: it stops at the first past it
        where = (spans["needles"][0][0] - spans["body"][0]) / (spans["body"][1] - spans["body"][0])
        assert abs(100 * where - row["depth"]) < 20, (row["id"], where)


def test_the_variants_share_haystack_and_password_and_differ_in_their_needles(tokenizer, paragraphs):
    plain, para, contra = needle_rows(tokenizer, paragraphs, needle_specs((2000,), (30,), 1, tuple(VARIANTS)))
    assert [r["id"] for r in (plain, para, contra)] == [f"needle:{v}:2000:30:0" for v in VARIANTS]
    assert plain["password"] == para["password"] == contra["password"]  # paired across variants
    frame, question = VARIANTS["paraphrased"]
    assert para["prompt"][slice(*para["spans"]["needles"][0])] == frame.format(password=para["password"])
    assert para["prompt"].endswith(question) and "secret" not in para["prompt"].split(para["password"])[0][-40:]
    assert len(contra["passwords"]) == len(set(contra["passwords"])) == 3
    needles = contra["spans"]["needles"]
    assert [contra["prompt"][a:b] for a, b in needles] == [NEEDLE.format(password=p) for p in contra["passwords"]]
    assert contra["needle_depths"] == [30, other_depth(30, 27), other_depth(30, 53)] == [30, 57, 83]
    assert all(10 <= other_depth(d, o) < 90 for d in range(10, 91) for o in (27, 53))
    body = contra["spans"]["body"]
    needle_chars = sum(b - a + 1 for a, b in needles)
    for (a, _), depth in zip(needles, contra["needle_depths"]):
        before = sum(e - s + 1 for s, e in needles if e <= a)  # the other needles' characters before this one
        where = (a - body[0] - before) / (body[1] - body[0] - needle_chars)  # among the haystack's characters
        assert abs(100 * where - depth) < 20


def test_written_finds_the_password_and_its_steps():
    tokens = ["The", " password", " is", " Ka", "lo", "mi", "-", "12", "34", ".", "<|im_end|>"]
    assert written(["Kalomi-1234"], tokens) == (0, [3, 4, 5, 6, 7, 8])
    assert written(["Zeta-1111", "kalomi-1234"], tokens) == (1, [3, 4, 5, 6, 7, 8])  # case-insensitive
    assert written(["Kalomi-12"], tokens) == (0, [3, 4, 5, 6, 7])  # a token that starts the password counts
    assert written(["Kalo-1234"], tokens) == (None, [])  # not quite the password: not found


def _layout_by_hand(tokenizer, encoded, row):
    """The user's text tokens by their characters: the scored ones (in the body), each needle's, the question's."""
    enc = tokenizer(encoded.text, add_special_tokens=False, return_offsets_mapping=True)
    base = encoded.text.index(row["prompt"])
    inside = lambda s, span: base + span[0] <= s < base + span[1]  # noqa: E731
    scored, needles, question = [], [[] for _ in row["spans"]["needles"]], []
    for i, (s, e) in enumerate(enc["offset_mapping"]):
        if e > s and inside(s, row["spans"]["body"]):
            scored.append(i)
            for j, span in enumerate(row["spans"]["needles"]):
                needles[j] += [i] if inside(s, span) else []
        question += [i] if e > s and inside(s, row["spans"]["query"]) else []
    return scored, needles, question


@pytest.mark.parametrize("variant", ["plain", "contradictory"])
def test_a_row_recomputed_by_hand(llama, tokenizer, paragraphs, variant):
    bundle = ModelBundle(name="tiny", model=llama, tokenizer=tokenizer)
    row = needle_rows(tokenizer, paragraphs, [(300, 50, 0, variant)])[0]
    secret = row["passwords"][-1]  # with contradictory needles: the last one, so the others are non-hits
    answer = f"It is {secret}."
    got = evaluate_needle(bundle, row, HitRatioConfig(methods=("macs", "random"), max_new_tokens=24), answer=answer)
    attr = explain(bundle, row["prompt"], methods=["macs", "random"], max_new_tokens=24, answer=answer)
    scored, needles, question = _layout_by_hand(tokenizer, bundle.encode(row["prompt"]), row)
    hits = needles[-1]
    assert got["found"] and got["written"] == len(row["passwords"]) - 1
    assert got["n_scored"] == len(scored) and got["n_hits"] == len(hits) and 0 < len(hits) < len(scored)
    assert got["chance"] == pytest.approx(len(hits) / len(scored))
    text, ends = "", []
    for t in attr.generated_tokens:
        text += t
        ends.append(len(text))
    start = text.index(secret)
    lengths = [len(t) for t in attr.generated_tokens]
    steps = [k for k, end in enumerate(ends) if end > start and end - lengths[k] < start + len(secret)]
    assert got["steps"] == steps and len(steps) >= 2
    for name in ("macs", "random"):
        raw = attr.methods[name].raw
        m = np.zeros(len(scored))
        for k in steps:
            row_k = np.array([max(float(raw[k, p]), 0.0) for p in scored])
            m += row_k / row_k.sum() / len(steps)
        assert got["methods"][name]["mass"] == pytest.approx(sum(m[i] for i, p in enumerate(scored) if p in hits))
        hit = np.array([p in hits for p in scored])
        assert got["methods"][name]["ap"] == pytest.approx(average_precision(m, hit))
    assert got["methods"]["blind: question"]["mass"] == 0.0 and question
    assert got["methods"]["blind: uniform"]["mass"] == pytest.approx(got["chance"])
    assert got["methods"]["blind: uniform"]["ap"] == pytest.approx(got["chance_ap"])


def test_a_row_whose_answer_lacks_the_password_is_not_scored(llama, tokenizer, paragraphs):
    bundle = ModelBundle(name="tiny", model=llama, tokenizer=tokenizer)
    row = needle_rows(tokenizer, paragraphs, [(250, 50, 0)])[0]
    got = evaluate_needle(bundle, row, HitRatioConfig(methods=("random",), max_new_tokens=16), answer="I do not know")
    assert not got["found"] and got["steps"] == [] and got["methods"]["random"]["mass"] is None
    summary = summarise([got])["groups"][(250, "plain")]
    assert summary["n"] == 1 and summary["found"] == 0 and summary["methods"]["random"]["mass"][2] == 0


def test_the_post_hoc_methods_run_after_the_answer_and_score_as_in_one_call(llama, tokenizer, paragraphs,
                                                                            monkeypatch):  # fmt: skip
    """The post-hoc methods (Sources, AtMan, the gradient methods) run after the answer, teacher-forced, the gradient
    methods for the steps that write the password only: their scores equal those of the maps computed over every step
    in one call with the streaming methods; without the password in the answer they do not run at all (one call, the
    streaming methods') and are not scored."""
    bundle = ModelBundle(name="tiny", model=llama, tokenizer=tokenizer)
    row = needle_rows(tokenizer, paragraphs, [(300, 30, 0)])[0]
    answer = f"It is {row['password']}."
    methods = ("macs", "sources", "atman", "attnlrp", "input_x_gradient")
    got = evaluate_needle(bundle, row, HitRatioConfig(methods=methods, max_new_tokens=24), answer=answer)
    every = explain(bundle, row["prompt"], methods=list(methods), max_new_tokens=24, answer=answer)
    out = {"found": True, "written": got["written"], "steps": got["steps"], "methods": {}}
    score_maps(out, needle_layout(bundle, bundle.encode(row["prompt"], max_new_tokens=24), row),
               {name: np.asarray(s.raw, dtype=np.float64) for name, s in every.methods.items()})  # fmt: skip
    assert got["found"] and 2 <= len(got["steps"]) < len(every.generated_tokens)
    for name in methods:
        assert got["methods"][name]["mass"] == pytest.approx(out["methods"][name]["mass"], rel=1e-4), name
        assert got["methods"][name]["ap"] == pytest.approx(out["methods"][name]["ap"], rel=1e-4), name
    calls = []

    def counted(*args, methods, **kwargs):
        calls.append(list(methods))
        return explain(*args, methods=methods, **kwargs)

    monkeypatch.setattr("explainer.eval.hitratio.explain", counted)
    missed = evaluate_needle(bundle, row, HitRatioConfig(methods=methods, max_new_tokens=24), answer="No idea.")
    assert calls == [["macs"]]  # the post-hoc methods never ran
    assert all(missed["methods"][m] == {"mass": None, "ap": None} for m in methods[1:])
    assert missed["methods"]["macs"]["mass"] is None
    calls.clear()
    alone = evaluate_needle(bundle, row, HitRatioConfig(methods=("attnlrp",), max_new_tokens=24), answer=answer)
    assert calls == [["random"], ["attnlrp"]]  # the cheapest first, for the answer; then the method
    assert alone["methods"]["attnlrp"]["ap"] == got["methods"]["attnlrp"]["ap"]
    assert set(alone["methods"]) == {"attnlrp"} | {m for m in got["methods"] if m.startswith("blind")}


def test_hitratio_command_resumes_shards_and_reports(tiny_model_dir, tmp_path, capsys, monkeypatch):
    results = tmp_path / "hits.jsonl"
    args = ["hitratio", "--model", str(tiny_model_dir), "--methods", "macs,random", "--lengths", "250,350",
            "--depths", "20,80", "--samples", "1", "--max-new-tokens", "2", "--device", "cpu"]  # fmt: skip
    assert main([*args, "--limit", "2", "--results", str(results)]) == 0
    first = [json.loads(line)["id"] for line in results.read_text().splitlines()]
    assert first == ["needle:plain:250:20:0", "needle:plain:250:80:0"]
    assert main([*args, "--results", str(results)]) == 0
    assert len(results.read_text().splitlines()) == 4  # resumed: two new rows
    out = capsys.readouterr().out
    assert "~250 tokens, plain" in out and "~350 tokens, plain" in out and "chance" in out
    assert "blind: uniform" in out and "command: python -m explainer" in out
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
        assert row["answer"] == single[row["id"]]["answer"]
        ours, theirs = row["methods"]["macs"], single[row["id"]]["methods"]["macs"]
        assert (ours["mass"], ours["ap"]) == pytest.approx((theirs["mass"], theirs["ap"]))
    capsys.readouterr()
    assert main(["hitratio", "--report", str(sharded)]) == 0
    out = capsys.readouterr().out
    assert "N = 2, answer holds the password in" in out and "depths [20, 80]" in out
    assert "command: python -m explainer hitratio" in out


def test_a_joined_report_prints_every_files_command(tmp_path, capsys):
    def row(depth: int, method: str, command: str) -> str:
        entry = {"mass": 0.5, "ap": 0.4, "seconds": 1.0}
        return json.dumps({"id": f"needle:plain:1024:{depth}:0", "variant": "plain", "length": 1024, "depth": depth,
                           "answer": "Kalo-1234", "found": True, "chance": 0.05, "chance_ap": 0.07, "dtype": "float32",
                           "methods": {method: entry}, "command": command}) + "\n"  # fmt: skip

    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    first.write_text(
        row(10, "macs", "python -m explainer hitratio --methods macs")
        + row(50, "macs", "python -m explainer hitratio --methods macs")
    )
    second.write_text(row(10, "attnlrp", "python -m explainer hitratio --methods attnlrp"))
    assert main(["hitratio", "--report", f"{first},{second}", "--compare", "attnlrp/macs"]) == 0
    out = capsys.readouterr().out
    assert "N = 2" in out and "attnlrp" in out and "paired attnlrp - macs" in out
    assert "command: python -m explainer hitratio --methods macs\n" in out
    assert "command: python -m explainer hitratio --methods attnlrp" in out


def test_bad_variants_and_comparisons_are_refused(capsys):
    with pytest.raises(InputError, match="--variants"):
        needle_plan("1024", "50", 1, None, "plain,shouted")
    with pytest.raises(InputError, match="--compare"):
        comparisons("macs-rollout")
    assert comparisons("macs_calibrated/macs, sources/macs") == [("macs_calibrated", "macs"), ("sources", "macs")]
