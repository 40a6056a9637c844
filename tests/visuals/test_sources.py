"""The Sources view (`visuals.sources`) on hand-built results: the ranked list with the whole-answer and per-step
scores, links to marked units in the text, and the note without Sources."""

from __future__ import annotations

import re

import numpy as np

from explainer.result.attribution import Attribution, MethodScores
from visuals.sources import NO_SOURCES, sources_html

TOKENS = ["<|im_start|>", "user", "\n", "Paris", " is", " big", ".", " Rome", " <old>", ".", "<|im_end|>"]


def result(with_sources: bool = True) -> Attribution:
    raw = np.zeros((2, len(TOKENS)), dtype=np.float32)  # (K, N): every token of a unit carries its score
    raw[:, 3:7] = [[1.5], [0.5]]  # "Paris is big." at steps 1 and 2
    raw[:, 7:10] = [[-0.2], [0.4]]  # " Rome <old>."
    listed = [{"text": "Paris is big.", "kind": "sentence", "start": 3, "stop": 7, "score": 1.0},
              {"text": "Rome <old>.", "kind": "sentence", "start": 7, "stop": 10, "score": 0.1}]  # fmt: skip
    scores = MethodScores.from_raw(raw, meta={"sources": listed} if with_sources else {})
    return Attribution(
        model="fake", prompt_token_ids=list(range(len(TOKENS))), prompt_tokens=TOKENS, generated_token_ids=[1, 2],
        generated_tokens=[" A", " B"], methods={"sources": scores}, user_positions=list(range(3, 10)),
    )  # fmt: skip


def test_the_ranked_sources_link_to_their_marked_place_in_the_text():
    page = sources_html(result(), step=0)
    rows = re.findall(r"<tr><td>(\d)</td><td>([^<]+)</td><td>([^<]+)</td><td><a href=\"#(xai-src-\d+)\">", page)
    assert rows == [("1", "+1.000", "+1.500", "xai-src-3"), ("2", "+0.100", "-0.200", "xai-src-7")]
    marks = re.findall(r'<mark id="(xai-src-\d+)" style="background:rgba\((\d+),', page)
    assert marks == [("xai-src-3", "26"), ("xai-src-7", "215")]  # green: supports; red: against, at step 1
    assert "Rome &lt;old&gt;." in page and "<old>" not in page  # escaped
    assert "im_start" not in page.split("xai-sources-text")[1]  # the user's text only
    assert "step 2 &#x27; B&#x27;" in sources_html(result(), step=None)  # the newest step by default


def test_a_note_without_sources():
    assert sources_html(None) == NO_SOURCES and sources_html(result(with_sources=False)) == NO_SOURCES


def test_the_note_says_what_hiding_meant():
    answer = result()
    answer.methods["sources"].meta["scope"] = "answer"
    assert "hidden from the answer&#x27;s own reading" in sources_html(answer)
    removed = result()
    removed.methods["sources"].meta["scope"] = "all"
    assert "removed from the context" in sources_html(removed)
    assert "removed from the context" in sources_html(result())  # results saved before the option: removal


def test_a_surrogate_s_step_column_is_the_unit_s_weight_its_tokens_share():
    fitted = result()
    meta = fitted.methods["sources"].meta
    meta.update({"fit": "surrogate", "ablations": 16, "checks": 4, "held_out_spearman": 0.75})
    fitted.methods["sources"].raw[:, 3:7] = [[0.25], [0.5]]  # weights 1.0 and 2.0, shared by 4 tokens
    page = sources_html(fitted, step=1)
    assert "<td>+2.000</td>" in page and 'title="+2.000 nats at this step"' in page
    assert "16 combinations of passages removed" in page and "on 4 more combinations, Spearman +0.75" in page
    assert "removed from the context" not in page
    meta.update({"checks": 0, "held_out_spearman": None, "cross_validated_spearman": 0.8125})  # the default: no extras
    page = sources_html(fitted, step=1)
    assert "Fit checked cross-validated over its combinations, Spearman +0.81." in page
    assert "more combinations" not in page
    meta.update({"checks": "<b>", "cross_validated_spearman": "<i>"})  # a saved result's junk: escaped, not a number
    page = sources_html(fitted, step=1)
    assert "<b>" not in page and "<i>" not in page and "Spearman n/a" in page
    assert "more combinations" not in page  # not a count: left out, as the LDS caption leaves it (visuals/lds.py)
    meta.update({"checks": True})  # a bool is not a count either
    assert "more combinations" not in sources_html(fitted, step=1)
    assert "one linear fit per answer token" in sources_html(fitted, step=1)
    meta.update({"regulariser": "saturating"})
    page = sources_html(fitted, step=1)
    assert "passages that say the same thing share their effect" in page and "one linear fit" not in page


def test_a_surrogate_s_note_names_its_design_and_warns_when_passages_outnumber_its_masks():
    few = result()
    few.methods["sources"].meta.update({"fit": "surrogate", "ablations": 16, "checks": 4, "units_scored": 6,
                                         "design": "folded Hadamard"})  # fmt: skip
    page = sources_html(few, step=0)
    assert "(folded Hadamard design)" in page and "barely estimated" not in page
    many = result()
    many.methods["sources"].meta.update({"fit": "surrogate", "ablations": 16, "checks": 4, "units_scored": 43,
                                          "design": "complementary pairs", "regulariser": "lasso"})  # fmt: skip
    page = sources_html(many, step=0)
    assert "The text has 43 passages, more than the combinations: the fit is sparse (ContextCite&#x27;s Lasso)" in page
    assert "barely estimated" not in page and "fit=leave_one_out" in page
    assert "Paris is big." in page and "Rome &lt;old&gt;." in page
    many.methods["sources"].meta["sources"][1]["score"] = 0.0  # the Lasso left it at 0: not listed, not marked
    page = sources_html(many, step=0)
    assert page.count("<tr><td>") == 1 and 'href="#xai-src-7"' not in page and 'id="xai-src-7"' not in page
    many.methods["sources"].meta["regulariser"] = "ridge"  # chosen by the visitor: most weights barely estimated
    page = sources_html(many, step=0)
    assert "more than the combinations: most passages&#x27; weights are barely estimated" in page
    assert page.count("<tr><td>") == 2  # a dense fit's 0 is an estimate like any other: listed
    assert "fit=leave_one_out" in page
    saved = result()  # a result saved before the design was recorded
    saved.methods["sources"].meta.update({"fit": "surrogate", "ablations": 16, "checks": 4})
    assert "combinations of passages removed, the answer" in sources_html(saved, step=0)
