"""One place for each fact the environment gives: SPACES_ZERO_GPU is read by `runtime.hardware.zero_gpu` alone, so
every user (the default models, the memory figures, `on_gpu`, the app's preload) agrees on what it means."""

from __future__ import annotations

import ast
import sys
import types
from pathlib import Path

import pytest
import torch

from explainer.models import loading
from explainer.runtime import fit, hardware, memory
from ui import models as app_models

ROOT = Path(__file__).resolve().parents[1]
CODE = ("explainer", "ui", "visuals")


async def _handler(x):
    yield x


def _fake_spaces(monkeypatch) -> None:
    """A `spaces` package whose GPU decorator returns the function it is given (what `spaces.GPU` runs)."""
    monkeypatch.setitem(sys.modules, "spaces", types.SimpleNamespace(GPU=lambda fn, duration: fn))


def _what_the_users_say(monkeypatch) -> dict[str, bool]:
    """Whether each user of the variable takes this machine (a CPU, CUDA never initialised) for ZeroGPU."""
    _fake_spaces(monkeypatch)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (7 * 2**30, 8 * 2**30))  # asked only off ZeroGPU
    monkeypatch.delenv(memory.BUDGET_ENV, raising=False)
    return {
        "zero_gpu": hardware.zero_gpu(),
        "on_gpu": hardware.on_gpu(_handler) is not _handler,  # turned into a plain generator for `spaces`
        "default models": loading.gpu_available() and loading.hardware_defaults() == fit.choose_defaults(None, True),
        "memory": memory.available_bytes("cuda") is None,  # not asked: CUDA must stay uninitialised
        "preload": app_models._options()["device"] == "cuda",
    }


@pytest.mark.parametrize("value", ["1", "t", "true", "TRUE", "yes", "Yes", "on", " on "])
def test_every_user_takes_a_set_flag_for_zerogpu(monkeypatch, value):
    monkeypatch.setenv("SPACES_ZERO_GPU", value)
    assert _what_the_users_say(monkeypatch) == dict.fromkeys(
        ("zero_gpu", "on_gpu", "default models", "memory", "preload"), True
    )


@pytest.mark.parametrize("value", [None, "", "0", "false", "no", "off"])
def test_no_user_takes_an_unset_flag_for_zerogpu(monkeypatch, value):
    if value is None:
        monkeypatch.delenv("SPACES_ZERO_GPU", raising=False)
    else:
        monkeypatch.setenv("SPACES_ZERO_GPU", value)
    assert not any(_what_the_users_say(monkeypatch).values())


def environment_reads(root: Path = ROOT) -> dict[str, set[str]]:
    """Variable name -> the files that read it by name: `os.environ.get("X")`, `os.getenv("X")`,
    `os.environ["X"]`, `env_flag("X")`, or a string constant "X" of an upper-case `*_ENV` name assigned at module
    level (`BUDGET_ENV = "EXPLAINER_MEMORY_BUDGET"`)."""
    out: dict[str, set[str]] = {}
    files = [root / "app.py", *(p for d in CODE for p in sorted((root / d).rglob("*.py")))]
    for path in files:
        if not path.is_file():
            continue
        rel = str(path.relative_to(root))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            name = None
            if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
                called = ast.unparse(node.func)
                if called in ("os.environ.get", "os.getenv", "env_flag", "hardware.env_flag"):
                    name = node.args[0].value
            elif isinstance(node, ast.Subscript) and ast.unparse(node.value) == "os.environ":
                if isinstance(node.slice, ast.Constant):
                    name = node.slice.value
            elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
                if any(isinstance(t, ast.Name) and t.id.endswith("_ENV") for t in node.targets):
                    name = node.value.value
            if isinstance(name, str):
                out.setdefault(name, set()).add(rel)
    return out


def mentions(name: str, root: Path = ROOT) -> set[str]:
    """The files of the product whose code (not docstrings or comments) holds the string `name`."""
    out = set()
    for path in (p for d in CODE for p in sorted((root / d).rglob("*.py"))):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and node.value == name:
                out.add(str(path.relative_to(root)))
    return out


def test_only_hardware_py_reads_spaces_zero_gpu():
    assert mentions("SPACES_ZERO_GPU") == {"explainer/runtime/hardware.py"}
    assert environment_reads()["SPACES_ZERO_GPU"] == {"explainer/runtime/hardware.py"}


# The CLI sets the root logger's level from EXPLAINER_LOG, the app its `explainer` logger's: one name, two front ends.
SHARED = {"EXPLAINER_LOG"}


def test_each_variable_is_read_in_one_file():
    reads = environment_reads()
    assert {"SPACES_ZERO_GPU", "EXPLAINER_MEMORY_BUDGET", "HF_HUB_OFFLINE", "EXPLAINER_DTYPE"} <= set(reads)
    assert {name: files for name, files in reads.items() if len(files) > 1 and name not in SHARED} == {}


def test_the_scans_see_a_planted_reader(tmp_path):
    (tmp_path / "explainer").mkdir()
    (tmp_path / "explainer" / "a.py").write_text('import os\nZ = os.environ.get("SPACES_ZERO_GPU", "")\n')
    (tmp_path / "ui").mkdir()
    (tmp_path / "ui" / "b.py").write_text('import os\nMY_ENV = "SPACES_ZERO_GPU"\nos.environ["OTHER"]\n')
    (tmp_path / "visuals").mkdir()
    (tmp_path / "visuals" / "c.py").write_text('"""SPACES_ZERO_GPU in a docstring is no read."""\n')
    assert mentions("SPACES_ZERO_GPU", tmp_path) == {"explainer/a.py", "ui/b.py"}
    assert environment_reads(tmp_path) == {"SPACES_ZERO_GPU": {"explainer/a.py", "ui/b.py"}, "OTHER": {"ui/b.py"}}
