"""Region -> answer tokens, drawn (`visuals.regions`): the bar chart per method and answer token, and the grid
picker's cells, without a model."""

from __future__ import annotations

import numpy as np
from PIL import Image

from explainer.result.attribution import Attribution, MethodScores
from visuals.regions import PICKER_SIDE, grid_picker, picker_size, region_figure


def test_bars_per_method_over_the_answer_with_the_step_marked():
    attr = Attribution(
        model="fake", prompt_token_ids=[0, 1], prompt_tokens=["a", "b"], generated_token_ids=[1, 2, 3],
        generated_tokens=[" It", " is", "<b>"], methods={"macs": MethodScores.from_raw(np.zeros((3, 2)))},
    )  # fmt: skip
    fig = region_figure(attr, {"macs": np.array([0.5, np.nan, -1.0]), "random": np.zeros(3)}, step=1)
    macs, rnd = fig.data
    assert (macs.name, rnd.name) == ("macs", "random") and macs.marker.color != rnd.marker.color
    assert list(macs.x) == ["1:  It", "2:  is", "3: &lt;b&gt;"]  # numbered, escaped
    assert list(macs.y) == [0.5, None, -1.0]  # no bar where the method has no score
    (shade,) = fig.layout.shapes[:1]
    assert (shade.x0, shade.x1) == (0.5, 1.5)  # the second answer token
    assert len(region_figure(attr, {"macs": np.zeros(3)}, step=None).layout.shapes) == 1  # the zero line only


def test_the_picker_enlarges_the_image_draws_the_grid_and_tints_selected_cells():
    assert picker_size((60, 40)) == (PICKER_SIDE, 240) and picker_size((40, 60)) == (240, PICKER_SIDE)
    image = Image.new("RGB", (60, 40), (0, 0, 0))
    out = np.asarray(grid_picker(image, [2, 3], cells=[(1, 2)], corner=(0, 0)), dtype=np.int64)  # (240, 360, 3)
    assert out.shape == (240, 360, 3)
    assert out[180, 300].tolist() != [0, 0, 0] and out[180, 60].tolist() == [0, 0, 0]  # (1, 2) tinted, (1, 0) not
    assert out[120, 10].tolist() == [255, 255, 255] and out[10, 120].tolist() == [255, 255, 255]  # grid lines
    assert out[60, 1].tolist() == [255, 200, 0]  # the pending corner's outline on cell (0, 0)
