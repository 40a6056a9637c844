"""scripts/calibration_forms.py, the front end of `explainer/eval/forms.py`: its row ranges count in the ids file's
order, an id the data lacks is refused, and the training and held-out rows it picks are disjoint for the committed
command's ranges."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import calibration_forms as script  # noqa: E402

ROWS = [{"id": f"r{i}"} for i in range(10)]


def test_ranges_and_ids_order(tmp_path):
    assert script.ranges("200:260,280:300") == [(200, 260), (280, 300)]
    ids = tmp_path / "rows.ids"
    ids.write_text("# the order the ranges count in\nr9\nr3\nr5\n\nr0\n", encoding="utf-8")
    order = script.read_ids(str(ids))
    assert order == ["r9", "r3", "r5", "r0"]
    assert [r["id"] for r in script.pick(ROWS, order, "1:3")] == ["r3", "r5"]
    assert [r["id"] for r in script.pick(ROWS, None, "0:2,8:10")] == ["r0", "r1", "r8", "r9"]


def test_an_unknown_id_is_refused():
    with pytest.raises(SystemExit, match="not in the data"):
        script.pick(ROWS, ["r1", "nope"], "0:1")


def test_training_and_held_out_rows_are_disjoint():
    train, held = script.pick(ROWS, None, "5:10"), script.pick(ROWS, None, "0:5")
    assert not {r["id"] for r in train} & {r["id"] for r in held}
