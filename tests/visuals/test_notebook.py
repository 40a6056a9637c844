"""A result in a notebook (`Attribution._repr_html_`): the HTML report with its step slider, framed so that its ids,
styles and script stay its own. The slider moving inside the frame is checked in `tests/browser/test_notebook.py`."""

from __future__ import annotations

import html
import re

import explainer  # noqa: F401 - `import explainer` sets the notebook view (explainer/__init__.py)
from explainer.result.attribution import Attribution, set_notebook_view
from visuals.report import notebook_html, report_html

from .test_export import HOSTILE, hostile_attr


def test_a_result_shows_itself_in_a_notebook_as_its_report_with_the_step_slider():
    attr = hostile_attr()
    shown = attr._repr_html_()
    assert shown == notebook_html(attr)
    frame = re.fullmatch(r'<iframe class="xai-notebook" title="([^"]*)" sandbox="allow-scripts" style="[^"]*" '
                         r'srcdoc="([^"]*)"></iframe>', shown)  # fmt: skip
    assert frame, shown[:300]  # one element: the report is its srcdoc, escaped (no quote closes it early)
    page = html.unescape(frame.group(2))
    assert page == report_html(attr)  # every method, the last step first, as the report file
    assert 'type="range" id="xai-step"' in page and 'id="xai-data"' in page and "<script>" in page
    outside = shown.replace(frame.group(2), "")
    for token in HOSTILE:  # nothing a token holds reaches the notebook's own page
        if any(c in token for c in "<>&\""):
            assert token not in outside


def test_without_a_view_set_a_result_falls_back_to_its_repr():
    attr = Attribution(model="m", prompt_token_ids=[1], prompt_tokens=["a"])
    previous = set_notebook_view(None)
    try:
        assert attr._repr_html_() is None  # Jupyter then shows the plain repr
    finally:
        set_notebook_view(previous)
    assert attr._repr_html_() == notebook_html(attr)  # a result without steps shows its report too
