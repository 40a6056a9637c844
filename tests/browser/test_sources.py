"""The Sources accordion in a real browser, with the embedded SmolLM2-135M-Instruct: a prompt of three short
paragraphs and a question, Sources ticked; the ranked passages appear, and a click shows one in the text; the
faithfulness panel then draws each ticked method's LDS on this answer from Sources' ablations."""

from __future__ import annotations

import re

PROMPT = (
    "Marta Lindqvist founded the bakery in 1987. It is on Harbour Street.\n\n"
    "The weather in the town is mild. It rains in autumn.\n\n"
    "The bakery sells rye bread and cinnamon buns.\n\n"
    "Who founded the bakery?"
)


def test_sources_rank_the_passages_and_a_click_shows_one_in_the_text(app):
    app.generate(PROMPT, max_new_tokens=6, methods=["macs", "sources"], wait=True)
    app.open_accordion("Sources: which passages support the answer")
    rows = app.page.locator("#sources table.xai-sources tbody tr")
    rows.first.wait_for()
    assert rows.count() >= 3
    scores = [float(s) for s in rows.locator("td:nth-child(2)").all_inner_texts()]
    assert scores == sorted(scores, reverse=True)  # ranked over the whole answer
    note = app.page.locator("#sources .xai-sources-note").inner_text()
    assert "combinations of passages removed (" in note and " design)" in note and "barely estimated" not in note
    link = rows.first.locator("a")
    target = link.get_attribute("href")
    assert re.fullmatch(r"#xai-src-\d+", target)
    app.page.locator("#sources .xai-sources-text").evaluate("el => el.scrollTop = el.scrollHeight")
    link.click()
    mark = app.page.locator(target)
    mark.wait_for()
    assert mark.inner_text().strip() in link.inner_text() or link.inner_text().startswith(mark.inner_text()[:40])
    box = app.page.locator("#sources .xai-sources-text").bounding_box()
    where = mark.bounding_box()
    assert box["y"] - 1 <= where["y"] <= box["y"] + box["height"]  # scrolled into the text's view
    app.page.locator("#sources").scroll_into_view_if_needed()
    app.shot("sources")


def test_the_faithfulness_panel_draws_each_method_s_lds_on_this_answer(app):
    app.generate(PROMPT, max_new_tokens=6, methods=["macs", "sources"], wait=True)
    app.measure_faithfulness(soft="skip π-Soft")
    figure = app.page.locator(".js-plotly-plot", has_text="LDS (Spearman)").first
    figure.wait_for()
    bars = figure.locator(".ytick text").evaluate_all("els => els.map(e => e.textContent)")  # SVG: no innerText
    assert sorted(bars) == ["macs", "sources (own fit)"], bars
    note = app.page.get_by_text(re.compile(r"^LDS on this answer: each method")).first.inner_text()
    assert re.search(r"the full prompt and Sources' \d+ ablations over \d+ units", note)
    assert re.search(r"cross-validated [+-]\d\.\d\d \(each mask predicted by a fit without it\)\.", note), note
    figure.scroll_into_view_if_needed()
    app.shot("faithfulness-lds")


def test_a_text_with_more_passages_than_ablations_is_told_so(app):
    """20 one-line facts and a question: more sentences than Sources' 16 ablations, so the note says the fit is
    sparse and how to weigh every passage."""
    facts = " ".join(f"Box {i} holds {i * 3} marbles." for i in range(1, 21))
    app.generate(facts + "\n\nHow many marbles does box 7 hold?", max_new_tokens=4, methods=["sources"], wait=True)
    app.open_accordion("Sources: which passages support the answer")
    note = app.page.locator("#sources .xai-sources-note")
    note.wait_for()
    text = note.inner_text()
    assert "(sparse design)" in text and "more than the combinations: the fit is sparse" in text, text
    assert "fit=leave_one_out" in text
    note.scroll_into_view_if_needed()
    app.shot("sources-many-passages")
