"""Image overlays, maps and GIFs, on synthetic results (no model)."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from explainer.eval.metrics import average_precision
from explainer.result.attribution import Attribution, MethodScores
from explainer.result.image_maps import image_map, upsample_map
from visuals.overlay import colormap, gif_bytes, heat_map, image_overlay, overlay_grid

GRID = (3, 5)  # merged patch grid (h, w)
PREFIX = 4  # text tokens before the image tokens


def _attr(size=(91, 37), peak=(2, 3), steps=3) -> Attribution:
    """A result whose image tokens peak at grid cell `peak` (step k shifts the peak k columns left)."""
    h, w = GRID
    n = PREFIX + h * w + 6
    positions = list(range(PREFIX, PREFIX + h * w))
    rng = np.random.default_rng(0)
    raw = rng.random((steps, n)).astype(np.float32) * 0.1  # (K, N)
    for k in range(steps):
        raw[k, PREFIX + peak[0] * w + max(peak[1] - k, 0)] = 5.0
        raw[k, 0] = 100.0  # a huge text-token score must not matter for the image map
    return Attribution(
        model="synthetic",
        prompt_token_ids=list(range(n)),
        prompt_tokens=[f"t{i}" for i in range(n)],
        generated_token_ids=list(range(steps)),
        generated_tokens=[f"g{k}" for k in range(steps)],
        methods={"macs": MethodScores.from_raw(raw), "random": MethodScores.from_raw(rng.random((steps, n)))},
        user_positions=list(range(PREFIX + h * w, n)),
        image={"token_positions": positions, "grid": list(GRID), "size": list(size)},
    )


def _photo(size=(91, 37)) -> Image.Image:
    return Image.fromarray(np.random.default_rng(1).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))


def test_image_map_is_zscored_over_image_tokens_only():
    m = image_map(_attr(), "macs", 0)
    assert m.shape == GRID
    assert np.unravel_index(np.argmax(m), GRID) == (2, 3)
    assert abs(float(m.mean())) < 1e-5 and abs(float(m.std()) - 1) < 1e-4


def test_overlay_on_odd_size_peaks_in_the_right_cell():
    img = _photo((91, 37))
    out = image_overlay(img, _attr(), "macs", 0, alpha=0.6)
    assert out.size == (91, 37) and out.mode == "RGB"
    heat = heat_map(_attr(), "macs", 0, img.size)  # (37, 91)
    y, x = np.unravel_index(np.argmax(heat), heat.shape)
    assert 2 * 37 / 3 <= y < 37 and 3 * 91 / 5 <= x < 4 * 91 / 5
    assert heat.min() == 0.0 and heat.max() == 1.0


def test_alpha_zero_is_the_image_and_alpha_one_the_colormap():
    img, attr = _photo(), _attr()
    np.testing.assert_array_equal(np.asarray(image_overlay(img, attr, "macs", 0, alpha=0.0)), np.asarray(img))
    full = np.asarray(image_overlay(img, attr, "macs", 0, alpha=1.0))
    np.testing.assert_array_equal(full, colormap(heat_map(attr, "macs", 0, img.size)))


def test_contour_outlines_the_top_region():
    img, attr = _photo(), _attr()
    plain = np.asarray(image_overlay(img, attr, "macs", 0, alpha=0.5))
    outlined = np.asarray(image_overlay(img, attr, "macs", 0, alpha=0.5, contour_top_percent=10))
    changed = np.any(plain != outlined, axis=-1)  # (H, W)
    assert changed.any() and changed.mean() < 0.3
    ys, xs = np.nonzero(changed)
    assert ys.mean() > 37 / 2 and 2 * 91 / 5 < xs.mean() < 91  # around the peak cell (lower right)


def test_colormap_is_dark_to_bright():
    rgb = colormap(np.linspace(0, 1, 11)).astype(float)  # (11, 3)
    luminance = rgb @ np.array([0.2126, 0.7152, 0.0722])
    assert np.all(np.diff(luminance) > 0)
    assert colormap(np.array([np.nan])).tolist() == [[0, 0, 4]]


def test_grid_frames_and_steps():
    img, attr = _photo(), _attr(steps=3)
    grid = overlay_grid(img, attr, ["macs", "random", "atman"], step=1, max_side=91)
    assert grid.size == (3 * 91 + 2 * 6, 37 + 18)
    pending = np.asarray(grid)[18:, 2 * (91 + 6) : 3 * (91 + 6) - 6]
    assert np.all(pending == 220)  # a method without scores gets a grey tile
    frames = [image_overlay(img, attr, "macs", k) for k in range(3)]
    assert len(frames) == 3 and all(f.size == img.size for f in frames)
    assert not np.array_equal(np.asarray(frames[0]), np.asarray(frames[2]))  # the peak moves
    np.testing.assert_array_equal(np.asarray(image_overlay(img, attr, "macs", 99)), np.asarray(frames[-1]))


def test_animation_has_one_frame_per_step_and_follows_the_peak():
    import io

    img, attr = _photo(), _attr(steps=3)
    gif = Image.open(io.BytesIO(gif_bytes(img, attr, ["macs", "random", "missing"], max_side=91)))
    assert gif.format == "GIF" and gif.n_frames == 3
    frames = []
    for k in range(3):
        gif.seek(k)
        frames.append(np.asarray(gif.convert("RGB")).astype(int))
        assert gif.info["duration"] == (1800 if k == 2 else 600)
    assert frames[0].shape == (37 + 18, 2 * 91 + 6, 3)  # the unknown method is left out
    grids = [np.asarray(overlay_grid(img, attr, ["macs", "random"], k, max_side=91)).astype(int) for k in range(3)]
    for k, frame in enumerate(frames):  # each frame is that step's small multiples, up to palette rounding
        distances = [np.abs(frame - grid).mean() for grid in grids]
        assert distances[k] < 10 and int(np.argmin(distances)) == k
    with pytest.raises(ValueError, match="nothing to animate"):
        gif_bytes(img, attr, ["missing"])


def test_text_result_has_no_image_map():
    attr = _attr()
    attr.image = None
    with pytest.raises(ValueError, match="no image"):
        image_map(attr, "macs", 0)


def test_round_trip_keeps_the_image_record():
    attr = _attr()
    back = Attribution.from_dict(attr.to_dict())
    assert back.image == attr.image
    attr.image = None
    assert "image" not in attr.to_dict() and Attribution.from_dict(attr.to_dict()).image is None


def test_average_precision_hand_computed():
    # one AP for text and image maps: metrics.average_precision(labels, scores), 0.0 without positives
    # ranks: 0.9 (+), 0.8 (-), 0.7 (+), 0.1 (-): AP = 1/2 * 1 + 1/2 * 2/3 = 5/6
    assert average_precision(np.array([1, 0, 1, 0]), np.array([0.9, 0.8, 0.7, 0.1])) == pytest.approx(5 / 6)
    # perfect and worst rankings
    assert average_precision(np.array([1, 1, 0, 0]), np.array([3, 2, 1, 0])) == pytest.approx(1.0)
    assert average_precision(np.array([1, 1, 0, 0]), np.array([0, 1, 2, 3])) == pytest.approx((1 / 3 + 2 / 4) / 2)
    # ties form one threshold: all equal scores give the positive rate
    assert average_precision(np.array([1, 0, 0, 1, 0]), np.ones(5)) == pytest.approx(2 / 5)
    # a tie between a positive and a negative at the top: precision 1/2 at recall 1/2, then 2/3 at recall 1
    assert average_precision(np.array([1, 0, 1, 0]), np.array([2, 2, 1, 0])) == pytest.approx(0.5 * 0.5 + 0.5 * 2 / 3)
    assert average_precision(np.zeros(3), np.arange(3)) == 0.0


def test_maps_upsample_to_the_image():
    attr = _attr(size=(50, 30))
    heat = upsample_map(image_map(attr, "macs", 0), (50, 30))
    assert heat.shape == (30, 50) and heat.dtype == np.float32
    r, c = np.unravel_index(int(heat.argmax()), heat.shape)
    assert 20 <= r < 30 and 30 <= c < 40  # the peak cell (row 2, column 3 of a 3 x 5 grid over 50 x 30 pixels)


def test_two_images_get_one_row_each_on_one_colour_scale():
    first = {"token_positions": [1, 2, 3, 4], "grid": [2, 2], "size": [40, 40]}
    second = {"token_positions": [6, 7], "grid": [1, 2], "size": [60, 30]}
    raw = np.zeros((1, 9), dtype=np.float32)
    raw[0, [1, 2, 3, 4]] = [0.0, 0.1, 0.2, 0.3]  # the first image's tokens low,
    raw[0, [6, 7]] = [5.0, 6.0]  # the second's high
    attr = Attribution(
        model="fake", prompt_token_ids=list(range(9)), prompt_tokens=[f"t{i}" for i in range(9)],
        generated_token_ids=[1], generated_tokens=[" A"], methods={"macs": MethodScores.from_raw(raw)},
        image={**first, "images": [first, second]},
    )  # fmt: skip
    low, high = heat_map(attr, "macs", 0, (40, 40), index=0), heat_map(attr, "macs", 0, (60, 30), index=1)
    assert low.max() < 0.2 and high.min() > 0.8  # one scale: the first image is dark next to the second
    images = [Image.new("RGB", (40, 40), "white"), Image.new("RGB", (60, 30), "white")]
    grid = overlay_grid(images, attr, ["macs"], 0, max_side=60)
    one_row = overlay_grid(images[1], Attribution(**{**attr.__dict__, "image": second}), ["macs"], 0, max_side=60)
    assert grid.height > 40 + 30 and grid.width >= one_row.width
    with pytest.raises(ValueError, match="1 images given for a result about 2"):
        overlay_grid(images[0], attr, ["macs"], 0)
