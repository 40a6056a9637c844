"""Gradio UI: type a prompt, watch the answer stream, and see for each answer token which prompt tokens it drew on.

UI only: this file reads widgets, calls `explainer`, renders with `visuals` and returns outputs. The model is loaded
once per process by `get_bundle()` and shared read-only; each user's result lives in `gr.State` as a plain-CPU
`Attribution`, so moving the step slider or toggling views re-renders without running the model again.

Run with `python app.py`; `GRADIO_SERVER_NAME` / `GRADIO_SERVER_PORT` pick host and port, `EXPLAINER_MODEL` a hub
id or local folder instead of the embedded default model.
"""

from __future__ import annotations

import functools
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gradio as gr

from explainer import ExplainerError, available_methods, load_model, stream_explain
from explainer.result import Attribution
from visuals import answer_html, side_by_side_html, top_tokens_rows

MODEL_ID = os.environ.get("EXPLAINER_MODEL") or None  # None: the embedded default model
EXAMPLES_PATH = Path(__file__).resolve().parent / "assets" / "examples.json"
DEFAULT_METHODS = ["macs"]
TOP_K = 5  # rows per method in the top-tokens table
TABLE_HEADERS = ["method", "rank", "token", "position", "z"]
_EMPTY_HEATMAP = (
    "<p>Type a prompt and press <b>Generate</b>: a heatmap over the prompt appears for every answer token.</p>"
)

_load_lock = threading.Lock()


@functools.cache
def _load(model_id: str | None) -> Any:
    return load_model(model_id)


def get_bundle() -> Any:
    """The process-wide model bundle: loaded on first use (serialised by a lock), then shared read-only."""
    with _load_lock:
        return _load(MODEL_ID)


def model_info() -> str:
    """Markdown line naming the loaded model; loads it on the first page visit."""
    try:
        bundle = get_bundle()
    except ExplainerError as e:
        raise gr.Error(str(e)) from e
    return f"**Model:** `{bundle.name}` · prompts up to {bundle.max_prompt_tokens} tokens"


def render(attr: Attribution | None, methods: list[str], step: float | None, show_all: bool) -> tuple[str, str, list]:
    """Answer, heatmap panels and top-token rows for one step of a stored result; never runs the model.

    Args:
        attr: the session's result, or None before the first generation.
        methods: methods to show, one panel each.
        step: 1-based step from the slider (None: the newest).
        show_all: show every prompt token with z over all of them, instead of only the user's text re-normalised.
    """
    if attr is None:
        return "", _EMPTY_HEATMAP, []
    methods = list(methods or [])
    index = None if step is None else int(step) - 1  # visuals count steps from 0
    user_only = not show_all
    rows = [[m, *row] for m in methods for row in top_tokens_rows(attr, m, index, TOP_K, user_only)]
    return answer_html(attr, index), side_by_side_html(attr, methods, index, user_only), rows


def _status(attr: Attribution, live: bool) -> str:
    if live:
        return str(attr.meta.get("status") or f"Generating… {attr.num_steps} tokens")
    timings = ", ".join(f"{name} {scores.seconds:.2f} s" for name, scores in attr.methods.items())
    return f"Done: {attr.num_steps} tokens. Time per method: {timings or 'n/a'}. Move the slider to explain any token."


def _outputs(attr: Attribution, methods: list[str], show_all: bool, live: bool) -> tuple:
    steps = max(attr.num_steps, 1)
    answer, heatmap, rows = render(attr, methods, steps, show_all)  # follow the newest step
    # gradio needs maximum > minimum; with one step the slider stays locked (visuals clamp step 2 to 1 anyway)
    slider = gr.update(minimum=1, maximum=max(steps, 2), value=steps, interactive=not live and steps > 1)
    return answer, heatmap, rows, slider, _status(attr, live), attr


def explain(
    prompt: str,
    methods: list[str],
    max_new_tokens: float,
    chat_template: bool,
    show_all: bool,
    progress: gr.Progress = gr.Progress(),  # noqa: B008 - gradio injects the request's tracker through this default
) -> Iterator[tuple]:
    """Generate an answer and its attributions, yielding the rendered views after every token.

    Yields:
        (answer HTML, heatmap HTML, top-token rows, step-slider update, status text, Attribution for the State);
        the slider is locked to the newest step while generating and released on the last yield.
    """
    methods = list(methods or [])
    if not methods:
        raise gr.Error("Select at least one attribution method.")
    attr = None
    stream = None
    try:
        bundle = get_bundle()
        stream = stream_explain(
            bundle,
            prompt,
            methods=methods,
            max_new_tokens=int(max_new_tokens),
            chat_template=bool(chat_template),
            progress=lambda fraction, message: progress(fraction, desc=message),  # post-hoc methods (AtMan)
        )
        for attr in stream:
            yield _outputs(attr, methods, show_all, live=True)
    except ExplainerError as e:
        raise gr.Error(str(e)) from e
    finally:
        if stream is not None and hasattr(stream, "close"):
            stream.close()  # a cancelled request lets the library remove its hooks now, not at garbage collection
    if attr is None:
        raise gr.Error("The model produced no tokens. Try another prompt or more new tokens.")
    yield _outputs(attr, methods, show_all, live=False)


def _examples() -> list[dict[str, str]]:
    return json.loads(EXAMPLES_PATH.read_text(encoding="utf-8"))


def _method_choices() -> tuple[list[str], list[str]]:
    choices = list(available_methods())
    default = [m for m in DEFAULT_METHODS if m in choices] or choices[:1]
    return choices, default


with gr.Blocks(title="Why did the model write that?") as demo:
    gr.Markdown(
        "# Why did the model write that?\n"
        "Type a prompt and press **Generate**. The answer appears token by token; for the selected answer token the "
        "heatmap shows which prompt tokens it relied on (red: more than average, blue: less). Hover a token for its "
        "score."
    )
    model_md = gr.Markdown("**Model:** loading…")
    state = gr.State(None)
    with gr.Row():
        with gr.Column(scale=3):
            prompt_box = gr.Textbox(label="Prompt", lines=6, placeholder="Ask a question, or paste a context and ask.")
            generate_btn = gr.Button("Generate", variant="primary")
            examples = _examples()
            gr.Examples(
                examples=[[e["prompt"]] for e in examples],
                inputs=[prompt_box],
                example_labels=[e["label"] for e in examples],
                label="Examples",
            )
        with gr.Column(scale=2):
            choices, default_methods = _method_choices()
            methods_box = gr.CheckboxGroup(choices, value=default_methods, label="Attribution methods")
            show_all_box = gr.Checkbox(False, label="Show all tokens (incl. chat template)")
            chat_template_box = gr.Checkbox(True, label="Use the chat template")
            max_new_slider = gr.Slider(1, 256, value=64, step=1, label="Max new tokens")
    status_md = gr.Markdown()
    answer_view = gr.HTML()
    step_slider = gr.Slider(
        1, 2, value=1, step=1, interactive=False, label="Generation step (the answer token being explained)"
    )
    heatmap_view = gr.HTML(_EMPTY_HEATMAP)
    table = gr.Dataframe(
        headers=TABLE_HEADERS,
        datatype=["str", "number", "str", "number", "number"],
        interactive=False,
        label="Top prompt tokens at this step",
    )

    generate_btn.click(
        explain,
        inputs=[prompt_box, methods_box, max_new_slider, chat_template_box, show_all_box],
        outputs=[answer_view, heatmap_view, table, step_slider, status_md, state],
        api_name="explain",
        concurrency_limit=1,  # one generation at a time on the shared model; others wait in the queue
        concurrency_id="model",
    )
    gr.on(
        triggers=[step_slider.input, show_all_box.input, methods_box.input],
        fn=render,
        inputs=[state, methods_box, step_slider, show_all_box],
        outputs=[answer_view, heatmap_view, table],
        api_name="render",
        trigger_mode="always_last",
        show_progress="hidden",
    )
    demo.load(model_info, outputs=model_md, api_name="model_info")

demo.queue(default_concurrency_limit=1)


def main() -> None:
    """Serve on GRADIO_SERVER_NAME:GRADIO_SERVER_PORT (default 127.0.0.1:7860)."""
    demo.launch(
        server_name=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
        server_port=int(os.environ.get("GRADIO_SERVER_PORT", "7860")),
    )


if __name__ == "__main__":
    main()
