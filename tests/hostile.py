"""Markup from outside, for the escaping tests (`tests/ui/guards/test_markup.py`, `tests/browser/test_markup.py`): a
saved result with markup in every string field, and a check that a piece of HTML draws none of it.

Every injected element has an id starting with `INJECTED`, and every address points at `SINK` (the discard port on
the loopback: nothing answers there), so a test finds what got drawn by id and what got fetched by address.
"""

from __future__ import annotations

from html.parser import HTMLParser

import numpy as np

from explainer.result.attribution import Attribution, MethodScores

INJECTED = "xai-inj"
SINK = "http://127.0.0.1:9"


def markup(field: str) -> str:
    """A string that draws an image, a link and a custom element (as HTML and as Markdown) if it is not escaped."""
    return (
        f'{field}<img id="{INJECTED}-{field}-img" src="{SINK}/{field}.png">'
        f'<a id="{INJECTED}-{field}-a" href="{SINK}/{field}">Click here to re-run the model</a>'
        f'<{INJECTED}-tag id="{INJECTED}-{field}-tag">x</{INJECTED}-tag>'
        f"![{INJECTED}]({SINK}/{field}-md.png) [Click here]({SINK}/{field}-link) **bold** `code` <{SINK}/{field}-auto>"
    )


def hostile_result() -> Attribution:
    """A result whose model, method names, prompt and answer tokens and metadata all carry `markup`."""
    prompt = ["<|im_start|>", markup("prompt"), " and", markup("prompt2")]
    answer = [markup("answer"), " ok", markup("answer2")]
    methods = {
        name: MethodScores.from_raw(np.linspace(0, 1, len(answer) * len(prompt)).reshape(len(answer), len(prompt)))
        for name in ("macs", markup("method"))
    }
    return Attribution(
        model=markup("model"), prompt_token_ids=list(range(len(prompt))), prompt_tokens=prompt,
        generated_token_ids=[10, 11, 12], generated_tokens=answer, methods=methods, user_positions=[1, 2, 3],
        meta={"dtype": markup("dtype"), "status": markup("status"), "saved": {"date": markup("date")}},
    )  # fmt: skip


class _Elements(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.found.append((tag, dict(attrs)))


def drawn_markup(html: str) -> list[str]:
    """The injected elements (and any element pointing at `SINK`) that `html` would draw; [] when it draws none."""
    parser = _Elements()
    parser.feed(html)
    fetches = ("src", "href", "srcset", "action", "formaction", "poster", "data", "background")
    return [
        f"<{tag} {attrs}>"
        for tag, attrs in parser.found
        if tag.startswith(INJECTED)
        or (attrs.get("id") or "").startswith(INJECTED)
        or any(SINK in (attrs.get(name) or "") for name in fetches)
        or SINK in (attrs.get("style") or "")
    ]
