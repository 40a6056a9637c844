"""No function in the product is longer than 60 lines (docstring included): a long one is split where its parts
have names of their own (style guide)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 60


def long_functions() -> list[str]:
    files = [ROOT / "app.py", *(p for d in ("explainer", "visuals", "ui") for p in (ROOT / d).rglob("*.py"))]
    out = []
    for f in files:
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > LIMIT:
                    out.append(f"{f.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    return out


def test_no_function_is_longer_than_60_lines():
    assert long_functions() == []


def test_the_check_sees_a_long_function(tmp_path, monkeypatch):
    body = "\n".join(f"    x{i} = {i}" for i in range(LIMIT))
    planted = ROOT / "ui" / "_planted_long_function.py"
    planted.write_text(f"def planted():\n{body}\n", encoding="utf-8")
    try:
        assert any("planted" in f for f in long_functions())
    finally:
        planted.unlink()
