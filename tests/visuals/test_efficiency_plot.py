"""Pure rendering of benchmark rows (no model): series, the Plotly figure and the Pillow PNG."""

from __future__ import annotations

import numpy as np
import pytest

from visuals.efficiency import BASELINE_COLOR, efficiency_figure, efficiency_png, series

ROWS = [
    {"method": "macs", "prompt_tokens": 1024, "tokens_per_s": 9.0, "peak_mem_mb": 1000.0},
    {"method": "none", "prompt_tokens": 256, "tokens_per_s": 18.0, "peak_mem_mb": 900.0},
    {"method": "macs", "prompt_tokens": 256, "tokens_per_s": 17.0, "peak_mem_mb": 910.0},
    {"method": "none", "prompt_tokens": 1024, "tokens_per_s": 10.0, "peak_mem_mb": 990.0},
    {"method": "rollout", "prompt_tokens": 4096, "tokens_per_s": 0.5, "peak_mem_mb": 3000.0},
]


def test_series_sorted_by_length_with_the_baseline_first():
    data = series(ROWS)
    assert list(data) == ["none", "macs", "rollout"]
    assert data["macs"] == [(256, 17.0, 910.0), (1024, 9.0, 1000.0)]
    with pytest.raises(ValueError, match="benchmark row"):
        series([{"method": "macs", "prompt_tokens": 1}])


def test_figure_has_two_panels_per_method_and_a_dashed_baseline():
    fig = efficiency_figure(ROWS, title="t")
    assert len(fig.data) == 6  # 3 methods x (throughput, memory)
    plain = [t for t in fig.data if t.legendgroup == "none"]
    assert all(t.line.dash == "dash" for t in plain) and plain[0].name == "plain generation"
    assert list(fig.data[2].x) == [256, 1024] and list(fig.data[3].y) == [910.0, 1000.0]
    assert fig.layout.xaxis.type == "log" and list(fig.layout.xaxis.tickvals) == [256, 1024, 4096]


def test_png_draws_every_method_colour():
    img = efficiency_png(ROWS, title="bench", width=900, height=400)
    assert img.size == (900, 400) and img.mode == "RGB"
    pixels = {tuple(p) for p in np.asarray(img).reshape(-1, 3)}
    for hex_color in ("#d62728", "#1f77b4", BASELINE_COLOR):  # macs, rollout (palette order), plain
        assert tuple(int(hex_color[i : i + 2], 16) for i in (1, 3, 5)) in pixels
    assert efficiency_png([ROWS[0]]).size == (1100, 440)  # one point: no axis span, still drawn
