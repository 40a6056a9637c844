"""The text tab's "Which answer tokens used this?" accordion in a real browser: words picked from the prompt give one
bar per answer token and method. (The image tab's region picker is in test_image_tab.py.)"""

from __future__ import annotations

PROMPT = "What is the capital of France?"


def test_words_of_the_prompt_chart_which_answer_tokens_used_them(app):
    app.generate(PROMPT, max_new_tokens=4, methods=["macs", "rollout"])
    steps = len(app.answer_tokens())
    app.open_accordion("Which answer tokens used this?")
    app.choose_words(["4: capital", "6: France"])
    bars = app.region_bars("text-region")
    assert list(bars) == ["macs", "rollout"] and all(len(values) == steps for values in bars.values())
    assert all(v is not None and -5 < v < 5 for values in bars.values() for v in values)  # mean z-scores
    app.page.locator("#text-region").scroll_into_view_if_needed()
    app.shot("text-region-words")
    figure = "#text-region .js-plotly-plot"
    before = app.page.locator(figure).evaluate("el => JSON.stringify(Array.from(el._fullData[0].y))")
    app.choose_words(["2: is"])  # a third word changes the chart
    app.page.wait_for_function(
        "([s, before]) => JSON.stringify(Array.from(document.querySelector(s)._fullData[0].y)) !== before",
        arg=[figure, before],
    )
    app.shot("text-region-three-words")
