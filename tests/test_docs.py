"""Docs a user can follow: docs/architecture.md names every module, the docs name only files that exist, every
command runs on a fresh clone (no data from outside the repository), and the README stays short."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CODE = ("explainer", "ui", "visuals")
DOCS = sorted([ROOT / "README.md", ROOT / "CONTRIBUTING.md", *(ROOT / "docs").glob("*.md")])
# Named in docs/architecture.md before the branch that adds it is merged; the lead empties this at the merge.
PLANNED: set[str] = set()


def modules(root: Path = ROOT) -> list[str]:
    return sorted(str(p.relative_to(root)) for d in CODE for p in (root / d).rglob("*.py"))


def where_things_live(text: str) -> set[str]:
    """The paths the "Where things live" block names: a line starting with a folder (`explainer/runtime/`) names the
    folder's `__init__.py` and opens it; the indented lines under it name files in it (`eval.py, bench.py  ...`)."""
    block = text.split("## Where things live", 1)[1].split("```", 2)[1]
    named, folder = set(), ""
    for line in block.splitlines()[1:]:
        field = re.split(r"\s{2,}", line.strip(), maxsplit=1)[0]
        if not field:
            continue
        if not line.startswith(" "):
            folder = field if field.endswith("/") else ""
            named.add(f"{field}__init__.py" if folder else field)
        elif folder:
            named.update(folder + name.strip() for name in field.split(",") if name.strip().endswith(".py"))
    return named


def unnamed_modules(text: str, root: Path = ROOT) -> list[str]:
    named = where_things_live(text)
    return [m for m in modules(root) if m not in named and f"`{m}`" not in text]


def test_architecture_names_every_module():
    assert unnamed_modules((ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")) == []


def test_the_module_check_sees_a_missing_module(tmp_path):
    for rel in ("explainer/__init__.py", "explainer/runtime/__init__.py", "explainer/runtime/kv.py",
                "explainer/runtime/host.py", "ui/a.py", "ui/b.py", "visuals/c.py"):  # fmt: skip
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    doc = (
        "## Where things live\n\n```\nexplainer/      the library\nexplainer/runtime/    runtime\n"
        "  kv.py      caches\nui/     the UI\n  a.py, b.py     two\n```\nThe views: `visuals/c.py`.\n"
    )
    assert unnamed_modules(doc, tmp_path) == ["explainer/runtime/host.py"]


def paths_in_docs() -> dict[str, set[str]]:
    """Repository paths of source files that a doc names (`explainer/...py`, `tests/...py`, ...) -> the docs."""
    out: dict[str, set[str]] = {}
    pattern = re.compile(r"\b(?:explainer|ui|visuals|tests|scripts)/[\w/]+\.(?:py|sh)\b")
    for doc in DOCS:
        for path in pattern.findall(doc.read_text(encoding="utf-8")):
            out.setdefault(path, set()).add(doc.name)
    return out


def test_the_docs_name_only_files_that_exist():
    architecture = where_things_live((ROOT / "docs" / "architecture.md").read_text(encoding="utf-8"))
    named = set(paths_in_docs()) | {p for p in architecture if p.endswith(".py") and not p.endswith("__init__.py")}
    assert len(named) > 100
    assert sorted(p for p in named if not (ROOT / p).exists() and p not in PLANNED) == []


def test_no_doc_needs_a_file_outside_the_repository():
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        assert "../shared" not in text and "shared/data" not in text, doc.name
        for value in re.findall(r"--data[ =]([^\s`)]+)", text):  # a placeholder such as PATH describes the option
            ok = value in ("squad_v2-dev", "squad_v2-train") or re.fullmatch(r"[A-Z]+(\|squad_v2-dev)?", value)
            assert ok, f"{doc.name}: --data {value} (use squad_v2-dev, which the CLI downloads once)"


def test_the_readme_has_at_most_250_lines():
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) <= 250
