"""The examples and their saved results: a clicked text example shows its saved result at once, and the first page
view shows the first one's, before any model has loaded (the handlers are in `text_tab`).

`assets/examples.json` lists each text example's `label`, `prompt` and `result`: the path, from the repository root,
of a saved-result JSON (`explainer.result.load_result`) that `scripts/make_examples.py` makes with the embedded model.
The image examples (`assets/images`) have none: the only vision-language weights at hand when they were made were
random, whose answers mean nothing, so they run live.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gradio as gr

from explainer.result.attribution import Attribution, load_result

from ..guards.markup import markdown_text

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES_PATH = ROOT / "assets" / "examples.json"
IMAGE_EXAMPLES_LABEL = (
    "Example images: they run live (no saved results: the only vision model at hand when they were made had random "
    "weights, whose answers would mean nothing)"
)


def examples() -> list[dict[str, str]]:
    """The built-in text examples: [{"label": ..., "prompt": ..., "result": path of its saved result}]."""
    return json.loads(EXAMPLES_PATH.read_text(encoding="utf-8"))


def saved_result(example: dict[str, str]) -> Attribution | None:
    """An example's saved result, loaded without a model (None when it has none), with the timings measured where
    it was made (shown; `estimate.calibrate` does not learn from an opened file's, `Attribution.opened`).

    Raises:
        InputError: the file is missing or not a saved result (`load_result`).
    """
    path = example.get("result")
    if not path:
        return None
    return load_result(ROOT / path)


def saved_status(attr: Attribution, label: str) -> str:
    """The status line of a shown example: saved, by which model, in which dtype, when; how to run it live."""
    saved = attr.meta.get("saved") or {}
    made = f", made {markdown_text(saved['date'])}" if saved.get("date") else ""
    dtype = f" in {markdown_text(attr.meta['dtype'])}" if attr.meta.get("dtype") else ""
    methods = ", ".join(markdown_text(name) for name in attr.methods)
    return (
        f"Saved result of the example “{markdown_text(label)}”: {attr.num_steps} answer tokens by "
        f"{markdown_text(attr.model)}{dtype}{made}, "
        f"methods {methods}; no model was run. Tick a method to see its map, move the slider to explain any token, "
        "or press **Generate** to run it live."
    )


def shown_methods(attr: Attribution, ticked: list[str] | None, defaults: list[str]) -> list[str]:
    """The methods a saved result is shown with: the ticked ones it has, else the default ones it has."""
    chosen = [m for m in ticked or [] if m in attr.methods]
    return chosen or [m for m in defaults if m in attr.methods] or list(attr.methods)[:1]


def create_ui(shown: list[dict[str, str]], prompt: Any) -> gr.Dataset:
    """The examples as a row of buttons (their labels) that fill `prompt`; its click handler gets the index."""
    return gr.Dataset(
        components=[prompt],
        samples=[[e["prompt"]] for e in shown],
        sample_labels=[e["label"] for e in shown],
        label="Examples (each shows its saved result at once)",
        type="index",
    )
