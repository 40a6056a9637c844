"""The line under the text tab's methods: how long each slower method would take on this prompt, before it runs."""

from __future__ import annotations

from typing import Any

import gradio as gr

from explainer import available_methods
from explainer.errors import ExplainerError
from explainer.estimate import calibrate, estimate
from explainer.result.attribution import Attribution
from explainer.runtime.hardware import zero_gpu

from .. import models
from ..events import Components
from ..guards import inputs
from ..guards.errors import user_errors
from ..guards.markup import markdown_text
from ..options import chosen_options

HINT = "Type a prompt to see how long the slower methods would take on it."


@user_errors
def method_estimates(
    prompt: str, max_new_tokens: float, chat_template: bool, result: Any, answer: str | None, *options: Any
) -> str:
    """Markdown under the method checkboxes: the extra time of each slower method on this prompt and answer length
    (the given answer's, when the *Answer* box is filled). A request the estimate cannot take says why, in the line.

    Tokenises the prompt only; the model's speed is probed once per process (briefly, and not while another
    request holds the model), and a finished result corrects the figures of the methods it ran.
    """
    if not isinstance(prompt, str) or not prompt.strip():
        return HINT
    given = inputs.answer_text(answer) if isinstance(answer, str) else None
    try:
        new = inputs.whole(max_new_tokens, "Max new tokens", inputs.NEW_TOKENS)
        bundle = models.get_bundle()
        calibrate(bundle, result if isinstance(result, Attribution) else None)
        figures = estimate(
            bundle, prompt, max_new_tokens=new, chat_template=bool(chat_template),
            method_options=chosen_options(available_methods(), options), answer=given, probe=not zero_gpu(),
        )  # fmt: skip
    except ExplainerError as e:
        return f"No time estimate: {markdown_text(e)}"
    slow = [e for e in figures if not e.cost.free]
    if not slow:
        return ""
    parts = " · ".join(f"**{e.method}** {e.describe()}{' ✓' if e.corrected else ''}" for e in slow)  # registry names
    length = "the given answer" if given else f"up to {new} new"
    source = "an assumed GPU speed (ZeroGPU runs the model only in requests)" if zero_gpu() else "a short speed probe"
    return (
        f"Extra time for this prompt ({slow[0].prompt_tokens} tokens, {length}): {parts}. "
        f"Rough figures from {source} of this model; ✓: corrected by that method's own last run here."
    )


def create_event_handlers(c: Components, option_widgets: list[Any], explain_event: Any) -> None:
    """The estimate follows the prompt, the answer length and the options, and is corrected after each answer."""
    asked = c("prompt", "max_new", "chat_template", "result", "given_answer") + option_widgets
    triggers = [c[name].change for name in ("prompt", "given_answer", "max_new", "chat_template")]
    gr.on(
        triggers=triggers + [w.change for w in option_widgets],
        fn=method_estimates,
        inputs=asked,
        outputs=c["estimate"],
        api_name="estimate",
        api_visibility="private",
        trigger_mode="always_last",  # typing sends many changes: only the newest is estimated
        show_progress="hidden",
    )
    explain_event.then(  # a finished answer corrects the figures of the methods it ran
        method_estimates, inputs=asked, outputs=c["estimate"], api_name="estimate_after_explain",
        api_visibility="private", show_progress="hidden",
    )  # fmt: skip
