"""Gradio app: type a prompt, watch the answer stream, and see for each answer token which prompt tokens it drew on.

Assembles the page from `ui` (one module per tab and panel) and exposes `demo`, the Space's entry point. Run with
`python app.py`; GRADIO_SERVER_NAME / _PORT pick host and port, EXPLAINER_MODEL / EXPLAINER_VLM the models.
"""

from __future__ import annotations

try:  # first, before torch: on ZeroGPU `spaces` patches torch's CUDA entry points at import
    import spaces  # noqa: F401
except ImportError:  # not on a Space: nothing to patch
    pass

import logging
import os

import gradio as gr

from explainer.runtime.hardware import hardware_name, zero_gpu
from explainer.runtime.memory import available_bytes, format_bytes
from ui import api, models, options, page
from ui.panels import contrast, faithfulness, layers, regions, sources
from ui.process import prepare
from ui.tabs import image_tab, share, text_tab

TITLE = "Why did the model write that?"
INTRO = (
    f"# {TITLE}\n"
    "Type a prompt and press **Generate**: the answer appears token by token, and for the answer token on the step "
    "slider each method's panel shows which prompt tokens it relied on (red: more than average, blue: less; hover a "
    "token for its score)."
)


def build() -> gr.Blocks:
    """The whole page: the text tab with its faithfulness panel, the image tab, and the method options both use."""
    with gr.Blocks(title=TITLE, delete_cache=(3600, 86400)) as blocks:  # served files' copies kept a day at most
        options_box, option_widgets = options.create_ui()
        with gr.Row(elem_id="xai-header"):  # the sinks toggle above the tabs: it changes the maps of both
            with gr.Column(scale=3):
                gr.Markdown(INTRO)
            with gr.Column(scale=2, min_width=300):
                hide_sinks = options.sinks_toggle().render()
        with gr.Tabs():
            with gr.Tab("Text prompt"):
                text = text_tab.create_ui()
                foil = contrast.create_ui()
                layers.create_event_handlers(layers.create_ui(), text)
                regions.create_event_handlers(regions.create_ui(False, "text-region"), text, "render_word_region")
                sources.create_event_handlers(sources.create_ui(), text)
                share.create_event_handlers(blocks, share.create_ui(), text)  # first view: a saved example; links
                faith = faithfulness.create_ui()
            with gr.Tab("Image + question"):
                image = image_tab.create_ui()  # its model line; the rest is shown when there is a vision model
                with image["body"]:
                    layers.create_event_handlers(layers.create_ui("image-macs-layers"), image, "render_image_layers")
                    regions.create_event_handlers(regions.create_ui(True, "image-region"), image, "render_image_region")
                    image_faith = faithfulness.create_ui(image=True)
        options_box.render()
        text["hide_sinks"] = image["hide_sinks"] = hide_sinks
        text_tab.create_event_handlers(text, option_widgets)
        contrast.create_event_handlers(foil, text, option_widgets)
        faithfulness.create_event_handlers(faith, text["result"], text["methods"], text["step"])
        faithfulness.create_event_handlers(image_faith, image["result"], image["methods"], image["step"], "image_")
        image_tab.create_event_handlers(blocks, image, option_widgets)
        blocks.load(models.vlm_info, outputs=image["model"], api_name="vlm_info")
        api.create_endpoints(blocks)  # the public API; every event above is the page's own, private
    return blocks.queue(default_concurrency_limit=1)


PROCESS = prepare()  # first: torch's threads, batching, freed memory kept, Gradio's analytics run rarely (ui/process)
if zero_gpu():  # `spaces` moves models to the GPU only from the thread that imported it: create them here, at import
    models.preload()
demo = build()


def start_up_line() -> str:
    """The start-up log line: the hardware, torch's threads, the memory free, each model with its dtype and whether
    it is loaded. Asks the Hub for the default models (when none is set) before the first visitor waits for it."""
    memory = format_bytes(free) if (free := available_bytes("cpu")) else "unknown"
    return (f"MACS Explorer on {hardware_name()}: {PROCESS.threads} torch threads, {memory} memory free; "
            f"{models.summary()}")  # fmt: skip


def main() -> None:
    """Serve on GRADIO_SERVER_NAME:GRADIO_SERVER_PORT (default 127.0.0.1:7860); EXPLAINER_LOG sets the log level."""
    logging.basicConfig(level=logging.WARNING, format="%(name)s %(message)s")
    logging.getLogger("explainer").setLevel(os.environ.get("EXPLAINER_LOG", "WARNING"))
    logging.getLogger("explainer").warning("%s", start_up_line())
    demo.launch(
        server_name=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
        server_port=int(os.environ.get("GRADIO_SERVER_PORT", "7860")),
        css=page.CSS,
    )


if __name__ == "__main__":
    main()
