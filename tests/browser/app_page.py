"""`AppPage`: what a visitor does in the app, as methods over a Playwright page (the page-object pattern).

Tests say what they do (`app.generate("...", max_new_tokens=6)`) and read what a visitor sees (`app.heatmap_methods()`);
the selectors live here only. Widgets are found by their labels (Gradio writes `aria-label="number input for <label>"`
on a slider's number box), the views by the classes and `data-` attributes `visuals` writes (`.xai-step[data-step]`,
`.xai-panel[data-method]`, `.xai-top` for the top sentences), buttons by their names. A new panel adds its methods here.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

GENERATE_SECONDS = 90  # a short answer with MACS and Rollout on the embedded model, on a busy 2-core machine
FAITHFULNESS_SECONDS = 120
BUSY_SECONDS = 30  # the first event that marks the button busy; 10 s was missed on a 2-core machine under full load
_CANONICAL = """el => {
  const walk = n => n.nodeType === 3 ? n.data : n.nodeType !== 1 ? "" : "<" + n.tagName.toLowerCase()
    + [...n.attributes].map(a => ` ${a.name}="${a.value}"`).sort().join("") + ">"
    + [...n.childNodes].map(walk).join("") + "</" + n.tagName.toLowerCase() + ">";
  return walk(el);
}"""
_STATUS = re.compile(r"^(Done: |generating|Generating|teacher-forcing|running |Stopped|Opened |Waiting|Saved result)")


class AppPage:
    """The app's text tab in one browser page."""

    def __init__(self, page: Any, screenshots: Path) -> None:
        self.page = page
        self.screenshots = screenshots

    # --- loading and screenshots -------------------------------------------------------------------------------
    def wait_loaded(self) -> None:
        """Wait until the model line names the model (`demo.load` has run; the model itself loads with the first
        request, or is loaded already)."""
        line = re.compile(r"prompts up to \d+ tokens|loads with the first request")
        self.page.get_by_text(line).wait_for(timeout=120_000)

    def shot(self, name: str, full_page: bool = True) -> Path:
        """A screenshot `<name>.png` in the screenshot folder: the whole page, or (`full_page=False`) the window."""
        path = self.screenshots / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=full_page)
        return path

    # --- the first screen ----------------------------------------------------------------------------------------
    def first_screen(self) -> dict[str, Any]:
        """Locators of what a demo's first screen must show: the text tab's status line, answer strip, step slider
        (its block: label, number box and range), each method's panel (`panel:<method>`), the prompt and Generate."""
        shown = {
            "status": self.page.locator("#text-views .block.xai-status"),
            "answer strip": self.page.locator(".xai-answer:visible").first,
            "step slider": self.page.locator("div.block", has=self.page.get_by_label(
                "range slider for Generation step", exact=False)).first,  # fmt: skip
            "prompt": self.page.get_by_label("Prompt", exact=True),
            "Generate": self.run_button(),
        }
        for method in self.heatmap_methods():
            shown[f"panel:{method}"] = self.page.locator(f'.xai-heatmap:visible .xai-panel[data-method="{method}"]')
        return shown

    def outside_window(self, shown: dict[str, Any]) -> dict[str, Any]:
        """Those of `shown` (name -> locator) whose bounding box is not wholly inside the window, with their box."""
        size = self.page.viewport_size
        out = {}
        for name, locator in shown.items():
            box = locator.bounding_box()
            inside = box is not None and box["x"] >= -1 and box["y"] >= -1  # a pixel's slack: sub-pixel layouts
            inside = inside and box["x"] + box["width"] <= size["width"] + 1
            if not (inside and box["y"] + box["height"] <= size["height"] + 1):
                out[name] = box
        return out

    def run_button(self) -> Any:
        """The text tab's Generate button, whatever it reads ("Generate", or "Generating…" while busy)."""
        return self.page.locator("button#text-generate")

    # --- inputs ------------------------------------------------------------------------------------------------
    def type_prompt(self, text: str) -> None:
        box = self.page.get_by_label("Prompt", exact=True)
        box.fill(text)
        box.blur()

    def checked_methods(self) -> list[str]:
        """Names of the ticked method checkboxes of the visible tab, in display order."""
        boxes = self.page.locator("input[type=checkbox]:visible")
        names = []
        for i in range(boxes.count()):
            box = boxes.nth(i)
            name = box.get_attribute("name") or ""
            if name not in ("", "test") and box.is_checked():
                names.append(name)
        return names

    def set_methods(self, methods: list[str]) -> None:
        """Tick exactly `methods` among the attribution method checkboxes of the visible tab."""
        from explainer import available_methods

        for name in available_methods():
            box = self.page.locator(f"input[type=checkbox][name={name}]:visible")
            if box.count() == 0 and name not in methods:  # not offered for this model (macs_calibrated, no weights)
                continue
            if box.is_checked() != (name in methods):
                box.click()

    def set_number(self, label: str, value: float) -> None:
        """Type a value into a slider's number box and confirm it (as a visitor who types instead of dragging)."""
        box = self.page.get_by_label(f"number input for {label}")
        box.fill(str(value))
        box.press("Enter")
        box.blur()

    def set_max_new_tokens(self, value: int) -> None:
        self.set_number("Max new tokens", value)

    def type_answer(self, text: str) -> None:
        """Fill the "Answer (optional)" box of the text tab ("" to generate)."""
        box = self.page.get_by_label("Answer (optional)", exact=True).first
        box.fill(text)
        box.blur()

    def pick_example(self, label: str) -> None:
        """Click one of the text tab's examples (fills the prompt)."""
        self.page.get_by_role("button", name=label).click()

    # --- generation --------------------------------------------------------------------------------------------
    def status(self) -> str:
        """The status line under the inputs ("Done: …", "generating: …", "Cancelled: …"), or ""."""
        line = self.page.get_by_text(_STATUS)
        return line.first.inner_text() if line.count() else ""

    def wait_status(self, pattern: str, timeout: float = GENERATE_SECONDS) -> str:
        """Wait until the status line matches `pattern` (a regular expression); returns it."""
        line = self.page.get_by_text(_STATUS).filter(has_text=re.compile(pattern)).first
        line.wait_for(timeout=timeout * 1000)
        return line.inner_text()

    def press(self, button: str) -> None:
        self.page.get_by_role("button", name=button, exact=True).first.click()

    def generate(
        self,
        prompt: str | None,
        max_new_tokens: int = 6,
        methods: list[str] | None = None,
        wait: bool = True,
        answer: str | None = None,
    ) -> None:
        """Type a prompt (None: keep the one there), set the answer length (and methods, and a given answer), press
        Generate and, with `wait`, wait until done."""
        if prompt is not None:
            self.type_prompt(prompt)
        if answer is not None:
            self.type_answer(answer)
        self.set_max_new_tokens(max_new_tokens)
        if methods is not None:
            self.set_methods(methods)
        self.press("Generate")
        if wait:
            self.wait_done()

    def wait_done(self, timeout: float = GENERATE_SECONDS) -> str:
        """Wait for "Done: …" in the status line; returns it."""
        line = self.page.get_by_text(re.compile(r"^Done: \d+ tokens"))
        line.wait_for(timeout=timeout * 1000)
        return line.inner_text()

    # --- views -------------------------------------------------------------------------------------------------
    def answer_tokens(self) -> list[str]:
        return self.page.locator(".xai-answer:visible .xai-step").all_inner_texts()

    def answer_titles(self) -> list[str]:
        """The hover titles of the answer tokens ("step 1: 'Paris' · p = 0.912 · entropy 0.41 nats")."""
        return self.page.locator(".xai-answer:visible .xai-step").evaluate_all("els => els.map(e => e.title)")

    def answer_text(self) -> str:
        """Everything the answer strip shows: its note, the tokens, its legend line."""
        return self.page.locator(".xai-answer:visible").first.inner_text()

    def selected_steps(self) -> list[int]:
        """0-based steps highlighted on the answer strip (one, or a span)."""
        selected = self.page.locator(".xai-answer:visible .xai-step[data-selected]")
        return [int(s) for s in selected.evaluate_all("els => els.map(e => e.dataset.step)")]

    def selected_step(self) -> int | None:
        """0-based step highlighted on the answer strip."""
        selected = self.page.locator(".xai-answer:visible .xai-step[data-selected]")
        return int(selected.first.get_attribute("data-step")) if selected.count() else None

    def last_content_step(self) -> int:
        """0-based step of the answer's last content token, where a finished answer opens: trailing special tokens
        (`<|im_end|>`) and whitespace (a newline shows as ⏎) are skipped (`result.steps.last_content_step`)."""
        from explainer.result.spans import is_special

        tokens = [t.replace("⏎", "").strip() for t in self.answer_tokens()]
        return next((i for i in range(len(tokens) - 1, -1, -1) if tokens[i] and not is_special(tokens[i])), 0)

    def heatmap_methods(self) -> list[str]:
        """Methods with a heatmap panel, in display order."""
        panels = self.page.locator(".xai-heatmap:visible .xai-panel")
        return [panels.nth(i).get_attribute("data-method") for i in range(panels.count())]

    def heatmap_html(self) -> str:
        return self.page.locator(".xai-heatmap:visible").first.inner_html()

    def view_dom(self, selector: str = ".xai-heatmap:visible") -> str:
        """The first matching view as canonical markup: tags, attributes sorted by name, text. Gradio patches an
        updated view in place, which can reorder attributes, so raw `inner_html` differs between two visitors who
        see the same thing."""
        return self.page.locator(selector).first.evaluate(_CANONICAL)

    def scored_tokens(self, method: str) -> int:
        """Prompt tokens of `method`'s panel that carry a score (a hover title with a z-score)."""
        return self.page.locator(f'.xai-panel[data-method="{method}"] .xai-flow i[title^="+"], '
                                 f'.xai-panel[data-method="{method}"] .xai-flow i[title^="-"]').count()  # fmt: skip

    def _step_number_box(self) -> Any:
        return self.page.get_by_label("number input for Generation step", exact=False)

    def step_slider_value(self) -> int:
        return int(float(self._step_number_box().input_value()))

    def step_slider_enabled(self) -> bool:
        return self.page.get_by_label("range slider for Generation step", exact=False).is_enabled()

    # --- spans and prompt units --------------------------------------------------------------------------------
    def explain_span(self, on: bool = True) -> None:
        """Tick (or untick) "Explain a span of answer tokens": the span starts as the whole answer."""
        box = self.page.get_by_label("Explain a span of answer tokens", exact=False)
        if box.is_checked() != on:
            box.click()

    def set_span_end(self, value: int) -> None:
        self.set_number("Span end", value)

    def set_units(self, unit: str) -> None:
        """Pick the prompt units: "token", "word" or "sentence"."""
        self.page.get_by_label(unit, exact=True).check()

    def heatmap_granularity(self) -> str | None:
        return self.page.locator(".xai-heatmap:visible").first.get_attribute("data-granularity")

    def heatmap_caption(self) -> str:
        return self.page.locator(".xai-heatmap:visible > div").nth(0).inner_text()

    def top_sentences(self, method: str) -> list[str]:
        """The top supporting sentences listed for `method`, best first (empty when none are shown)."""
        rows = self.page.locator(f'.xai-top:visible .xai-panel[data-method="{method}"] tbody tr[data-pos]')
        return [rows.nth(i).locator("td").nth(2).inner_text() for i in range(rows.count())]

    # --- saving and opening ------------------------------------------------------------------------------------
    def download(self, name: str, folder: Path) -> Path:
        """Press a download button ("Download JSON", "Download HTML report", "Download PNG of this view") once it is
        enabled and save the file into `folder` under the name the app suggests."""
        button = self.page.get_by_role("button", name=name, exact=True)
        self.page.wait_for_function("b => !b.disabled", arg=button.element_handle())
        with self.page.expect_download() as info:
            button.click()
        path = folder / info.value.suggested_filename
        info.value.save_as(path)
        return path

    def expect_download(self, name: str, enabled: bool, timeout: float = 30_000) -> None:
        """Wait until the download button `name` is enabled (or disabled); fails with playwright's AssertionError
        where it stays the other way (its state is set by an event that may land after the view it follows)."""
        from playwright.sync_api import expect

        button = expect(self.page.get_by_role("button", name=name, exact=True))
        (button.to_be_enabled if enabled else button.to_be_disabled)(timeout=timeout)

    def open_saved(self, path: Path) -> str:
        """Upload a saved result through "Open a saved result" and wait for its status line; returns it."""
        block = self.page.locator(".block", has_text="Open a saved result")
        block.locator("input[type=file]").set_input_files(str(path))
        return self.wait_status(r"^Opened ")

    def move_step_slider(self, presses: int) -> None:
        """Drag-free slider move: focus the range slider and press the arrow keys (negative: to the left), then wait
        until its number box shows where the presses lead (clamped to the slider's range).

        The slider is waited for first (enabled: the request has handed it over), and presses that a busy browser
        dropped are made again (CI once saw none of five land), so a test reads the view of the step it asked for.
        """
        slider = self.page.get_by_label("range slider for Generation step", exact=False)
        slider.wait_for()
        self.page.wait_for_function("el => !el.disabled", arg=slider.element_handle(), timeout=30_000)
        low, high = (int(float(slider.get_attribute(bound) or 1)) for bound in ("min", "max"))
        target = min(max(self.step_slider_value() + presses, low), high)
        for _ in range(3):
            now = self.step_slider_value()
            if now == target:
                return
            slider.focus()
            key = "ArrowLeft" if target < now else "ArrowRight"
            for _ in range(abs(target - now)):
                slider.press(key)
            try:
                self.page.wait_for_function(
                    "([el, want]) => Number(el.value) === want",
                    arg=[self._step_number_box().element_handle(), target],
                    timeout=5_000,
                )
            except Exception as error:  # Playwright's TimeoutError: presses lost, read the value and press the rest
                if type(error).__name__ != "TimeoutError":
                    raise
        assert self.step_slider_value() == target, f"the step slider stays at {self.step_slider_value()}, not {target}"

    def estimate_text(self) -> str:
        """The time estimate under the method checkboxes."""
        note = self.page.get_by_text(re.compile(r"^(Extra time for this prompt|Type a prompt to see|No time estimate)"))
        return note.first.inner_text()

    # --- faithfulness ------------------------------------------------------------------------------------------
    def measure_faithfulness(self, soft: str = "skip π-Soft", wait: bool = True) -> None:
        """Open the Faithfulness panel, pick what π-Soft runs over, press "Measure faithfulness"."""
        opener = self.page.get_by_role("button", name=re.compile(r"^Faithfulness"))
        if not self.page.get_by_role("button", name="Measure faithfulness").is_visible():
            opener.click()
        self.page.get_by_label(soft, exact=True).check()
        self.press("Measure faithfulness")
        if wait:
            self.page.get_by_text(re.compile(r"^Measured on \d+ answer tokens")).wait_for(
                timeout=FAITHFULNESS_SECONDS * 1000
            )

    def removal_curve_legend(self) -> list[str]:
        """Legend entries of the drawn removal-curve figure ("macs (SRG +0.074)", …), once Plotly has drawn it."""
        figure = self.page.locator(".js-plotly-plot", has_text="most influential first").first
        figure.wait_for()
        return figure.locator(".legendtext").evaluate_all("els => els.map(e => e.textContent)")  # SVG: no innerText

    # --- "which answer tokens used this?" ------------------------------------------------------------------------
    def open_accordion(self, title: str) -> None:
        """Open the visible tab's accordion whose title starts with `title` (if it is closed)."""
        button = self.page.get_by_role("button", name=re.compile(rf"^{re.escape(title)}")).first
        if button.get_attribute("aria-expanded") != "true":
            button.click()

    def choose_words(self, labels: list[str]) -> None:
        """Pick `labels` ("3: Paris") in the text tab's word list."""
        box = self.page.get_by_label("Words of the prompt")
        for label in labels:
            box.click()
            self.page.get_by_role("option", name=label, exact=True).click()
        box.blur()

    def region_bars(self, elem_id: str) -> dict[str, list[float | None]]:
        """The bars of the chart in the accordion `elem_id` (method -> one value per answer token), once drawn."""
        figure = f"#{elem_id} .js-plotly-plot"
        self.page.wait_for_function(
            "s => { const p = document.querySelector(s); return !!p && !!p._fullData && p._fullData.length > 0; }",
            arg=figure,
        )
        return self.page.locator(figure).evaluate(
            "el => Object.fromEntries(el._fullData.map(t => [t.name, Array.from(t.y, v => v === null ? null : +v)]))"
        )

    # --- the image tab -----------------------------------------------------------------------------------------
    def ask_image(
        self, images: list[Path], question: str, max_new_tokens: int, methods: list[str], busy: bool = False
    ) -> str:
        """In the image tab: upload `images`, type the question, set the answer length and methods, press "Ask about
        the image" and wait until done and the button is ready again; returns the status line. With `busy`, the
        button must read "Asking…", disabled, meanwhile (for a request long enough to see it: the first one loads
        the model)."""
        panel = self.page.locator('[role="tabpanel"]:visible')
        panel.locator("input[type=file]").first.set_input_files(str(images[0]))
        if len(images) > 1:  # the rest into the "More images" gallery
            gallery = panel.locator("div.block", has_text="More images").locator("input[type=file]").first
            gallery.set_input_files([str(p) for p in images[1:]])
            panel.locator("div.block", has_text="More images").locator("img").nth(len(images) - 2).wait_for()
        panel.get_by_label("Question", exact=True).fill(question)
        box = panel.get_by_label("number input for Max new tokens")
        box.fill(str(max_new_tokens))
        box.press("Enter")
        self.set_methods(methods)
        self.press("Ask about the image")
        button = self.page.locator("button#image-ask").element_handle()
        if busy:
            self.page.wait_for_function("b => b.innerText === 'Asking…' && b.disabled", arg=button,
                                        timeout=BUSY_SECONDS * 1000)  # fmt: skip
        status = self.wait_done(timeout=GENERATE_SECONDS * 2)
        self.page.wait_for_function("b => b.innerText === 'Ask about the image' && !b.disabled", arg=button)
        return status

    def image_overlay_size(self) -> tuple[int, int]:
        """The natural size of the overlay image shown, once it is loaded."""
        label = "Image regions each method credits for this token"
        block = self.page.locator("div.block:visible", has_text=label)
        overlay = block.locator("img").first
        overlay.wait_for()
        # Looked up again on every poll: a later update of the result (the reliance pass's) may replace the element,
        # and a handle held to the replaced one would never load.
        loaded = """label => [...document.querySelectorAll('div.block')].some(b => b.offsetParent !== null
            && b.innerText.includes(label)
            && [...b.querySelectorAll('img')].some(i => i.complete && i.naturalWidth > 0))"""
        self.page.wait_for_function(loaded, arg=label)
        return tuple(overlay.evaluate("img => [img.naturalWidth, img.naturalHeight]"))

    def click_image_at(self, image: Any, fx: float, fy: float) -> None:
        """Click the picture shown in the `img` locator at fractions (fx, fy) of its width and height (the element
        centres it, shrunk to fit but never enlarged: Gradio's object-fit scale-down)."""
        box = image.bounding_box()
        width, height = image.evaluate("img => [img.naturalWidth, img.naturalHeight]")
        scale = min(1.0, box["width"] / width, box["height"] / height)
        x0, y0 = (box["width"] - width * scale) / 2, (box["height"] - height * scale) / 2
        image.click(position={"x": x0 + fx * width * scale, "y": y0 + fy * height * scale})
