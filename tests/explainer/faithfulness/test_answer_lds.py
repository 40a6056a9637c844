"""Each method's LDS on one answer from Sources' recorded ablations (`explainer/faithfulness/lds.py`), against a plain
loop: Spearman (scipy-free: ranks by hand) of the measured log-probabilities and the kept units' summed scores; the
bar chart and caption (`visuals/lds.py`) drawn from the report without a model."""

from __future__ import annotations

import numpy as np

from explainer.faithfulness import FaithfulnessReport
from explainer.faithfulness.lds import answer_lds
from explainer.result.attribution import Attribution, MethodScores
from visuals.lds import NO_SURROGATE, lds_caption, lds_figure

N, K = 12, 3
UNITS = [(2, 5), (5, 9), (9, 12)]  # three units; positions 0-1 belong to none


def _ranks(x: np.ndarray) -> np.ndarray:
    order = sorted(range(len(x)), key=lambda i: x[i])
    out = np.empty(len(x))
    i = 0
    while i < len(order):  # ties share their mean rank
        j = i
        while j + 1 < len(order) and x[order[j + 1]] == x[order[i]]:
            j += 1
        for m in range(i, j + 1):
            out[order[m]] = (i + j) / 2
        i = j + 1
    return out


def _spearman(a, b) -> float:
    return float(np.corrcoef(_ranks(np.asarray(a)), _ranks(np.asarray(b)))[0, 1])


def _attr(fit: str = "surrogate", with_sources: bool = True) -> Attribution:
    rng = np.random.default_rng(0)
    keep = np.concatenate([np.ones((1, 3), bool), rng.random((9, 3)) < 0.5])  # (R, U)
    log_p = rng.normal(size=(10, K))
    raw = {"macs": rng.random((K, N)), "random": rng.normal(size=(K, N))}
    methods = {m: MethodScores.from_raw(r) for m, r in raw.items()}
    if with_sources:
        meta = {"fit": fit, "held_out_spearman": 0.4, "cross_validated_spearman": 0.8, "checks": 3, "ablations": 6,
                "masks": {"units": [list(u) for u in UNITS], "keep": keep.astype(int).tolist(), "fitted": 7,
                          "log_p": log_p.tolist()}}  # fmt: skip
        methods["sources"] = MethodScores.from_raw(rng.normal(size=(K, N)), meta=meta)
    return Attribution(model="tiny", prompt_token_ids=list(range(N)), prompt_tokens=[f"t{i}" for i in range(N)],
                       generated_token_ids=[1, 2, 3], generated_tokens=["a", "b", "c"], methods=methods,
                       user_positions=list(range(N)))  # fmt: skip


def test_each_method_s_lds_equals_a_plain_loop_over_the_recorded_masks():
    attr = _attr()
    report = answer_lds(attr, ["macs", "random", "sources"])
    meta = attr.methods["sources"].meta["masks"]
    actual = [sum(row) for row in meta["log_p"]]
    for name in ("macs", "random"):
        raw = attr.methods[name].raw
        unit = [float(raw[:, a:b].sum()) for a, b in UNITS]
        predicted = [sum(unit[u] for u in range(3) if mask[u]) for mask in meta["keep"]]
        assert abs(report.lds[name] - _spearman(actual, predicted)) < 1e-9
        assert report.masks[name] == 10
    assert report.lds["sources"] == 0.8 and report.masks["sources"] == 7  # its own fit, cross-validated
    assert report.fit["held_out_spearman"] == 0.4 and report.units == 3


def test_no_surrogate_no_report_and_only_the_ticked_methods():
    assert answer_lds(_attr(with_sources=False), ["macs"]) is None
    assert answer_lds(_attr(fit="leave_one_out"), ["macs", "sources"]) is None
    assert list(answer_lds(_attr(), ["macs", "gone"]).lds) == ["macs"]


def test_the_view_draws_one_bar_per_method_and_says_how_it_was_measured():
    report = answer_lds(_attr(), ["macs", "random", "sources"])
    fig = lds_figure(report)
    assert [t.y[0] for t in fig.data] == ["macs", "random", "sources (own fit)"]
    assert [t.x[0] for t in fig.data] == [report.lds["macs"], report.lds["random"], 0.8]
    assert fig.data[2].marker.pattern.shape == "/" and fig.data[0].marker.pattern.shape == ""
    low, high = fig.layout.xaxis.range  # a value written outside a bar at -1 or 1 stays inside the axis
    assert low < -1 and high > 1 and list(fig.layout.xaxis.tickvals) == [-1, 0, 1]
    caption = lds_caption(report)
    assert "the full prompt and Sources' 9 ablations over 3 units" in caption
    assert "held out on 3 more masks +0.40" in caption
    assert lds_caption(None) == NO_SURROGATE
    report.fit.update(checks=0, held_out_spearman=None)  # no extra masks (the default): the cross-validated one only
    caption = lds_caption(report)
    assert "cross-validated +0.80 (each mask predicted by a fit without it). Few" in caption
    assert "held out" not in caption
    report.fit.update(checks="<b>4</b>", ablations="<i>", cross_validated_spearman="x")  # a saved result's junk
    caption = lds_caption(report)
    assert "<" not in caption and "(n/a ablations): cross-validated n/a" in caption
    report.lds["macs"] = None  # constant scores: listed, empty bar
    assert lds_figure(report).data[0].text[0] == "n/a"
    assert FaithfulnessReport().lds is None


def test_a_real_result_is_scored_on_the_ablations_its_sources_ran(tokenizer):
    from explainer import bundle_from_objects, explain

    from ...conftest import build_model

    bundle = bundle_from_objects(build_model("llama"), tokenizer, name="tiny-llama")
    prompt = "Paris is in France. Rome is in Italy. Berlin is in Germany. Where is Paris?"
    attr = explain(bundle, prompt, methods=["macs", "sources"], max_new_tokens=3,
                   method_options={"sources": {"ablations": 8}})  # fmt: skip
    report = answer_lds(attr, ["macs", "sources"])
    record = attr.methods["sources"].meta["masks"]
    actual = np.asarray(record["log_p"]).sum(axis=1)
    unit = [float(attr.methods["macs"].raw[:, a:b].sum()) for a, b in record["units"]]
    predicted = [sum(u for u, kept in zip(unit, mask) if kept) for mask in record["keep"]]
    assert report.masks["macs"] == 1 + 8 and abs(report.lds["macs"] - _spearman(actual, predicted)) < 1e-9
    assert report.lds["sources"] == attr.methods["sources"].meta["cross_validated_spearman"]
