"""scripts/calibration_forms.py, the front end of `explainer/eval/forms.py`: its row ranges count in the ids file's
order (the library's `--ids`), an id the data lacks is refused, and the training and held-out rows it picks are
disjoint for the committed command's ranges."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from explainer.errors import InputError
from explainer.eval.datasets import select_rows

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import calibration_forms as script  # noqa: E402

ROWS = [{"id": f"r{i}"} for i in range(10)]


def test_ranges_count_in_the_ids_files_order(tmp_path):
    assert script.ranges("200:260,280:300") == [(200, 260), (280, 300)]
    ids = tmp_path / "rows.ids"
    ids.write_text("# the order the ranges count in\nr9\nr3\nr5\n\nr0\n", encoding="utf-8")
    order = select_rows(ROWS, ids)  # the library's `--ids`, as `lds` and `hitratio` read it
    assert [r["id"] for r in order] == ["r9", "r3", "r5", "r0"]
    assert [r["id"] for r in script.pick(order, "1:3")] == ["r3", "r5"]
    assert [r["id"] for r in script.pick(ROWS, "0:2,8:10")] == ["r0", "r1", "r8", "r9"]


def test_an_unknown_id_is_refused(tmp_path):
    ids = tmp_path / "rows.ids"
    ids.write_text("r1\nnope\n", encoding="utf-8")
    with pytest.raises(InputError, match="not in the data"):
        select_rows(ROWS, ids)


def test_training_and_held_out_rows_are_disjoint():
    train, held = script.pick(ROWS, "5:10"), script.pick(ROWS, "0:5")
    assert not {r["id"] for r in train} & {r["id"] for r in held}
