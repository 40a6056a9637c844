"""Markup from outside in a real browser: a saved result with markup in every string field (model, methods, prompt
and answer tokens, metadata, the file's name), and markup typed into every text box of the text tab, are shown as
text. No element the markup names appears in the page, and the browser asks nothing of the markup's address."""

from __future__ import annotations

import re

from visuals.export import result_json

from ..hostile import INJECTED, SINK, hostile_result

_DRAWN = """() => {
  const all = [...document.querySelectorAll('*')];
  const sink = v => (v || '').startsWith(SINK_URL);
  return all.filter(e => e.id.startsWith(INJECTED) || e.tagName.toLowerCase().startsWith(INJECTED)
      || sink(e.getAttribute('src')) || sink(e.getAttribute('href')) || sink(e.getAttribute('srcset')))
    .map(e => e.outerHTML.slice(0, 160));
}""".replace("SINK_URL", repr(SINK + "/")).replace("INJECTED", repr(INJECTED))


def typed_markup(box: int) -> str:
    """Short markup for a text box (its tokens are explained one by one when it is the answer)."""
    return f'<img id="{INJECTED}-box{box}" src="{SINK}/box{box}.png"><{INJECTED}-t{box}>'


def assert_nothing_drawn(app, fetched: list[str], what: str) -> None:
    app.page.wait_for_timeout(500)  # let Svelte draw the last update
    drawn = app.page.evaluate(_DRAWN)
    assert drawn == [], f"{what}: {drawn}"
    assert [url for url in fetched if url.startswith(SINK + "/")] == [], f"{what}: fetched {fetched}"


def test_markup_in_a_saved_result_and_in_typed_text_is_shown_as_text(app, tmp_path):
    fetched: list[str] = []
    app.page.on("request", lambda request: fetched.append(request.url))
    attr = hostile_result()
    attr.meta["status"] = "done"  # a finished answer: the contrast accordion takes it
    saved = tmp_path / f"<{INJECTED}-tag id={INJECTED}-file>.json"  # the file's own name carries markup too
    saved.write_text(result_json(attr), encoding="utf-8")
    status = app.open_saved(saved)
    assert f'<img id="{INJECTED}-model-img"' in status and f"{INJECTED}-file" in status  # (Gradio drops its <>)
    assert "Click here to re-run the model" in status and "![" in status  # the markup, as text
    app.move_step_slider(-1)  # another step: the views drawn again from the stored result
    app.explain_span(True)
    app.set_units("word")
    app.shot("markup-saved-result")
    assert_nothing_drawn(app, fetched, "the saved result")

    app.explain_span(False)
    app.set_units("token")
    foreign = app.page.locator("input[type=checkbox][name^=method]:visible")  # the saved result's own method
    foreign.click()  # unticked: only registered methods can run
    app.set_methods(["atman"])  # contrastive
    app.page.get_by_role("button", name=re.compile(r"^Why this token and not another")).click()
    app.page.get_by_role("button", name=re.compile(r"^Method options")).click()
    boxes = app.page.locator("textarea:visible, input[type=text]:visible:not([role=combobox])")
    assert boxes.count() >= 3  # the prompt, the answer, the typed foil (and any text option)
    for i in range(boxes.count()):
        boxes.nth(i).fill(typed_markup(i))
        boxes.nth(i).blur()
    app.press("Explain against the foil")  # the typed foil: refused or explained, either way it is shown as text
    app.page.wait_for_function(
        "() => document.querySelector('[data-testid=toast-text]') || /^(Done|Stopped)/m.test(document.body.innerText)",
        timeout=120_000,
    )
    assert_nothing_drawn(app, fetched, "the typed foil")
    toasts = app.page.locator("[data-testid=toast-text]")
    assert all(
        INJECTED not in toasts.nth(i).inner_text() or "<img" in toasts.nth(i).inner_text()
        for i in range(toasts.count())
    )  # a toast that quotes the foil quotes it as text
    app.set_methods(["macs", "rollout"])
    app.set_max_new_tokens(8)
    app.press("Generate")  # the typed prompt and answer, teacher-forced: the answer tokens are the markup's pieces
    app.wait_done(180)
    app.shot("markup-typed")
    assert_nothing_drawn(app, fetched, "the typed prompt and answer")
    tokens = "".join(app.answer_tokens())
    assert any(typed_markup(i) in tokens for i in range(boxes.count()))  # the answer box's markup, token by token
    assert "&lt;" in app.heatmap_html()  # the prompt's too (its tokens split the ids)
