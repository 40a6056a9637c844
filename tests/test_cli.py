"""`python -m explainer explain`: JSON layout, readable summary, and one-line errors for bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from explainer.cli import EXIT_USER_ERROR, main

ROOT = Path(__file__).resolve().parents[1]


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
    assert "answer:" in out and "[macs]" in out and "step   0" in out


@pytest.mark.parametrize(
    "args, message",
    [
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
