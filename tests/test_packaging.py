"""`pip install .` works: the wheel carries the packages, their data files and the `explainer` command, and the
installed library reads its data through importlib.resources, not through paths into the repository."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA_FILES = (
    "explainer/data/bench_text.txt",
    "explainer/data/calibration/7a1b7e37769d640b.json",  # macs_calibrated's weights for the embedded model
    "visuals/static/report.js",
    "visuals/static/report.css",
)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel built from a copy of the sources (the build leaves its `build/` and `.egg-info` there, not here)."""
    source, out = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("wheel")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for package in ("explainer", "visuals", "ui"):
        if (ROOT / package).is_dir():
            shutil.copytree(ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), "."]
    done = subprocess.run(build, cwd=source, capture_output=True, text=True, timeout=600)
    if done.returncode != 0 and "No module named" in done.stderr and "setuptools" in done.stderr:
        pytest.skip("setuptools is not installed: no wheel can be built offline")
    assert done.returncode == 0, done.stderr[-2000:]
    (found,) = out.glob("*.whl")
    return found


def test_the_wheel_carries_the_packages_their_data_and_the_command(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for path in (*DATA_FILES, "explainer/__init__.py", "explainer/methods/macs.py", "visuals/report.py"):
        assert path in names, path
    modules = {str(p.relative_to(ROOT)) for d in ("explainer", "visuals", "ui") for p in (ROOT / d).rglob("*.py")}
    assert not modules - names, sorted(modules - names)  # every subpackage too (ui/tabs/, explainer/decoding/batched/)
    assert not any(n.startswith(("tests/", "assets/", "scripts/")) for n in names)
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    assert "explainer = explainer.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_the_installed_package_reads_its_own_data(wheel, tmp_path):
    target = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(target)  # what `pip install --target` lays out, without touching any index
    probe = (
        "import explainer, visuals.report as r; from explainer.bench.prompts import prompt_text;"
        f"paragraphs, source = prompt_text(); assert explainer.__file__.startswith({str(target)!r});"
        "assert source.startswith('explainer/data/bench_text.txt (Source:') and len(paragraphs[0]) > 20000;"
        "assert r.report_script().startswith('(function ()') and 'xai-report' in r.report_style();"
        "from explainer.methods.calibration import shipped_files, training_ids;"
        "assert [f.name for f in shipped_files()] == ['7a1b7e37769d640b.json'] and training_ids(); print('ok')"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
