"""The precision choice: `precision.parse_dtype` and its rule for `auto`, `--dtype` on every command, the dtype
recorded in results (explain JSON, faithfulness JSON, eval rows, bench reports)."""

from __future__ import annotations

import json

import pytest
import torch

from explainer.cli import build_parser, main
from explainer.errors import InputError
from explainer.eval.evaluate import check_precision, merge_results
from explainer.models.loading import load_model
from explainer.runtime.precision import (
    DTYPE_CHOICES,
    cpu_has_native_bf16,
    default_dtype,
    dtype_name,
    model_dtype,
    parse_dtype,
    precision_label,
    precision_meta,
)

from ...conftest import build_model

COMMANDS = ("explain", "faithfulness", "eval", "bench")


@pytest.mark.parametrize(
    "text, dtype",
    [("float32", torch.float32), ("bfloat16", torch.bfloat16), ("float16", torch.float16),
     (" BFloat16 ", torch.bfloat16), ("auto", None), ("", None), (None, None)],
)  # fmt: skip
def test_parse_dtype_reads_each_value(text, dtype):
    assert parse_dtype(text) is dtype


@pytest.mark.parametrize("text", ["bf16", "fp32", "float64", "int8", "half"])
def test_parse_dtype_refuses_other_names_and_lists_the_valid_ones(text):
    with pytest.raises(InputError) as e:
        parse_dtype(text)
    assert str(e.value) == f"Unknown dtype {text!r}: use one of auto, float32, bfloat16, float16."


def test_auto_is_bfloat16_on_an_accelerator_and_float32_on_a_cpu_without_native_bf16():
    assert default_dtype("cpu") is torch.float32 and default_dtype(torch.device("cpu")) is torch.float32
    assert default_dtype("cuda") is torch.bfloat16 and default_dtype(torch.device("cuda", 1)) is torch.bfloat16


@pytest.mark.parametrize("flag", [" avx512_bf16", " amx_bf16 amx_tile"])
def test_auto_is_bfloat16_on_a_cpu_with_native_bf16(cpu_flags, flag):
    cpu_flags(flag)
    assert cpu_has_native_bf16() and default_dtype("cpu") is torch.bfloat16


def test_native_bf16_from_cpuinfo(tmp_path):
    f = tmp_path / "cpuinfo"
    f.write_text("flags\t\t: fpu avx2 avx512f\n")
    assert not cpu_has_native_bf16(str(f))
    f.write_text("flags\t\t: fpu avx2 avx512f avx512_bf16\n")
    assert cpu_has_native_bf16(str(f))
    f.write_text("flags\t\t: fpu avx2 amx_bf16\n")
    assert cpu_has_native_bf16(str(f))
    f.write_text("flags\t\t: fpu avx2 xavx512_bf16s\n")  # a whole flag only
    assert not cpu_has_native_bf16(str(f))
    assert not cpu_has_native_bf16(str(tmp_path / "absent"))


@pytest.mark.parametrize("flag, dtype", [("", "float32"), (" avx512_bf16", "bfloat16")])
def test_the_cli_and_the_app_load_auto_in_the_same_dtype(cpu_flags, monkeypatch, tiny_model_dir, tmp_path, flag, dtype):
    """`load_model(dtype=None)` (the CLI's `--dtype auto`) and the app (EXPLAINER_DTYPE unset) follow the CPU's flags,
    as the app's default-model choice (`fit.choose_defaults`) does."""
    from explainer.models import loading as library
    from ui import models as app_models

    cpu_flags(flag)
    assert library.hardware_defaults().dtype == dtype
    assert dtype_name(load_model(str(tiny_model_dir)).model.dtype) == dtype
    out = tmp_path / "r.json"
    argv = ["explain", "--model", str(tiny_model_dir), "--prompt", "Paris is", "--max-new-tokens", "1"]
    assert main([*argv, "--json", str(out)]) == 0 and json.loads(out.read_text())["meta"]["dtype"] == dtype
    monkeypatch.delenv("EXPLAINER_DTYPE", raising=False)
    monkeypatch.setattr(app_models, "model_ids", lambda: (str(tiny_model_dir), None))
    app_models.forget_models()
    try:
        assert dtype_name(app_models.get_bundle().model.dtype) == dtype
        assert f"· {dtype} on cpu ·" in app_models.model_info()
    finally:
        app_models.forget_models()


def test_names_read_back():
    for name in DTYPE_CHOICES[1:]:
        assert dtype_name(parse_dtype(name)) == name


def test_precision_of_a_model_and_of_an_object_without_weights():
    model = build_model("llama").to(torch.bfloat16)
    assert model_dtype(model) is torch.bfloat16
    assert precision_label(model) == "bfloat16 on cpu"
    assert precision_meta(model) == {"dtype": "bfloat16", "device": "cpu"}
    plain = torch.nn.Sequential(torch.nn.Embedding(3, 2), torch.nn.Linear(2, 2)).to(torch.float16)  # no .dtype
    assert model_dtype(plain) is torch.float16 and precision_label(plain) == "float16 on cpu"
    assert model_dtype(object()) is None and precision_label(object()) == "" and precision_meta(object()) == {}


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("value", DTYPE_CHOICES)
def test_every_command_takes_dtype(command, value):
    args = build_parser().parse_args([command, "--dtype", value])
    assert args.dtype == value
    assert build_parser().parse_args([command]).dtype == "auto"


@pytest.mark.parametrize("command", COMMANDS)
def test_a_bad_dtype_is_one_line_before_any_model_loads(command, tmp_path, capsys):
    data = tmp_path / "squad.json"
    data.write_text("[]", encoding="utf-8")
    extra = {"explain": ["--prompt", "hi"], "faithfulness": ["--prompt", "hi"], "eval": ["--data", str(data)]}
    assert main([command, "--model", "/no/such/model", "--dtype", "bf16", *extra.get(command, [])]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: Unknown dtype 'bf16': use one of auto, float32, bfloat16, float16."


def test_load_model_takes_a_dtype_or_its_name(tiny_model_dir):
    assert load_model(str(tiny_model_dir), device="cpu").model.dtype is torch.float32  # auto on the CPU
    assert load_model(str(tiny_model_dir), device="cpu", dtype="bfloat16").model.dtype is torch.bfloat16
    assert load_model(str(tiny_model_dir), device="cpu", dtype=torch.float16).model.dtype is torch.float16
    with pytest.raises(InputError, match="Unknown dtype 'fp8'"):
        load_model(str(tiny_model_dir), device="cpu", dtype="fp8")


def test_explain_bfloat16_records_the_precision_in_the_json(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "r.json"
    argv = [
        "explain",
        "--model",
        str(tiny_model_dir),
        "--prompt",
        "Paris is",
        "--max-new-tokens",
        "3",
        "--device",
        "cpu",
    ]
    assert main([*argv, "--dtype", "bfloat16", "--json", str(out)]) == 0
    meta = json.loads(out.read_text())["meta"]
    assert meta["dtype"] == "bfloat16" and meta["device"] == "cpu"
    assert main([*argv, "--json", str(out)]) == 0
    assert json.loads(out.read_text())["meta"]["dtype"] == "float32"
    capsys.readouterr()
    assert main([*argv, "--dtype", "bfloat16"]) == 0
    assert "(bfloat16 on cpu)" in capsys.readouterr().out.splitlines()[0]  # the summary's model line


def test_faithfulness_json_records_the_precision(tiny_model_dir, tmp_path):
    out = tmp_path / "f.json"
    argv = ["faithfulness", "--model", str(tiny_model_dir), "--prompt", "Paris is", "--max-new-tokens", "2",
            "--methods", "macs", "--soft", "off", "--dtype", "bfloat16", "--device", "cpu",
            "--json", str(out)]  # fmt: skip
    assert main(argv) == 0
    d = json.loads(out.read_text())
    assert d["dtype"] == "bfloat16" and d["device"] == "cpu"


ROW = {
    "id": "q1", "title": "t", "question": "What is the capital of France?",
    "context": "Paris is the capital of France.", "answers": [{"text": "Paris", "answer_start": 0}],
}  # fmt: skip


def test_eval_rows_record_the_precision_and_a_resume_in_another_one_is_refused(tiny_model_dir, tmp_path, capsys):
    data, out, results = tmp_path / "squad.json", tmp_path / "e.json", tmp_path / "r.jsonl"
    data.write_text(json.dumps([ROW]), encoding="utf-8")
    argv = ["eval", "--data", str(data), "--model", str(tiny_model_dir), "--methods", "macs", "--max-new-tokens", "2",
            "--skip-faithfulness", "--results", str(results)]  # fmt: skip
    assert main([*argv, "--dtype", "bfloat16", "--json", str(out)]) == 0
    d = json.loads(out.read_text())
    assert d["samples"][0]["dtype"] == "bfloat16" and d["config"]["dtype"] == "bfloat16"
    assert json.loads(results.read_text().splitlines()[0])["dtype"] == "bfloat16"
    capsys.readouterr()
    assert main([*argv, "--dtype", "float32"]) == 2
    err = capsys.readouterr().err
    assert "computed in bfloat16, but the model is loaded in float32: pass --dtype bfloat16" in err


def test_results_of_different_precisions_are_not_joined(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    row = {"id": "q1", "answer": "Paris", "methods": {"macs": {"auc_pr": 1.0}}}
    a.write_text(json.dumps({**row, "dtype": "float32"}) + "\n", encoding="utf-8")
    b.write_text(json.dumps({**row, "dtype": "bfloat16"}) + "\n", encoding="utf-8")
    with pytest.raises(InputError, match="evaluated in float32 and in bfloat16"):
        merge_results([a, b])
    b.write_text(json.dumps(row) + "\n", encoding="utf-8")  # rows from before the precision was recorded
    assert len(merge_results([a, b])) == 1
    check_precision([{"id": "x"}, {"id": "y", "dtype": "float32"}], "float32", a)  # same precision, or unknown
    with pytest.raises(InputError, match="pass --dtype float32"):
        check_precision([{"id": "y", "dtype": "float32"}], "bfloat16", a)


def test_bench_passes_the_dtype_to_its_workers(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "b.json"
    argv = ["bench", "--model", str(tiny_model_dir), "--prompt-tokens", "8", "--new-tokens", "2", "--methods", "none",
            "--repeats", "1", "--device", "cpu", "--dtype", "bfloat16", "--json", str(out), "--markdown"]  # fmt: skip
    assert main(argv) == 0
    assert json.loads(out.read_text())["dtype"] == "bfloat16"  # what the worker loaded, not what was asked
    printed = capsys.readouterr().out
    assert "dtype: bfloat16" in printed and " in bfloat16 on cpu (" in printed
    float32 = tmp_path / "b32.json"
    float32.write_text(json.dumps({**json.loads(out.read_text()), "dtype": "float32"}), encoding="utf-8")
    assert main(["bench", "--report", f"{out},{float32}"]) == 2
    assert "Reports differ in dtype (bfloat16, float32)" in capsys.readouterr().err


def test_a_peers_cuda_autocast_is_held_off_for_a_cuda_model_only_and_restored():
    """ContextCite wraps its passes in `torch.cuda.amp.autocast()` (float16 on a GPU); `without_cuda_autocast` makes
    that open nothing for a model on CUDA, leaves a CPU model's call as it is, and puts torch's function back after,
    also when the block raises."""
    import contextlib

    import torch

    from explainer.runtime.precision import without_cuda_autocast

    original = torch.cuda.amp.autocast
    with without_cuda_autocast(torch.device("cpu")):
        assert torch.cuda.amp.autocast is original
    with without_cuda_autocast(torch.device("cuda", 0)):
        assert torch.cuda.amp.autocast is not original
        assert isinstance(torch.cuda.amp.autocast(), contextlib.nullcontext)
        with torch.cuda.amp.autocast(dtype=torch.float16):  # what the package writes, with or without arguments
            assert not torch.is_autocast_enabled("cuda")
    assert torch.cuda.amp.autocast is original
    try:
        with without_cuda_autocast(torch.device("cuda")):
            raise RuntimeError("a pass failed")
    except RuntimeError:
        pass
    assert torch.cuda.amp.autocast is original
