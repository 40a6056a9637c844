"""No module of the product (explainer/, ui/, visuals/) is longer than 450 lines: a longer one is split along a seam
whose halves have names of their own (style guide), as `models/images.py` left `models/vision.py`."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 450


def long_modules(root: Path = ROOT) -> list[str]:
    out = []
    for path in sorted(p for d in ("explainer", "ui", "visuals") for p in (root / d).rglob("*.py")):
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > LIMIT:
            out.append(f"{path.relative_to(root)} ({lines} lines)")
    return out


def test_no_module_is_longer_than_450_lines():
    assert long_modules() == []


def test_the_check_sees_a_long_module(tmp_path):
    (tmp_path / "ui").mkdir()
    (tmp_path / "ui" / "long.py").write_text("x = 1\n" * (LIMIT + 1), encoding="utf-8")
    (tmp_path / "visuals").mkdir()
    (tmp_path / "visuals" / "short.py").write_text("x = 1\n" * LIMIT, encoding="utf-8")
    assert long_modules(tmp_path) == [f"ui/long.py ({LIMIT + 1} lines)"]
