"""Links that reopen a saved example at a step (`ui/tabs/share.py`): the query parameters the first page view reads, and
the link line, without a browser."""

from __future__ import annotations

import gradio as gr

from explainer.result.attribution import Attribution
from ui.tabs import examples, share, text_tab

SHOWN = examples.examples()


def request(**query: str) -> gr.Request:
    return gr.Request(query_params=query)


def test_an_address_names_an_example_by_its_saved_files_stem_and_a_step():
    ids = [share.example_id(e) for e in SHOWN]
    assert ids == ["reading-comprehension-qa", "general-question"]
    assert share.linked({"result": "general-question", "step": "3"}) == (1, 3)
    assert share.linked({"result": "general-question"}) == (1, None)
    assert share.linked({"result": "general-question", "step": "x"}) == (1, None)
    assert share.linked({"result": "https://example.com/r.json", "step": "3"}) == (None, None)  # never fetched
    assert share.linked({}) == (None, None)



def test_a_link_reopens_the_example_at_its_step(no_model):
    view = share.first_view(["macs"], False, False, "token", request(result="general-question", step="5"))
    attr = examples.saved_result(SHOWN[1])
    assert view.prompt == SHOWN[1]["prompt"] and view.step["value"] == 5 and view.step["interactive"]
    drawn = text_tab.render(attr, ["macs"], 5, False)
    assert (view.answer, view.heatmap, view.table) == (drawn.answer, drawn.heatmap, drawn.table)
    past = share.first_view(["macs"], False, False, "token", request(result="general-question", step="999"))
    assert past.step["value"] == attr.num_steps  # clamped to the answer
    plain = share.first_view(["macs"], False, False, "token", request(result="unknown", step="2"))
    assert plain.prompt == SHOWN[0]["prompt"]  # an unknown id: the first example, as without a link


def test_the_link_line_names_the_example_and_step_shown_and_nothing_else():
    attr = examples.saved_result(SHOWN[0])
    line = share.link_line(attr, 4).link
    assert "[?result=reading-comprehension-qa&step=4](?result=reading-comprehension-qa&step=4)" in line
    assert share.linked({"result": "reading-comprehension-qa", "step": "4"}) == (0, 4)  # the link reads back
    other = Attribution(model="m", prompt_token_ids=[1], prompt_tokens=["a"], generated_token_ids=[2],
                        generated_tokens=["b"])  # fmt: skip
    assert share.link_line(other, 1).link == "" and share.link_line(None, 1).link == ""


def test_the_first_view_and_a_link_get_their_downloads(no_model):
    import app

    fns = {fn.api_name: fn for fn in app.demo.fns.values()}
    files, view = fns["export_files_after_first_view"], fns["export_view_after_first_view"]
    assert files.trigger_after == fns["first_view"]._id and view.trigger_after == files._id
    labels = {getattr(o, "label", None) or getattr(o, "value", None) for o in files.outputs}
    assert {"Download JSON", "Download HTML report", "Download PNG of this view"} <= labels
    shown = share.first_view(["macs"], False, False, "token", request(result="general-question", step="5"))
    got = text_tab.export_files(shown.result, ["macs"], False)
    assert got.json_file["interactive"] and got.report_file["interactive"]
    png = text_tab.export_view(shown.result, ["macs"], shown.step["value"], False)
    assert png.png_file["interactive"] and png.png_file["value"].endswith(".png")

