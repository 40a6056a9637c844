"""`AppPage`: what a visitor does in the app, as methods over a Playwright page (the page-object pattern).

Tests say what they do (`app.generate("...", max_new_tokens=6)`) and read what a visitor sees (`app.heatmap_methods()`);
the selectors live here only. Widgets are found by their labels (Gradio writes `aria-label="number input for <label>"`
on a slider's number box), the views by the classes and `data-` attributes `visuals` writes (`.xai-step[data-step]`,
`.xai-panel[data-method]`). A new panel (spans, exports, reload) adds its methods here.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

GENERATE_SECONDS = 90  # a short answer with MACS and Rollout on the embedded model, on a busy 2-core machine
FAITHFULNESS_SECONDS = 120


class AppPage:
    """The app's text tab in one browser page."""

    def __init__(self, page: Any, screenshots: Path) -> None:
        self.page = page
        self.screenshots = screenshots

    # --- loading and screenshots -------------------------------------------------------------------------------
    def wait_loaded(self) -> None:
        """Wait until the model line says which model is loaded (`demo.load` has run)."""
        self.page.get_by_text(re.compile(r"prompts up to \d+ tokens")).wait_for(timeout=120_000)

    def shot(self, name: str) -> Path:
        """A full-page screenshot `<name>.png` in the screenshot folder."""
        path = self.screenshots / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path

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

    # --- generation --------------------------------------------------------------------------------------------
    def status(self) -> str:
        """The status line under the inputs ("Done: …", "generating: …", "Cancelled: …"), or ""."""
        line = self.page.get_by_text(re.compile(r"^(Done: |generating|Generating|running |Cancelled|Waiting)"))
        return line.first.inner_text() if line.count() else ""

    def press(self, button: str) -> None:
        self.page.get_by_role("button", name=button, exact=True).first.click()

    def generate(
        self, prompt: str, max_new_tokens: int = 6, methods: list[str] | None = None, wait: bool = True
    ) -> None:
        """Type a prompt, set the answer length (and methods), press Generate and, with `wait`, wait until done."""
        self.type_prompt(prompt)
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

    def selected_step(self) -> int | None:
        """0-based step highlighted on the answer strip."""
        selected = self.page.locator(".xai-answer:visible .xai-step[data-selected]")
        return int(selected.first.get_attribute("data-step")) if selected.count() else None

    def heatmap_methods(self) -> list[str]:
        """Methods with a heatmap panel, in display order."""
        panels = self.page.locator(".xai-heatmap:visible .xai-panel")
        return [panels.nth(i).get_attribute("data-method") for i in range(panels.count())]

    def heatmap_html(self) -> str:
        return self.page.locator(".xai-heatmap:visible").first.inner_html()

    def scored_tokens(self, method: str) -> int:
        """Prompt tokens of `method`'s panel that carry a score (a hover title with a z-score)."""
        return self.page.locator(f'.xai-panel[data-method="{method}"] .xai-flow i[title^="+"], '
                                 f'.xai-panel[data-method="{method}"] .xai-flow i[title^="-"]').count()  # fmt: skip

    def step_slider_value(self) -> int:
        return int(float(self.page.get_by_label("number input for Generation step", exact=False).input_value()))

    def move_step_slider(self, presses: int) -> None:
        """Drag-free slider move: focus the range slider and press the arrow keys (negative: to the left)."""
        slider = self.page.get_by_label("range slider for Generation step", exact=False)
        slider.focus()
        key = "ArrowLeft" if presses < 0 else "ArrowRight"
        for _ in range(abs(presses)):
            slider.press(key)

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
