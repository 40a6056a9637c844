"""`python -m explainer explain`: JSON layout, readable summary, and one-line errors for bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from explainer.cli import EXIT_USER_ERROR, build_parser, main

ROOT = Path(__file__).resolve().parents[3]


def test_json_output_layout(tiny_model_dir, tmp_path):
    out = tmp_path / "r.json"
    rc = main(
        ["explain", "--model", str(tiny_model_dir), "--prompt", "What is the capital of France?",
         "--methods", "macs,random", "--max-new-tokens", "5", "--json", str(out)]
    )  # fmt: skip
    assert rc == 0
    d = json.loads(out.read_text())
    for key in ("model", "prompt_token_ids", "prompt_tokens", "generated_token_ids", "generated_tokens", "methods"):
        assert key in d
    n, k = len(d["prompt_token_ids"]), len(d["generated_token_ids"])
    assert len(d["prompt_tokens"]) == n and len(d["generated_tokens"]) == k and 1 <= k <= 5
    assert set(d["methods"]) == {"macs", "random"}
    for m in d["methods"].values():
        assert len(m["raw"]) == len(m["z"]) == k
        assert all(len(row) == n for row in m["raw"] + m["z"])
        assert m["seconds"] >= 0


def test_method_options_reach_the_method(tiny_model_dir, tmp_path):
    out = tmp_path / "r.json"
    rc = main(
        ["explain", "--model", str(tiny_model_dir), "--prompt", "Paris is", "--max-new-tokens", "3",
         "--methods", "macs:alpha=0.5:pooling=mean,random:seed=3", "--json", str(out)]
    )  # fmt: skip
    assert rc == 0
    meta = {m: v["meta"] for m, v in json.loads(out.read_text())["methods"].items()}
    assert meta["macs"]["alpha"] == 0.5 and meta["macs"]["pooling"] == "mean" and meta["random"]["seed"] == 3
    plain = tmp_path / "plain.json"
    main(["explain", "--model", str(tiny_model_dir), "--prompt", "Paris is", "--max-new-tokens", "3", "--methods",
          "macs", "--json", str(plain)])  # fmt: skip
    assert (
        json.loads(plain.read_text())["methods"]["macs"]["raw"] != json.loads(out.read_text())["methods"]["macs"]["raw"]
    )


def test_summary_without_json(tiny_model_dir, capsys):
    rc = main(["explain", "--model", str(tiny_model_dir), "--prompt", "Paris is", "--max-new-tokens", "3"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "answer:" in out and "[macs]" in out and "step   1" in out


def test_contrast_step_with_a_foil_from_the_alternatives(tiny_model_dir, tmp_path, capsys):
    base = ["explain", "--model", str(tiny_model_dir), "--prompt", "Paris is", "--max-new-tokens", "3"]
    plain = tmp_path / "plain.json"
    assert main([*base, "--methods", "macs,input_x_gradient", "--json", str(plain)]) == 0
    alternative = json.loads(plain.read_text())["meta"]["alternatives"][1][1]  # step 2's second most probable token
    capsys.readouterr()
    rc = main(
        [*base, "--methods", "macs,input_x_gradient", "--contrast-step", "2", "--foil-id", str(alternative["id"])]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert f"rather than {alternative['token']!r}" in out
    assert "no contrastive map" in out.split("[input_x_gradient]")[0]  # under MACS at step 2, not under the gradient
    assert "no contrastive map" not in out.split("[input_x_gradient]")[1]
    contrasted = tmp_path / "contrast.json"
    rc = main([*base, "--methods", "input_x_gradient", "--contrast-step", "2", "--foil-id", str(alternative["id"]),
               "--json", str(contrasted)])  # fmt: skip
    saved = json.loads(contrasted.read_text())
    assert rc == 0 and saved["meta"]["contrast"]["steps"]["2"]["foil_id"] == alternative["id"]
    raw, before = saved["methods"]["input_x_gradient"]["raw"], json.loads(plain.read_text())["methods"]
    assert raw[0] == before["input_x_gradient"]["raw"][0] and raw[1] != before["input_x_gradient"]["raw"][1]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--prompt", "hi", "--contrast-step", "1"], "go together"),
        (["--prompt", "hi", "--foil", "x"], "go together"),
        (["--prompt", "hi", "--contrast-step", "0", "--foil-id", "5"], "counts answer tokens from 1"),
        (["--prompt", "hi", "--max-new-tokens", "2", "--contrast-step", "9", "--foil-id", "5"], "not a step"),
        (["--prompt", "   "], "empty"),
        (["--prompt", "word " * 300, "--max-prompt-tokens", "50"], "limit is 50"),
        (["--prompt", "hi", "--max-new-tokens", "600"], "context"),
        (["--prompt", "hi", "--methods", "macs,nope"], "Unknown method 'nope'"),
        (["--prompt", "hi", "--methods", "macs:alpha=7"], "alpha must lie in [0, 1]"),
        (["--prompt", "hi", "--methods", "atman:batch=4"], "Unknown option 'batch' for atman"),
        (["--prompt-file", "/does/not/exist.txt"], "Cannot read prompt file"),
        (["--prompt", "hi", "--json", "/does/not/exist/out.json"], "does not exist"),
    ],
)
def test_bad_input_exits_with_one_line(tiny_model_dir, capsys, args, message):
    rc = main(["explain", "--model", str(tiny_model_dir), *args])
    err = capsys.readouterr().err
    assert rc == EXIT_USER_ERROR
    assert message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_unknown_model_subprocess_has_no_traceback(tmp_path):
    missing = tmp_path / "no-such-model"
    proc = subprocess.run(
        [sys.executable, "-m", "explainer", "explain", "--prompt", "hi", "--model", str(missing)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == EXIT_USER_ERROR
    assert "Traceback" not in proc.stderr
    assert "does not exist" in proc.stderr.strip().splitlines()[-1]


def test_folder_without_model_is_a_clear_error(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("not a model")
    rc = main(["explain", "--model", str(tmp_path), "--prompt", "hi"])
    assert rc == EXIT_USER_ERROR
    assert "Could not load model" in capsys.readouterr().err


def test_faithfulness_command_json(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "f.json"
    rc = main(
        ["faithfulness", "--model", str(tiny_model_dir), "--prompt", "Question: What is the capital of France?",
         "--methods", "macs,rollout", "--max-new-tokens", "5", "--step", "2", "--json", str(out)]
    )  # fmt: skip
    assert rc == 0
    printed = capsys.readouterr().out
    assert "SRG logit" in printed and "random" in printed and "x generation" in printed
    d = json.loads(out.read_text())
    assert set(d["seconds"]) == {"generation", "removal", "soft"} and all(v > 0 for v in d["seconds"].values())
    assert set(d["removal"]["auc"]) == {"macs", "rollout", "random"}
    assert d["removal"]["auc"]["macs"]["logit"]["srg"] == pytest.approx(
        d["removal"]["auc"]["macs"]["logit"]["lif"] - d["removal"]["auc"]["macs"]["logit"]["mif"]
    )
    assert d["soft"]["steps"] == [1] and set(d["soft"]["auc_ns"]) == {"macs", "rollout"}
    assert d["ratio_to_generation"]["removal"] == pytest.approx(d["seconds"]["removal"] / d["seconds"]["generation"])


def test_faithfulness_command_all_steps_and_bad_step(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "f.json"
    rc = main(
        ["faithfulness", "--model", str(tiny_model_dir), "--prompt", "Paris is", "--max-new-tokens", "6",
         "--all-steps", "--methods", "macs", "--json", str(out)]
    )  # fmt: skip
    assert rc == 0
    d = json.loads(out.read_text())
    assert d["soft"]["steps"] == list(range(0, d["generated_tokens"], 5))
    rc = main(["faithfulness", "--model", str(tiny_model_dir), "--prompt", "Paris is", "--step", "99"])
    assert rc == EXIT_USER_ERROR and "--step must lie between 1 and" in capsys.readouterr().err


def _tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


ANSWER = "Paris is the capital of France."


def test_explain_a_given_answer_json(tiny_model_dir, tmp_path):
    out = tmp_path / "r.json"
    rc = main(
        ["explain", "--model", str(tiny_model_dir), "--prompt", "What is the capital of France?", "--answer", ANSWER,
         "--methods", "macs,atman", "--max-new-tokens", "16", "--json", str(out)]
    )  # fmt: skip
    assert rc == 0
    d = json.loads(out.read_text())
    tok = _tokenizer(tiny_model_dir)
    assert tok.decode(d["generated_token_ids"]) == ANSWER and "".join(d["generated_tokens"]) == ANSWER
    assert d["meta"]["answer"] == "given" and d["meta"]["answer_tokenization"] == "in context"
    k = len(d["generated_token_ids"])
    for m in d["methods"].values():
        assert len(m["raw"]) == k
    scores = d["step_scores"]
    assert len(scores["probability"]) == len(scores["entropy"]) == k
    assert all(0 <= p <= 1 for p in scores["probability"]) and all(h >= 0 for h in scores["entropy"])


def test_answer_file_equals_answer_and_the_summary_prints_step_scores(tiny_model_dir, tmp_path, capsys):
    path = tmp_path / "answer.txt"
    path.write_text(ANSWER + "\n", encoding="utf-8")  # the line break an editor adds is not part of the answer
    from_file, inline = tmp_path / "f.json", tmp_path / "i.json"
    common = ["explain", "--model", str(tiny_model_dir), "--prompt", "Capital?", "--max-new-tokens", "16"]
    assert main([*common, "--answer-file", str(path), "--json", str(from_file)]) == 0
    assert main([*common, "--answer", ANSWER, "--json", str(inline)]) == 0
    a, b = json.loads(from_file.read_text()), json.loads(inline.read_text())
    assert (
        a["generated_token_ids"] == b["generated_token_ids"]
        and a["methods"]["macs"]["raw"] == b["methods"]["macs"]["raw"]
    )
    capsys.readouterr()
    assert main([*common, "--answer", ANSWER]) == 0
    out = capsys.readouterr().out
    assert f"answer (given, teacher-forced): {ANSWER!r}" in out
    assert "step scores:" in out and "nats" in out
    lines = [line for line in out.splitlines() if " nats" in line]
    assert len(lines) == len(a["generated_token_ids"])
    p, h = a["step_scores"]["probability"][0], a["step_scores"]["entropy"][0]
    assert f"p {p:.4f}  H {h:.3f} nats" in lines[0]


@pytest.mark.parametrize(
    "args, message",
    [
        # a longer answer raises max_new_tokens (`request.fit_answer`, the app's rule too): here past the context
        (["--answer", "word " * 1100, "--max-new-tokens", "8"], "1024 new tokens were asked for, but the model"),
        (["--answer", "  "], "The answer is empty"),
        (["--answer-file", "/does/not/exist.txt"], "Cannot read answer file"),
    ],
)
def test_bad_answers_exit_with_one_line(tiny_model_dir, capsys, args, message):
    rc = main(["explain", "--model", str(tiny_model_dir), "--prompt", "hi", *args])
    err = capsys.readouterr().err
    assert rc == EXIT_USER_ERROR and message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_answer_and_answer_file_exclude_each_other(tiny_model_dir, capsys):
    with pytest.raises(SystemExit):
        main(["explain", "--model", str(tiny_model_dir), "--prompt", "hi", "--answer", "a", "--answer-file", "f"])
    assert "not allowed with argument" in capsys.readouterr().err


def test_faithfulness_of_a_given_answer(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "f.json"
    rc = main(
        ["faithfulness", "--model", str(tiny_model_dir), "--prompt", "Question: What is the capital of France?",
         "--answer", ANSWER, "--methods", "macs", "--max-new-tokens", "16", "--soft", "off", "--json", str(out)]
    )  # fmt: skip
    assert rc == 0
    assert "answer (given, teacher-forced) (" in capsys.readouterr().out
    d = json.loads(out.read_text())
    assert d["answer"] == ANSWER and d["answer_given"] is True
    assert d["generated_tokens"] == len(_tokenizer(tiny_model_dir)(ANSWER)["input_ids"])
    assert d["removal"]["curves"]["macs"]["logit"]["mif"][0] == pytest.approx(1.0)
    assert d["removal"]["generations"]["macs"]["mif"][0] != ANSWER  # the model's own answer, regenerated


def test_the_explain_command_builds_one_request_before_loading_the_model(monkeypatch, capsys, tmp_path):
    from explainer.cli import build_parser
    from explainer.cli.explain import explain_request_of
    from explainer.models import loading

    answer = tmp_path / "answer.txt"
    answer.write_text("It is Paris.\n", encoding="utf-8")
    args = build_parser().parse_args(
        ["explain", "--prompt", "Where is Paris?", "--methods", "macs:alpha=0.5,rollout", "--max-new-tokens", "12",
         "--no-chat-template", "--answer-file", str(answer), "--contrast-step", "2", "--foil", " London"]
    )  # fmt: skip
    request = explain_request_of(args)
    assert request.prompt == "Where is Paris?" and request.method_names == ("macs", "rollout")
    assert request.method_options == {"macs": {"alpha": 0.5}} and request.max_new_tokens == 12
    assert not request.chat_template and request.answer == "It is Paris." and request.contrast == {1: " London"}

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded before the request was checked")

    monkeypatch.setattr(loading, "load_model", no_load)
    image = str(ROOT / "assets" / "images" / "red-square.png")
    for bad, message in [
        (["--max-new-tokens", "0"], "max_new_tokens must be between 1 and 1024, got 0"),
        (["--max-new-tokens", "2", "--contrast-step", "3", "--foil-id", "5"], "Contrast step 2 is not a step"),
        (["--methods", "sources", "--image", image], "sources cannot explain image prompts"),
    ]:
        rc = main(["explain", "--model", "never-loaded", "--prompt", "Where is Paris?", *bad])
        err = capsys.readouterr().err
        assert rc == EXIT_USER_ERROR and message in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("command", ["explain", "faithfulness", "eval", "bench", "haystack"])
def test_the_dtype_help_states_the_auto_rule(command):
    """`auto` is bfloat16 on an accelerator and on a CPU with native bf16, float32 on other CPUs
    (`precision.default_dtype`): the help must not say "float32 on the CPU"."""
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices[command]
    (dtype,) = [a for a in sub._actions if a.dest == "dtype"]
    text = " ".join(dtype.help.split())
    assert "bfloat16 on a GPU" in text and "CPU with native bf16" in text and "float32 on other CPUs" in text
    assert "avx512_bf16" in text and "amx_bf16" in text
