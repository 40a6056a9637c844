"""Image + question with a tiny random Qwen2.5-VL: token positions and grid, capture vs eager attention, MACS vs the
reference, greedy tokens vs `generate`, a planted signal found by the overlay, bad images, and a clean model after."""

from __future__ import annotations

import base64

import numpy as np
import pytest
import torch
from PIL import Image

import explainer.capture as capture_module
from explainer import InputError, UnsupportedModelError, bundle_from_objects, explain
from explainer.capture import capture_attention, registered_names
from explainer.cli import main as cli_main
from explainer.models.images import data_url_bytes, load_image
from explainer.models.vision import encode_image_prompt, full_sequence_inputs
from explainer.result.image_maps import image_map
from explainer.runtime.memory import language_config
from visuals.overlay import heat_map

from ...conftest import FailingMACS, build_model
from ...reference import reference_macs
from ...upload_files import BROKEN, ODD, png_header_only, write
from ...vl_tiny import MERGE, PATCH, build_vl_model, make_vl_tokenizer, vl_bundle

QUESTION = "What is in the image?"
TOL = 1e-5


@pytest.fixture(scope="module")
def vl_tokenizer():
    return make_vl_tokenizer()


@pytest.fixture(scope="module")
def vl_model(vl_tokenizer):
    return build_vl_model(vl_tokenizer)


@pytest.fixture(scope="module")
def bundle(vl_model, vl_tokenizer):
    return vl_bundle(vl_model, vl_tokenizer)


def _image(w: int, h: int, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))


def _assert_clean(model) -> None:
    assert registered_names() == []
    assert model.config.text_config._attn_implementation == "sdpa"
    assert model.config.vision_config._attn_implementation == "sdpa"
    assert model.model.rope_deltas is None  # positions are passed explicitly; no state is left in the model


@pytest.mark.parametrize("size", [(56, 56), (120, 70), (37, 91), (300, 40), (640, 480), (9, 200)])
def test_image_positions_and_grid_match_the_processor(bundle, vl_tokenizer, size):
    img = _image(*size)
    enc = encode_image_prompt(bundle, img, QUESTION)
    thw = bundle.image_processor(images=[img], return_tensors="pt")["image_grid_thw"][0].tolist()
    assert enc.grid == (thw[1] // MERGE, thw[2] // MERGE)
    h, w = enc.grid
    assert len(enc.image_positions) == h * w == thw[0] * thw[1] * thw[2] // MERGE**2
    ids = enc.input_ids[0].tolist()
    first, last = enc.image_positions[0], enc.image_positions[-1]
    assert enc.image_positions == list(range(first, last + 1))  # one contiguous block
    assert ids[first - 1] == bundle.model.config.vision_start_token_id
    assert ids[last + 1] == bundle.model.config.vision_end_token_id
    assert "".join(bundle.readable([ids[i] for i in enc.user_positions])) == QUESTION
    assert enc.size == size
    assert enc.prefill_inputs["pixel_values"].shape[0] == thw[0] * thw[1] * thw[2]
    assert enc.prefill_inputs["position_ids"].shape == (3, 1, len(ids))
    assert h * w <= 24  # the bundle's pixel budget bounds the image tokens


def test_large_photo_is_bounded_by_max_pixels(bundle):
    enc = encode_image_prompt(bundle, _image(4000, 3000), QUESTION)  # a 12-megapixel photo
    assert len(enc.image_positions) <= 24 and enc.size == (4000, 3000)


def test_text_layers_use_the_attention_interface_and_vision_keeps_sdpa(vl_model):
    text, vision = vl_model.config.text_config, vl_model.config.vision_config
    assert language_config(vl_model) is text
    text_attn = [m for n, m in vl_model.named_modules() if n.endswith("self_attn")]
    vision_attn = [m for n, m in vl_model.named_modules() if n.startswith("model.visual") and n.endswith(".attn")]
    assert len(text_attn) == text.num_hidden_layers and len(vision_attn) == vision.depth
    assert all(m.config is text for m in text_attn) and all(m.config is vision for m in vision_attn)
    with capture_attention(vl_model):
        assert text._attn_implementation.startswith("explainer_capture_")
        assert vision._attn_implementation == "sdpa"
    _assert_clean(vl_model)


def _eager_full_forward(model, input_ids, extra):
    """Eager attentions (tuple over text layers of (1, H, T, T)) and logits of one full VL forward."""
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            out = model(input_ids=input_ids, output_attentions=True, **extra)
    finally:
        model.set_attn_implementation("sdpa")
    return out.attentions, out.logits


def test_captured_prefill_rows_equal_eager_rows(bundle, vl_model):
    enc = encode_image_prompt(bundle, _image(120, 70), QUESTION)
    attentions, eager_logits = _eager_full_forward(vl_model, enc.input_ids, enc.prefill_inputs)
    with torch.no_grad(), capture_attention(vl_model) as rec:
        logits = vl_model(input_ids=enc.input_ids, **enc.prefill_inputs).logits
        rows = rec.stacked()  # (L, 1, H, N)
    assert rows.shape[0] == len(attentions) == vl_model.config.text_config.num_hidden_layers
    for layer, att in enumerate(attentions):
        torch.testing.assert_close(rows[layer], att[:, :, -1, :], atol=TOL, rtol=0)
    torch.testing.assert_close(logits, eager_logits, atol=1e-4, rtol=0)
    _assert_clean(vl_model)


def test_greedy_tokens_equal_generate_and_macs_equals_reference(bundle, vl_model):
    img = _image(120, 70, seed=3)
    attr = explain(bundle, QUESTION, image=img, methods=["macs", "rollout", "random"], max_new_tokens=6)
    _assert_clean(vl_model)
    enc = encode_image_prompt(bundle, img, QUESTION)
    n, k = enc.input_ids.shape[1], attr.num_steps
    try:
        generated = vl_model.generate(
            input_ids=enc.input_ids,
            pixel_values=enc.prefill_inputs["pixel_values"],
            image_grid_thw=enc.prefill_inputs["image_grid_thw"],
            mm_token_type_ids=(enc.input_ids == vl_model.config.image_token_id).int(),
            max_new_tokens=6,
            do_sample=False,
        )
    finally:
        vl_model.model.rope_deltas = None  # generate caches it on the model
    assert attr.generated_token_ids == generated[0, n:].tolist()[:k]
    assert attr.image == {"token_positions": enc.image_positions, "grid": list(enc.grid), "size": [120, 70]}
    assert attr.user_positions == enc.user_positions
    full = torch.tensor([attr.prompt_token_ids + attr.generated_token_ids])  # (1, N + K)
    attentions, _ = _eager_full_forward(vl_model, full, full_sequence_inputs(enc.prefill_inputs, k))
    ref_raw, ref_z = reference_macs(attentions, n, k)
    np.testing.assert_allclose(attr.methods["macs"].raw, np.asarray(ref_raw), rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(attr.methods["macs"].z, np.asarray(ref_z), atol=1e-3)
    for scores in attr.methods.values():
        assert scores.raw.shape == (k, n)
    assert image_map(attr, "macs", 0).shape == tuple(enc.grid)


def test_planted_signal_is_where_the_overlay_peaks(bundle, vl_model, monkeypatch):
    """Keys of one image token are pulled towards the last query in every text layer: MACS must find that patch."""
    img = _image(150, 90, seed=5)
    enc = encode_image_prompt(bundle, img, QUESTION)
    h, w = enc.grid
    r, c = h - 1, 1  # the target cell on the merged grid
    target = enc.image_positions[r * w + c]
    original = capture_module._make_attention_function

    def planted(recorder):
        inner = original(recorder)

        def attention(module, query, key, value, attention_mask, **kwargs):
            b, heads, _, d = query.shape
            kvh = key.shape[1]
            q_last = query[:, :, -1, :].reshape(b, kvh, heads // kvh, d).mean(2)  # (B, KVH, D)
            key = key.clone()
            key[:, :, target, :] += 20.0 * q_last / q_last.norm(dim=-1, keepdim=True).clamp_min(1e-6)
            return inner(module, query, key, value, attention_mask, **kwargs)

        return attention

    monkeypatch.setattr(capture_module, "_make_attention_function", planted)
    attr = explain(bundle, QUESTION, image=img, methods=["macs"], max_new_tokens=2)
    _assert_clean(vl_model)
    grid_map = image_map(attr, "macs", 0)
    assert np.unravel_index(np.argmax(grid_map), grid_map.shape) == (r, c)
    heat = heat_map(attr, "macs", 0, img.size)  # (H, W)
    y, x = np.unravel_index(np.argmax(heat), heat.shape)
    hh, ww = img.height / h, img.width / w  # pixels per grid cell (the processor stretches the whole image)
    assert r * hh <= y < (r + 1) * hh and c * ww <= x < (c + 1) * ww


def test_text_only_bundle_is_refused_for_images(tokenizer):
    text_bundle = bundle_from_objects(build_model("llama"), tokenizer, name="tiny-llama")
    with pytest.raises(UnsupportedModelError, match="text-only"):
        explain(text_bundle, QUESTION, image=_image(64, 64), max_new_tokens=2)
    assert registered_names() == []


def test_post_hoc_method_without_image_support_is_refused(bundle, vl_model):
    from explainer.methods import METHODS, AttributionMethod, RandomConfig

    assert METHODS["atman"].explains_images and METHODS["random"].explains_images

    class TextOnly(AttributionMethod):
        name, streaming = "text_only", False  # explains_images stays False
        Config = RandomConfig

        def explain(self, run):
            raise AssertionError("must be refused before generation")

    with pytest.raises(InputError, match="text_only cannot explain image prompts"):
        explain(bundle, QUESTION, image=_image(64, 64), methods=["macs", TextOnly()], max_new_tokens=2)
    _assert_clean(vl_model)


@pytest.mark.parametrize(
    "kind, message",
    [
        ("truncated", "damaged or truncated"),
        ("text", "not an image"),
        ("tiny", "at least"),
        ("huge", "too large|the limit is"),
        ("missing", "does not exist"),
        ("elongated", "aspect ratio"),
    ],
)
def test_bad_images_give_clear_input_errors(tmp_path, bundle, kind, message):
    path = tmp_path / f"{kind}.png"
    if kind == "truncated":
        _image(64, 48).save(path)
        path.write_bytes(path.read_bytes()[:200])
    elif kind == "text":
        path.write_text("not an image at all")
    elif kind == "tiny":
        _image(1, 1).save(path)
    elif kind == "huge":
        png_header_only(path, 30_000, 30_000)
    elif kind == "elongated":
        _image(1000, 8).save(path)
    with pytest.raises(InputError, match=message):
        load_image(path)
    with pytest.raises(InputError, match=message):
        explain(bundle, QUESTION, image=str(path), max_new_tokens=2)
    assert registered_names() == []


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_every_broken_file_gets_one_line_naming_it(tmp_path, name):
    path = write(tmp_path, name)
    message = BROKEN[name][1]
    with pytest.raises(InputError, match=message) as info:
        load_image(path, name=name)
    text = str(info.value)
    assert "\n" not in text and text.startswith(f"Image {name!r}") and str(tmp_path) not in text
    if path.is_file():  # the same bytes sent inline (a data: URL through the app's API)
        with pytest.raises(InputError, match=message):
            load_image(path.read_bytes())


@pytest.mark.parametrize("name", sorted(ODD))
def test_odd_formats_load_as_8_bit_rgb(tmp_path, name):
    path = write(tmp_path, name)
    _, mode, pixel, tolerance = ODD[name]
    with Image.open(path) as raw:
        assert raw.mode == mode  # the file really is in that format
    img = load_image(path)
    assert img.mode == "RGB" and img.size == (20, 12)
    np.testing.assert_allclose(img.getpixel((0, 0)), pixel, atol=tolerance)
    assert load_image(path.read_bytes()).tobytes() == img.tobytes()


def test_wide_grey_formats_are_scaled_not_clipped(tmp_path):
    img = load_image(write(tmp_path, "float.tiff"))  # left half the minimum, right half the maximum
    assert img.getpixel((0, 0)) == (0, 0, 0) and img.getpixel((19, 0)) == (255, 255, 255)
    ramp = np.linspace(0, 65535, 20 * 12).astype(np.uint16).reshape(12, 20)  # 16-bit grey ramp
    Image.fromarray(ramp).save(tmp_path / "ramp.png")
    grey = np.asarray(load_image(tmp_path / "ramp.png"))[..., 0]
    np.testing.assert_allclose(grey, ramp / 257, atol=0.5)  # Pillow's own conversion would clip above 255


def test_a_file_that_is_not_a_path_bytes_or_image_is_refused():
    with pytest.raises(InputError, match="Expected an image file path"):
        load_image(12345)


@pytest.fixture(scope="module")
def vl_model_dir(tmp_path_factory, vl_tokenizer, vl_model):
    path = tmp_path_factory.mktemp("tiny-qwen2.5-vl")
    vl_model.save_pretrained(path)
    vl_tokenizer.save_pretrained(path)
    return path


def test_cli_image_json(tmp_path, vl_model_dir, capsys):
    img_path, out = tmp_path / "shape.png", tmp_path / "out.json"
    _image(100, 60).save(img_path)
    args = ["explain", "--model", str(vl_model_dir), "--image", str(img_path), "--prompt", QUESTION]
    code = cli_main(
        [*args, "--max-new-tokens", "3", "--max-pixels", str(12 * (PATCH * MERGE) ** 2), "--json", str(out),
         "--methods", "macs,rollout,atman,random"]
    )  # fmt: skip
    assert code == 0, capsys.readouterr().err
    import json

    data = json.loads(out.read_text())
    h, w = data["image"]["grid"]
    assert data["image"]["size"] == [100, 60] and len(data["image"]["token_positions"]) == h * w <= 12
    for name in ("macs", "rollout", "atman", "random"):
        raw = np.asarray(data["methods"][name]["raw"])
        assert raw.shape == (len(data["generated_token_ids"]), len(data["prompt_token_ids"]))


def test_cli_writes_an_animated_gif_of_the_overlays(tmp_path, vl_model_dir, capsys):
    img_path, gif = tmp_path / "shape.png", tmp_path / "steps.gif"
    _image(100, 60).save(img_path)
    args = ["explain", "--model", str(vl_model_dir), "--image", str(img_path), "--prompt", QUESTION]
    assert cli_main([*args, "--max-new-tokens", "3", "--methods", "macs,random", "--gif", str(gif)]) == 0
    out = capsys.readouterr().out
    frames = Image.open(gif)
    assert frames.format == "GIF" and f"wrote {gif} ({frames.n_frames} frames" in out and 1 <= frames.n_frames <= 3
    assert cli_main(["explain", "--prompt", QUESTION, "--gif", str(gif)]) == 2  # no image: refused before loading
    assert "needs --image" in capsys.readouterr().err
    assert cli_main([*args, "--gif", str(tmp_path / "steps.png")]) == 2
    assert ".gif path" in capsys.readouterr().err


def test_cli_bad_image_exits_2_with_one_line(tmp_path, vl_model_dir, capsys):
    bad = tmp_path / "bad.png"
    bad.write_text("nope")
    code = cli_main(["explain", "--model", str(vl_model_dir), "--image", str(bad), "--prompt", QUESTION])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1 and "not an image" in err


def test_loaded_folder_is_a_vision_bundle(vl_model_dir):
    from explainer import load_model

    loaded = load_model(str(vl_model_dir), device="cpu", max_pixels=8 * (PATCH * MERGE) ** 2)
    assert loaded.image_processor is not None
    assert loaded.model.config.text_config._attn_implementation == "sdpa"
    enc = encode_image_prompt(loaded, _image(200, 200), QUESTION)
    assert len(enc.image_positions) <= 8


def test_failure_mid_generation_leaves_the_vl_model_clean(bundle, vl_model):

    with pytest.raises(RuntimeError, match="method failed"):
        explain(bundle, QUESTION, image=_image(64, 64), methods=[FailingMACS()], max_new_tokens=4)
    _assert_clean(vl_model)


def test_post_hoc_methods_get_inputs_that_reproduce_the_generation(bundle, vl_model):
    """`GenerationRun.extra_inputs` (pixels + positions over N + K) make one full forward predict every step."""
    from explainer.methods import AttributionMethod, GenerationRun, RandomConfig

    seen = {}

    class Probe(AttributionMethod):
        name, streaming, explains_images = "probe", False, True
        Config = RandomConfig

        def explain(self, run: GenerationRun) -> np.ndarray:
            with torch.no_grad():
                logits = run.model(input_ids=run.input_ids, **run.extra_inputs).logits  # (1, N + K, V)
            n = run.num_prompt_tokens
            seen["predicted"] = logits[0, n - 1 : -1].argmax(-1).tolist()
            return np.zeros((run.num_steps, n), dtype=np.float32)

    attr = explain(bundle, QUESTION, image=_image(90, 50, seed=7), methods=["macs", Probe()], max_new_tokens=5)
    assert seen["predicted"] == attr.generated_token_ids
    _assert_clean(vl_model)


def test_image_tokens_are_row_major_over_the_merged_grid(bundle, vl_model):
    """Changing one grid cell of the image changes that cell's image token most: merged tokens are row-major."""
    size = (168, 112)  # resized to 6 x 4 merged cells of 28 px (within the 24-token budget)
    plain = Image.new("RGB", size, (90, 120, 160))
    enc = encode_image_prompt(bundle, plain, QUESTION)
    h, w = enc.grid
    cell_w, cell_h = size[0] / w, size[1] / h
    for r, c in [(0, 0), (h - 1, 1), (1, w - 1)]:
        marked = plain.copy()
        marked.paste(
            (255, 255, 0), (round(c * cell_w), round(r * cell_h), round((c + 1) * cell_w), round((r + 1) * cell_h))
        )
        feats = []
        for img in (plain, marked):
            inputs = encode_image_prompt(bundle, img, QUESTION).prefill_inputs
            with torch.no_grad():
                out = vl_model.model.get_image_features(inputs["pixel_values"], inputs["image_grid_thw"])
            feats.append(torch.cat(out.pooler_output))  # (h * w, D)
        change = (feats[1] - feats[0]).norm(dim=-1)  # (h * w,)
        assert int(change.argmax()) == r * w + c


def test_cli_image_summary_names_the_peak_cell(tmp_path, vl_model_dir, capsys):
    img_path = tmp_path / "shape.png"
    _image(80, 80).save(img_path)
    args = ["explain", "--model", str(vl_model_dir), "--image", str(img_path), "--prompt", QUESTION]
    assert cli_main([*args, "--max-new-tokens", "2", "--max-pixels", str(9 * (PATCH * MERGE) ** 2)]) == 0
    out = capsys.readouterr().out
    assert "grid of image tokens" in out and out.count("image peak: row") == 2


def test_max_image_tokens_bounds_this_image_only(bundle, vl_model):
    img = _image(640, 480)
    default = encode_image_prompt(bundle, img, QUESTION)
    small = encode_image_prompt(bundle, img, QUESTION, max_image_tokens=6)
    h, w = small.grid
    assert len(small.image_positions) == h * w <= 6 < len(default.image_positions)
    assert encode_image_prompt(bundle, img, QUESTION).grid == default.grid  # the loaded budget is unchanged
    attr = explain(bundle, QUESTION, image=img, methods=["macs"], max_new_tokens=2, max_image_tokens=6)
    assert attr.image["grid"] == [h, w]
    with pytest.raises(InputError, match="max_image_tokens"):
        encode_image_prompt(bundle, img, QUESTION, max_image_tokens=0)
    _assert_clean(vl_model)


def test_an_image_sent_inline_as_a_data_url_is_decoded(tmp_path):
    png = write(tmp_path, "bilevel.png").read_bytes()
    assert data_url_bytes("data:image/png;base64," + base64.b64encode(png).decode()) == png
    assert load_image(data_url_bytes("data:;base64," + base64.b64encode(png).decode())).size == (20, 12)
    for url, message in [
        ("data:image/png;base64,&&&", "not valid base64"),
        ("data:image/png;base64,abc", "not valid base64"),  # padding missing
        ("data:image/png,rawtext", "not base64"),
        ("http://example.com/x.png", "not base64"),
        ("data:image/png;base64", "not base64"),  # no comma, no data
    ]:
        with pytest.raises(InputError, match=message):
            data_url_bytes(url)
