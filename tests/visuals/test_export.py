"""Export and reload: the JSON download, the self-contained HTML report, the PNG of the view, the GIF, and the round
trip (export, load, identical views), on hand-built results and on a tiny model's."""

from __future__ import annotations

import base64
import io
import json
import math
import os
import shutil
import unicodedata
import warnings
from html.parser import HTMLParser

import numpy as np
import pytest
from PIL import Image

from explainer import bundle_from_objects, explain
from explainer.errors import InputError
from explainer.result.attribution import Attribution, MethodScores, zscore
from visuals.export import (
    MAX_RESULT_BYTES,
    export_filename,
    load_result,
    png_bytes,
    result_json,
)
from visuals.heatmap import Z_CLIP, answer_html, bin_class, bin_color, side_by_side_html, top_tokens_rows
from visuals.overlay import gif_bytes, gif_steps, overlay_grid
from visuals.png import _draw_view, view_png
from visuals.report import report_html, report_script

from ..conftest import build_model

HOSTILE = [
    "<|im_start|>",
    "user",
    "\n",
    "Where",
    " </script><script>alert(1)</script>",
    "<!--",
    " </SCRIPT >",
    " \u202eevil",  # right-to-left override
    " 🙂",
    "\x00\x1b[31m",  # control characters
    " \u2028",  # a JavaScript line terminator
    ' "Paris"&amp;',
    "",
    "?",
    "<|im_end|>",
    "\n",
]
USER = list(range(3, 14))


def hostile_attr(steps: int = 4, seed: int = 0, image: dict | None = None, n: int | None = None) -> Attribution:
    """A result with hostile tokens, names and metadata, NaN scores and a method with extra meta."""
    tokens = HOSTILE if n is None else [f"t{i} " for i in range(n)]
    n = len(tokens)
    rng = np.random.default_rng(seed)
    macs = rng.standard_normal((steps, n)).astype(np.float32)  # (K, N)
    macs[:, 6] += 4.0  # one clearly important user token
    other = rng.random((steps, n)).astype(np.float32)
    other[1 % steps, 9] = np.nan  # no score for one token at one step
    return Attribution(
        model="org/<script>alert('m')</script>",
        prompt_token_ids=list(range(n)),
        prompt_tokens=list(tokens),
        generated_token_ids=list(range(500, 500 + steps)),
        generated_tokens=[" Paris", "</script>", " \u202e", "\n"][:steps] + [f" g{k}" for k in range(4, steps)],
        methods={
            "macs": MethodScores.from_raw(macs, seconds=0.5, meta={"alpha": 0.5, "pooling": "</script>"}),
            "</script><b>m": MethodScores.from_raw(other, seconds=1.25),
        },
        user_positions=USER if image is None else [],
        meta={"generation_seconds": 1.5, "note": "<!-- </script>", "status": "done"},
        image=image,
    )


# --- a small HTML reader -------------------------------------------------------------------------------------------


class Page(HTMLParser):
    """Elements of a page: (tag, attrs) in document order, the text inside each <script>, the caption of each
    heatmap (its first child div), every token of every heatmap panel as (class, title, text) and the answer strip's
    (step, selected)."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[tuple[str, dict[str, str | None]]] = []
        self.scripts: list[tuple[dict, str]] = []
        self.panels: dict[str, list[tuple[str | None, str | None, str]]] = {}
        self.answer: list[tuple[int, bool]] = []
        self.captions: list[str] = []
        self.decl: str | None = None
        self._script: dict | None = None
        self._script_text = ""
        self._panel: str | None = None
        self._token: list | None = None
        self._divs: list[list] = []  # open divs: [role, seen a child div]
        self.feed(text)
        self.close()

    def handle_decl(self, decl):
        self.decl = decl

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.elements.append((tag, a))
        if tag == "script":
            self._script, self._script_text = a, ""
        elif tag == "div":
            role = None
            if self._divs and self._divs[-1][0] == "heatmap" and not self._divs[-1][1]:
                role = "caption"
                self.captions.append("")
            elif a.get("class") == "xai-heatmap":
                role = "heatmap"
            elif a.get("class") == "xai-panel":
                role, self._panel = "panel", a["data-method"]
                self.panels[self._panel] = []
            if self._divs:
                self._divs[-1][1] = True
            self._divs.append([role, False])
        elif tag == "i" and self._panel is not None and a.get("class") != "xh":
            self._token = [a.get("class"), a.get("title"), ""]
        elif tag == "br" and self._token is not None:
            self._token[2] += "\n"
        elif tag == "span" and a.get("class") == "xai-step":
            self.answer.append((int(a["data-step"]), a.get("data-selected") == "true"))

    def handle_endtag(self, tag):
        if tag == "script" and self._script is not None:
            self.scripts.append((self._script, self._script_text))
            self._script = None
        elif tag == "i" and self._token is not None:
            self.panels[self._panel].append(tuple(self._token))
            self._token = None
        elif tag == "div" and self._divs:
            if self._divs.pop()[0] == "panel":
                self._panel = None

    def handle_data(self, data):
        if self._script is not None:
            self._script_text += data
        if self._token is not None:
            self._token[2] += data
        if any(role == "caption" for role, _ in self._divs):
            self.captions[-1] += data

    def by_id(self, element_id: str) -> tuple[str, dict] | None:
        return next(((t, a) for t, a in self.elements if a.get("id") == element_id), None)


def embedded(report: str) -> dict:
    page = Page(report)
    (data,) = [text for attrs, text in page.scripts if attrs.get("type") == "application/json"]
    return json.loads(data)


def independent_z(raw_row: np.ndarray, cols: list[int]) -> np.ndarray:
    """z over `cols` (finite values only), straight from the definition; NaN where there is no score."""
    out = np.full(len(cols), np.nan)
    sub = raw_row[cols].astype(np.float64)
    ok = np.isfinite(sub)
    if ok.any():
        mean, std = sub[ok].mean(), sub[ok].std()
        out[ok] = (sub[ok] - mean) / std if std > 0 else 0.0
    return out


# --- JSON ----------------------------------------------------------------------------------------------------------


def same_result(a: Attribution, b: Attribution) -> None:
    """Equal down to the bits of every score (the stored JSON of both is the same text)."""
    assert json.dumps(a.to_dict()) == json.dumps(b.to_dict())
    for name, s in a.methods.items():
        for key in ("raw", "z"):
            x, y = getattr(s, key), getattr(b.methods[name], key)
            assert x.dtype == y.dtype == np.float32 and x.shape == y.shape
            assert np.array_equal(np.isnan(x), np.isnan(y))
            assert np.array_equal(x[~np.isnan(x)].view(np.uint32), y[~np.isnan(y)].view(np.uint32))


def test_json_round_trip_is_bit_identical_and_readable_by_the_cli(tmp_path):
    attr = hostile_attr()
    attr.methods["macs"].raw[0, :3] = [1e-45, 3.4028235e38, -0.0]  # subnormal, largest float32, negative zero
    text = result_json(attr)
    same_result(load_result(text.encode("utf-8")), attr)
    path = tmp_path / "saved.json"
    path.write_text(text, encoding="utf-8")
    same_result(load_result(path), attr)
    same_result(load_result(str(path)), attr)
    same_result(Attribution.load_json(path), attr)  # the CLI's reader takes the download as it is
    same_result(load_result(b"\xef\xbb\xbf" + text.encode()), attr)  # a byte-order mark is harmless
    assert json.loads(text)["methods"]["macs"]["meta"] == {"alpha": 0.5, "pooling": "</script>"}
    # the compact floats are the CLI layout, in fewer bytes than float64 digits
    assert len(text) < 0.8 * len(json.dumps(attr.to_dict(), ensure_ascii=False, separators=(",", ":")))


@pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning")  # signalling NaNs
def test_json_of_random_float32_bits_reads_back_exactly():
    rng = np.random.default_rng(3)
    bits = rng.integers(0, 2**32, size=(40, 500), dtype=np.uint64).astype(np.uint32)
    raw = bits.view(np.float32).copy()  # every exponent, subnormals, inf and NaN included
    n = raw.shape[1]
    attr = Attribution(
        model="m",
        prompt_token_ids=list(range(n)),
        prompt_tokens=["x"] * n,
        generated_token_ids=list(range(40)),
        generated_tokens=["y"] * 40,
        methods={"r": MethodScores(raw=raw, z=zscore(raw))},
    )
    same_result(load_result(result_json(attr).encode()), attr)


def test_result_without_steps_round_trips():
    attr = hostile_attr()
    attr.generated_token_ids, attr.generated_tokens = [], []
    attr.methods = {m: MethodScores.from_raw(np.zeros((0, len(HOSTILE)), np.float32)) for m in ("macs", "rollout")}
    same_result(load_result(result_json(attr).encode()), attr)


SCORES_WITHOUT_STEPS = (
    b'{"model": "m", "prompt_token_ids": [1], "prompt_tokens": ["a"], "methods": {"x": {"raw": [[1]]}}}'
)


@pytest.mark.parametrize(
    "content, message",
    [
        (b"", "is empty"),
        (b"  \n", "is empty"),
        (b"\xff\xfe{\x00}\x00", "not UTF-8 text (byte 1 is 0xff)"),
        (b'{"model": "m", "x": "\xc3\x28"}', "not UTF-8 text (byte 22 is 0xc3)"),
        (b"{not json", "not valid JSON (line 1, column 2"),
        (b'{"model": "m",\n "prompt_token_ids": [1,]}', "not valid JSON (line 2"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b"[1, 2]", "A saved result is a JSON object"),
        (b'{"model": 3}', "model must be a string"),
        (SCORES_WITHOUT_STEPS, "must be a 0 x 1 table"),  # one row of scores but no generated token
    ],
)
def test_a_bad_upload_is_an_input_error_that_says_why(content, message, tmp_path):
    for source in (content, tmp_path / "up.json"):
        if not isinstance(source, bytes):
            source.write_bytes(content)
        with pytest.raises(InputError) as err:
            load_result(source)
        assert message in str(err.value)


def test_too_large_missing_and_odd_sources_are_refused_before_reading(tmp_path):
    text = result_json(hostile_attr()).encode()
    path = tmp_path / "big.json"
    path.write_bytes(text)
    for source in (text, path):
        with pytest.raises(InputError, match=r"at most 1 KiB"):
            load_result(source, max_bytes=1024)
    assert MAX_RESULT_BYTES == 64 * 2**20
    with pytest.raises(InputError, match="does not exist"):
        load_result(tmp_path / "missing.json")
    with pytest.raises(InputError, match="is a folder"):
        load_result(tmp_path)
    with pytest.raises(InputError, match="bytes or a file path"):
        load_result(12)  # type: ignore[arg-type]
    with pytest.raises(InputError, match="Cannot read"):
        load_result("a\x00b.json")


def test_download_names_are_safe():
    attr = hostile_attr()
    attr.model = "../../etc/Qwen2.5-VL 3B?<x>"
    assert export_filename(attr, "json") == "explanation-Qwen2.5-VL-3B-x-4steps.json"
    assert export_filename(attr, ".h/t m l", stem="../r") == "r-Qwen2.5-VL-3B-x-4steps.html"


# --- HTML report ---------------------------------------------------------------------------------------------------


def test_report_is_one_offline_document_with_a_panel_per_method_and_a_slider():
    attr = hostile_attr(steps=4)
    report = report_html(attr, step=1, date="2025-01-02 03:04 UTC")
    page = Page(report)
    assert page.decl is not None and page.decl.lower() == "doctype html"
    tags = [t for t, _ in page.elements]
    assert tags.count("html") == tags.count("head") == tags.count("body") == 1
    assert "link" not in tags and "iframe" not in tags and "object" not in tags
    for _, a in page.elements:  # nothing is fetched: no src/href but data: URIs
        for key in ("src", "href", "srcset", "action"):
            assert a.get(key) is None or a[key].startswith("data:"), (key, a[key])
    lowered = report.lower()
    assert "http://" not in lowered and "https://" not in lowered and "@import" not in lowered
    assert "url(" not in lowered and "@font-face" not in lowered
    assert [a.get("type") for a, _ in page.scripts] == ["application/json", None]
    assert page.scripts[1][1] == report_script() and "src" not in page.scripts[1][0]
    assert list(page.panels) == list(attr.methods)
    _, slider = page.by_id("xai-step")
    assert (slider["type"], slider["min"], slider["max"], slider["value"]) == ("range", "1", "4", "2")
    assert page.by_id("xai-mean")[1]["type"] == "checkbox"
    assert page.answer == [(0, False), (1, True), (2, False), (3, False)]
    assert "2025-01-02 03:04 UTC" in report and "alpha=0.5" in report and "0.50 s" in report and "1.25 s" in report
    assert report == report_html(attr, step=1, date="2025-01-02 03:04 UTC")  # deterministic


@pytest.mark.parametrize("user_only", [True, False])
def test_embedded_scores_are_the_shown_z_within_rounding(user_only):
    attr = hostile_attr(steps=5)
    methods = list(attr.methods)
    data = embedded(report_html(attr, user_only=user_only))
    cols = USER if user_only else list(range(len(HOSTILE)))
    assert data["steps"] == 5 and data["methods"] == methods
    for i, m in enumerate(methods):
        raw = attr.methods[m].raw
        rows = np.array([[np.nan if v is None else v for v in row] for row in data["z"][i]], dtype=np.float64)
        assert rows.shape == (6, len(cols))
        want = np.stack([independent_z(raw[s], cols) for s in range(5)])  # (K, n)
        if not user_only:  # the stored z over all tokens, whatever it holds for a row with a NaN score
            stored = attr.methods[m].z.astype(np.float64)
            finite_rows = np.isfinite(raw).all(axis=1)
            np.testing.assert_allclose(stored[finite_rows], want[finite_rows], atol=1e-5)
            want = stored
        np.testing.assert_allclose(rows[:5], want, atol=0.005 + 1e-6, equal_nan=True)
        with np.errstate(invalid="ignore"):
            np.testing.assert_allclose(rows[5], np.nanmean(want, axis=0), atol=0.005 + 1e-6, equal_nan=True)
    if user_only:
        assert np.isnan(np.array(data["z"][1][1], dtype=float)).sum() == 1  # the one missing score is null


def test_embedded_bins_titles_and_captions_reproduce_the_apps_view_at_every_step():
    """What the script copies into the page at step s is exactly what side_by_side_html shows at step s."""
    attr = hostile_attr(steps=4)
    methods = [*attr.methods, "atman"]  # a method without scores stays a pending panel
    for user_only in (True, False):
        data = embedded(report_html(attr, methods, user_only=user_only))
        assert data["z"][2] is None and data["bins"][2] is None
        for s in range(4):
            app = Page(side_by_side_html(attr, methods, s, user_only))
            for i, m in enumerate(methods[:2]):
                got = [
                    (bin_char_class(b), title_of(z), text)
                    for b, z, (_, _, text) in zip(data["bins"][i][s], data["z"][i][s], app.panels[m], strict=True)
                ]
                assert got == app.panels[m], (m, s)
            assert data["captions"][s] == cleaned(app.captions[0])
            legend = data["legends"][data["legend"][s]]
            assert legend in side_by_side_html(attr, methods, s, user_only)
        assert data["captions"][4].startswith("Mean of each token's z over all 4 steps · z-scores")
        if user_only:  # the mean view's colours: bins of the mean z on the mean view's own scale
            with np.errstate(invalid="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                means = [np.nanmean([independent_z(attr.methods[m].raw[s], USER) for s in range(4)], axis=0)
                         for m in methods[:2]]  # fmt: skip
            zmax = float(np.clip(max(np.nanmax(np.abs(v)) for v in means), 1.0, Z_CLIP))
            for i, mean in enumerate(means):
                assert [bin_char_class(c) for c in data["bins"][i][4]] == [bin_class(v, zmax) or None for v in mean]


def cleaned(caption: str) -> str:
    """A caption as the report's script shows it: control and format characters (a bidi override) as U+FFFD."""
    return "".join("\ufffd" if unicodedata.category(ch) in ("Cc", "Cf") else ch for ch in caption)


def bin_char_class(ch: str) -> str | None:
    """The class a bin character stands for, as the script maps it (None: no class attribute)."""
    if ch == "0":
        return None
    if ch == ".":
        return "xg"
    return f"r{ch}" if ch.isdigit() else f"b{'abcdefgh'.index(ch) + 1}"


def title_of(z: float | None) -> str:
    """The title the script writes for an embedded z (sign kept on -0.00)."""
    if z is None:
        return "no score"
    return ("-" if math.copysign(1.0, z) < 0 else "+") + f"{abs(z):.2f}"


def test_hostile_text_cannot_leave_the_data_or_break_the_page():
    attr = hostile_attr()
    report = report_html(attr, title="</title><script>alert(2)</script>", date="<!--")
    page = Page(report)
    assert [a.get("type") for a, _ in page.scripts] == ["application/json", None]  # no injected script element
    assert page.scripts[1][1] == report_script()
    assert report.lower().count("</script") == 2 and report.lower().count("<script") == 2
    assert "<!--" not in report and "\u2028" not in page.scripts[0][1]
    assert "\x00" not in report.split("<main", 1)[0]  # the head (title) has no control characters
    data = json.loads(page.scripts[0][1])  # hostile text inside the data decodes unchanged
    assert "'</script>'" in data["captions"][1] and data["methods"][1] == "</script><b>m"
    assert "\\u003c/script\\u003e" in page.scripts[0][1]
    tokens = [text for _, _, text in page.panels["macs"]]
    assert tokens == [HOSTILE[p] if HOSTILE[p] else "∅" for p in USER]  # shown as text, unchanged
    assert page.panels.keys() == attr.methods.keys()


def test_answer_strip_shows_step_scores_when_the_result_has_them():
    attr = hostile_attr(steps=2)
    attr.step_scores = {"probability": [0.931, 0.5], "entropy": [0.25, 2.0]}
    page = Page(report_html(attr))
    titles = [a["title"] for t, a in page.elements if a.get("class") == "xai-step"]
    assert titles == ["step 1: '␣Paris' · probability 0.931 · entropy 0.25 nats",
                      "step 2: '</script>' · probability 0.5 · entropy 2 nats"]  # fmt: skip
    attr.step_scores = {"probability": [0.9]}  # not one per step: left out
    assert "probability" not in report_html(attr)


def test_report_of_a_result_without_steps_or_methods():
    attr = hostile_attr()
    attr.generated_token_ids, attr.generated_tokens = [], []
    attr.methods = {}
    page = Page(report_html(attr))
    assert page.by_id("xai-step") is None and embedded(report_html(attr))["steps"] == 0
    assert "No answer." in report_html(attr)
    assert view_png(attr, ["macs"]).size[0] == 1200  # a "pending" panel, no legend


def image_attr(steps: int = 3) -> tuple[Attribution, Image.Image]:
    grid = (3, 5)
    prefix = 4
    n = prefix + grid[0] * grid[1] + 3
    attr = hostile_attr(steps=steps, n=n, image={"token_positions": list(range(prefix, prefix + 15)), "grid": [3, 5],
                                                 "size": [91, 37]})  # fmt: skip
    photo = Image.fromarray(np.random.default_rng(1).integers(0, 256, (37, 91, 3), dtype=np.uint8))
    return attr, photo


def test_image_report_embeds_one_bounded_overlay_per_kept_step():
    attr, photo = image_attr(steps=10)
    methods = list(attr.methods)
    report = report_html(attr, image=photo, max_image_frames=4, image_max_side=50, step=4)
    data = embedded(report)
    assert [s for s, _ in data["frames"]] == [0, 3, 6, 9] == gif_steps(10, 4)
    for s, uri in data["frames"]:
        assert uri.startswith("data:image/png;base64,")
        frame = Image.open(io.BytesIO(base64.b64decode(uri.split(",", 1)[1])))
        assert np.array_equal(
            np.asarray(frame.convert("RGB")), np.asarray(overlay_grid(photo, attr, methods, s, max_side=50))
        )
    _, img = Page(report).by_id("xai-image")
    assert img["src"] == data["frames"][1][1]  # step 4 (0-based) shows the nearest kept frame, step 3
    assert "(the nearest stored; the report keeps 4 of 10 steps)" in report
    short = embedded(report_html(attr, image=photo, max_image_frames=64, image_max_side=50))
    assert [s for s, _ in short["frames"]] == list(range(10))
    no_image = report_html(attr)
    assert 'id="xai-image"' not in no_image and "the image was not given to the report" in no_image


# --- the slider script, in a real headless browser when one is installed -------------------------------------------


def _browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None, "playwright is not installed"
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        return None, "no chromium on PATH"
    return (sync_playwright, exe), ""


def test_slider_script_in_a_browser_shows_what_the_app_shows(tmp_path):
    found, why = _browser()
    if found is None:
        if os.environ.get("EXPLAINER_REQUIRE_BROWSER") == "1":
            pytest.fail(f"browser required: {why}")
        pytest.skip(f"the report's script runs in a browser: {why}")
    sync_playwright, exe = found
    attr, photo = image_attr(steps=4)
    attr.user_positions = list(range(19, 22))
    methods = [*attr.methods, "atman"]
    path = tmp_path / "report.html"
    path.write_text(report_html(attr, methods, step=0, image=photo, max_image_frames=2), encoding="utf-8")
    data = embedded(path.read_text(encoding="utf-8"))
    read_view = """() => ({
        panels: Array.from(document.querySelectorAll('#xai-view .xai-panel')).map(p => [p.dataset.method,
            Array.from(p.querySelectorAll('.xai-flow i:not(.xh)')).map(i => [i.getAttribute('class'),
                i.getAttribute('title'), i.textContent])]),
        caption: document.querySelector('#xai-view .xai-heatmap > div').textContent,
        zmax: document.querySelector('#xai-view .xai-legend').dataset.zmax,
        selected: Array.from(document.querySelectorAll('.xai-answer [data-selected="true"]')).map(s => s.dataset.step),
        image: document.getElementById('xai-image').getAttribute('src'),
        out: document.getElementById('xai-step-out').textContent})"""
    requests, errors = [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=exe, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.on("request", lambda r: requests.append(r.url))
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(path.as_uri())
            views = {}
            for s in (3, 1, 0, 2):
                page.locator("#xai-step").fill(str(s + 1))
                views[s] = page.evaluate(read_view)
            page.locator("#xai-mean").check()
            mean = page.evaluate(read_view)
            page.locator('.xai-answer [data-step="1"]').click()
            clicked = page.evaluate(read_view)
        finally:
            browser.close()
    assert errors == [] and all(u.startswith(("file:", "data:")) for u in requests), (errors, requests)
    for s, got in views.items():
        app = Page(side_by_side_html(attr, methods, s, True))
        want = [[m, [list(t) for t in app.panels[m]]] for m in methods]
        assert got["panels"] == want, s
        assert got["caption"] == cleaned(app.captions[0])
        assert got["zmax"] == _legend_zmax(side_by_side_html(attr, methods, s, True))
        assert got["selected"] == [str(s)] and got["out"] == f"{s + 1} / 4"
        assert got["image"] == data["frames"][0 if s <= 1 else 1][1]  # frames kept for steps 0 and 3
    assert mean["selected"] == [] and mean["caption"].startswith("Mean of each token's z over all 4 steps")
    assert [cls for cls, _, _ in mean["panels"][0][1]] == [bin_char_class(c) for c in data["bins"][0][4]]
    assert clicked == {**views[1], "image": clicked["image"]} and clicked["image"] == data["frames"][0][1]


def _legend_zmax(fragment: str) -> str:
    (tag,) = [a for t, a in Page(fragment).elements if a.get("class") == "xai-legend"]
    return tag["data-zmax"]


# --- PNG -----------------------------------------------------------------------------------------------------------


def test_png_boxes_have_the_bin_colour_of_an_independently_computed_z():
    attr = hostile_attr(steps=3)
    methods = list(attr.methods)
    for step in range(3):
        img, boxes = _draw_view(attr, methods, step, user_only=True, width=900)
        assert img.mode == "RGB" and img.width == 900
        zs = {m: independent_z(attr.methods[m].raw[step], USER) for m in methods}
        zmax = float(np.clip(max(np.nanmax(np.abs(z)) for z in zs.values()), 1.0, Z_CLIP))
        for m in methods:
            drawn = [(p, css, box) for p, _, css, box in boxes[m] if p is not None]
            assert [p for p, _, _ in drawn] == USER
            for (p, css, (x0, y0, _, y1)), z in zip(drawn, zs[m], strict=True):
                want = bin_class(z, zmax)
                assert css == want
                colour = img.getpixel((x0 + 1, (y0 + y1) // 2))  # left padding of the box: background only
                expected = (255, 255, 255) if want == "" else tuple(
                    int(v) for v in bin_color(want)[4:-1].split(",")
                )  # fmt: skip
                assert colour == expected, (m, p, want, colour)
    # the strong token (raw + 4 at position 6) is the darkest red at every step for macs
    _, boxes = _draw_view(attr, ["macs"], 0)
    (css,) = [c for p, _, c, _ in boxes["macs"] if p == 6]
    assert css == "r8"


def test_png_size_grows_with_the_prompt_and_is_capped():
    def attr_of(n):
        a = hostile_attr(steps=2, n=n)
        a.user_positions = []
        return a

    short, longer = view_png(attr_of(20), ["macs"], width=600), view_png(attr_of(200), ["macs"], width=600)
    assert short.size[0] == longer.size[0] == 600 and longer.size[1] > short.size[1]
    capped_img, boxes = _draw_view(attr_of(3000), ["macs"], width=600, max_tokens=200)
    assert len(boxes["macs"]) == 200 and capped_img.size[1] == pytest.approx(longer.size[1], abs=40)
    assert (
        view_png(attr_of(20), ["macs"], width=99999).width == 2400 and view_png(attr_of(20), [], width=10).width == 480
    )
    wide = _draw_view(attr_of(20), ["macs", "</script><b>m", "atman"], width=1200)[1]
    xs = sorted({min(b[3][0] for b in bs) for bs in wide.values() if bs})
    assert len(xs) == 3  # three panels side by side


def test_png_is_deterministic_and_hostile_text_is_harmless():
    attr = hostile_attr()
    a = png_bytes(view_png(attr, list(attr.methods), 2))
    assert a == png_bytes(view_png(attr, list(attr.methods), 2)) and a.startswith(b"\x89PNG")
    assert png_bytes(view_png(attr, list(attr.methods), 1)) != a
    _, boxes = _draw_view(attr, ["macs"], 0)
    texts = {p: t for p, t, _, _ in boxes["macs"] if p is not None}
    assert texts[9] == "??[31m" and texts[12] == "''" and texts[7] == " ?evil"


def test_png_with_the_image_puts_the_overlay_on_top():
    attr, photo = image_attr(steps=3)
    with_image, without = view_png(attr, list(attr.methods), 1, image=photo), view_png(attr, list(attr.methods), 1)
    grid = overlay_grid(photo, attr, list(attr.methods), 1, max_side=max(120, (1200 - 20) // 2))
    assert with_image.height == without.height + grid.height + 10
    top = np.asarray(with_image)[10 : 10 + grid.height, 10 : 10 + grid.width]
    assert np.array_equal(top, np.asarray(grid))


# --- GIF -----------------------------------------------------------------------------------------------------------


def test_gif_has_bounded_frames_and_size_and_follows_the_steps():
    attr, photo = image_attr(steps=30)
    methods = list(attr.methods)
    data = gif_bytes(photo, attr, methods, max_frames=5, max_side=200, max_width=120, frame_ms=100)
    gif = Image.open(io.BytesIO(data))
    assert gif.format == "GIF" and gif.n_frames == 5 and gif.width <= 120
    steps = gif_steps(30, 5)
    assert steps == [0, 7, 14, 22, 29]
    side = (120 + 6) // 2 - 6
    for i, s in enumerate(steps):
        gif.seek(i)
        frame = np.asarray(gif.convert("RGB"), dtype=np.float32)
        want = np.asarray(overlay_grid(photo, attr, methods, s, max_side=side), dtype=np.float32)
        other = np.asarray(overlay_grid(photo, attr, methods, (s + 3) % 30, max_side=side), dtype=np.float32)
        assert frame.shape == want.shape
        assert np.abs(frame - want).mean() < 0.5 * np.abs(frame - other).mean()  # this step's frame, not another
    assert gif.info["loop"] == 0
    all_steps = Image.open(io.BytesIO(gif_bytes(photo, attr_of_steps(attr, 3), methods)))
    assert all_steps.n_frames == 3
    with pytest.raises(ValueError, match="nothing to animate"):
        gif_bytes(photo, attr, ["atman"])


def attr_of_steps(attr: Attribution, k: int) -> Attribution:
    out = attr.snapshot()
    out.generated_token_ids, out.generated_tokens = attr.generated_token_ids[:k], attr.generated_tokens[:k]
    out.methods = {m: MethodScores.from_raw(s.raw[:k], s.seconds, s.meta) for m, s in attr.methods.items()}
    return out


# --- round trip: export, load, identical views ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_result(tokenizer):
    bundle = bundle_from_objects(build_model("llama"), tokenizer, name="tiny-llama")
    return explain(bundle, "What is the capital of France?", methods=["macs", "rollout", "random", "atman"],
                   max_new_tokens=4)  # fmt: skip


def views(attr: Attribution, image: Image.Image | None = None) -> list:
    methods = [*attr.methods, "pending"]
    out = [answer_html(attr, s) for s in (None, 0, 2)]
    for s in range(attr.num_steps):
        for user_only in (True, False):
            out.append(side_by_side_html(attr, methods, s, user_only))
            out += [top_tokens_rows(attr, m, s, 5, user_only) for m in attr.methods]
    out.append(report_html(attr, methods, image=image))
    out.append(report_html(attr, methods, step=0, user_only=False))
    out.append(png_bytes(view_png(attr, methods, 1)))
    if image is not None:
        out.append(png_bytes(view_png(attr, methods, 1, image=image)))
        out.append(gif_bytes(image, attr, methods))
    return out


@pytest.mark.parametrize("kind", ["tiny model", "hostile", "image"])
def test_export_load_gives_identical_views(kind, tiny_result):
    image = None
    if kind == "tiny model":
        attr = tiny_result
        assert attr.num_steps == 4 and set(attr.methods) == {"macs", "rollout", "random", "atman"}
    elif kind == "hostile":
        attr = hostile_attr(steps=4)
    else:
        attr, image = image_attr(steps=3)
    loaded = load_result(result_json(attr).encode("utf-8"))
    same_result(loaded, attr)
    before, after = views(attr, image), views(loaded, image)
    assert len(before) == len(after)
    for i, (a, b) in enumerate(zip(before, after, strict=True)):
        assert a == b, i
