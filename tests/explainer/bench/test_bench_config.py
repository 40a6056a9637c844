"""`BenchConfig`: checked once when built, sent whole to every worker process; no model is loaded."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from explainer.bench import BenchConfig, BenchRow, runner
from explainer.cli import main
from explainer.errors import InputError, UnknownMethodError


def test_values_are_normalised_once():
    config = BenchConfig(prompt_lengths=[64, 16, 64], methods=[" None", "MACS", "macs", ""], prompt_file=None)
    assert config.prompt_lengths == (64, 16) and config.methods == ("none", "macs")
    with pytest.raises(AttributeError):  # frozen: what was checked stays checked
        config.repeats = 0


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"prompt_lengths": []}, InputError, "Prompt lengths must be a list of whole numbers"),
        ({"prompt_lengths": [16, 0]}, InputError, "Prompt lengths must be positive numbers of tokens, got 0"),
        ({"prompt_lengths": [16.5]}, InputError, "Prompt lengths must be a list of whole numbers"),
        ({"prompt_lengths": "256"}, InputError, "Prompt lengths must be a list of whole numbers"),
        ({"new_tokens": 0}, InputError, "New tokens must be a whole number, at least 1, got 0"),
        ({"repeats": 0}, InputError, "Repeats must be a whole number, at least 1, got 0"),
        ({"repeats": 2.5}, InputError, "Repeats must be a whole number"),
        ({"methods": []}, InputError, "Give at least one method"),
        ({"methods": "none,macs"}, InputError, "Methods must be a list of names"),
        (
            {"methods": ["none", "nope"]},
            UnknownMethodError,
            "Unknown method 'nope'. Available for bench: none, plain, macs",
        ),
        ({"methods": ["macs:alpha=x"]}, InputError, "alpha"),
        ({"threads": 0}, InputError, "Threads must be at least 1"),
        ({"quiet_wait": -1.0}, InputError, "zero or more seconds"),
        ({"dtype": "float8"}, InputError, "float8"),
        ({"prompt_file": "/no/such/file.txt"}, InputError, "does not exist"),
    ],
)
def test_bad_configs_are_refused_when_built(kwargs, error, message):
    with pytest.raises(error, match=message.replace("(", r"\(")):
        BenchConfig(**kwargs)


def test_an_empty_text_file_is_refused_when_built(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("# header only\n", encoding="utf-8")
    with pytest.raises(InputError, match="holds no text"):
        BenchConfig(prompt_file=empty)


def test_every_worker_gets_the_config_whole_and_the_report_keeps_its_format(tmp_path, monkeypatch):
    text = tmp_path / "t.txt"
    text.write_text("Some text to repeat.", encoding="utf-8")
    config = BenchConfig(
        model="m", prompt_lengths=(8, 16), new_tokens=2, methods=("none", "macs"), repeats=1, device="cpu",
        device_map={"model.embed_tokens": "cpu"}, prompt_file=text, quiet_wait=0.5, threads=1,
    )  # fmt: skip
    specs = []

    def spawn(spec):
        specs.append(json.loads(json.dumps(spec)))  # what the worker reads back from its command line
        row = BenchRow(spec["method"], spec["prompt_tokens"], 2, 1.0, 1.0, repeats=1, seconds_all=[2.0])
        return {
            "row": asdict(row),
            "model": "m",
            "device": "cpu",
            "dtype": "float32",
            "torch_threads": 1,
            "text_source": "t",
        }

    monkeypatch.setattr(runner, "_spawn", spawn)
    report = runner.run_bench(config)
    assert [(s["prompt_tokens"], s["method"]) for s in specs] == [(8, "none"), (8, "macs"), (16, "none"), (16, "macs")]
    assert all(BenchConfig.from_json(s["config"]) == config for s in specs)
    assert specs[0]["config"]["prompt_file"] == str(text) and isinstance(
        BenchConfig.from_json(specs[0]["config"]).prompt_file, Path
    )
    assert set(report) == {"rows", "machine", "model", "dtype", "text_source", "new_tokens", "quiet_wait_s", "date"}
    assert report["new_tokens"] == 2 and report["quiet_wait_s"] == 0.5 and len(report["rows"]) == 4


def test_the_command_line_defaults_are_the_configs(monkeypatch, capsys):
    seen = []

    def run_bench(config, log=None):
        seen.append(config)
        raise InputError("stop here")

    monkeypatch.setattr("explainer.cli.bench.run_bench", run_bench)
    assert main(["bench"]) == 2 and "stop here" in capsys.readouterr().err
    assert seen == [BenchConfig()]
    assert main(["bench", "--prompt-tokens", "32,8", "--methods", "none,rollout", "--repeats", "2"]) == 2
    assert seen[-1] == BenchConfig(prompt_lengths=(32, 8), methods=("none", "rollout"), repeats=2)
