"""Imports run one way: app.py -> ui -> (explainer, visuals); the library never imports gradio or the UI."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def imported_modules(path: Path) -> set[str]:
    """Top-level names of the modules a file imports (`import a.b`, `from a.b import c` -> "a"); relative imports
    resolve inside the file's own package, so they are left out."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def files(*folders: str) -> list[Path]:
    out = [p for folder in folders for p in sorted((ROOT / folder).rglob("*.py"))]
    assert out, folders
    return out


@pytest.mark.parametrize("path", files("explainer", "visuals"), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_library_imports_neither_gradio_nor_the_ui(path):
    assert not imported_modules(path) & {"gradio", "ui", "app"}


@pytest.mark.parametrize("path", files("ui", "scripts"), ids=lambda p: str(p.relative_to(ROOT)))
def test_only_app_py_imports_the_ui(path):
    banned = {"app"} if path.parts[-2] == "ui" else {"app", "ui"}
    assert not imported_modules(path) & banned


def test_the_scan_sees_imports(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("import gradio as gr\nfrom ui.models import get_bundle\nfrom . import x\nimport os.path\n")
    assert imported_modules(probe) == {"gradio", "ui", "os"}
    assert imported_modules(ROOT / "app.py") >= {"gradio", "ui"}
