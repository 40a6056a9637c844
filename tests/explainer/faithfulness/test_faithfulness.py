"""Removal by attention masking, MIF/LIF curves and pi-Soft curves on tiny models."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from explainer import bundle_from_objects, explain
from explainer.capture import registered_names
from explainer.errors import InputError
from explainer.faithfulness import (
    FaithfulnessRequest,
    RemovalConfig,
    SoftConfig,
    fixed_routing,
    measure_faithfulness,
    removal_curves,
    removal_orderings,
    removal_runs,
    soft_curves,
)

from ...conftest import build_model
from ...reference import removal_reference

PROMPT = "Question: What is the capital of France? Context: France is a country in Europe."


@pytest.fixture(scope="module")
def bundle(tokenizer):
    return bundle_from_objects(build_model("llama"), tokenizer, name="tiny-llama")


@pytest.fixture(scope="module")
def attr(bundle):
    return explain(bundle, PROMPT, methods=["macs", "rollout", "random"], max_new_tokens=6)


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen2_sliding"])
@pytest.mark.parametrize("answer", ["greedy", "arbitrary"])
def test_removal_runs_equal_a_plain_loop(kind, answer):
    """The batched, prefix-reusing, departure-decoding path equals one plain uncached run per removed set."""
    model = build_model(kind)
    prompt = torch.tensor([5, 17, 40, 41, 42, 60, 61, 70, 71, 72, 90, 91])  # (N,)
    n = prompt.numel()
    eos = {7}
    full = torch.ones(n, dtype=torch.bool)
    if answer == "greedy":  # the unperturbed regeneration follows it to the end, then goes on (no EOS in it)
        gen = torch.tensor(removal_reference(model, prompt, torch.tensor([1]), full, 5, set())[2][:5])
    else:  # every run departs at once
        gen = torch.tensor([80, 81, 82, 83, 84])
    removed_sets = [[], [0], [3], [2, 7], [n - 1], [1, 4, 6, 8, 10], list(range(2, n))]
    keep = torch.ones(len(removed_sets), n, dtype=torch.bool)
    for row, removed in enumerate(removed_sets):
        keep[row, removed] = False
    logit, ppl, regenerated, _ = removal_runs(model, prompt, gen, keep, 9, eos, batch_size=3, decode_batch_size=4)
    for row in range(len(removed_sets)):
        ref_logit, ref_ppl, ref_tokens = removal_reference(model, prompt, gen, keep[row], 9, eos)
        assert regenerated[row] == ref_tokens, removed_sets[row]
        assert logit[row] == pytest.approx(ref_logit, rel=1e-4, abs=1e-4)
        assert ppl[row] == pytest.approx(ref_ppl, rel=1e-4)
    if answer == "greedy":
        assert regenerated[0][:5] == gen.tolist() and len(regenerated[0]) == 9  # went on after the answer


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_masked_token_is_invisible(kind):
    model = build_model(kind)
    prompt = torch.tensor([5, 17, 40, 41, 42, 60, 61, 70])  # (N,)
    gen = torch.tensor([80, 81, 82])  # (K,)
    target = 3
    changed = prompt.clone()
    changed[target] = 99
    keep = torch.ones(2, prompt.numel(), dtype=torch.bool)
    keep[1, target] = False  # row 0: unmasked, row 1: the target masked
    a = removal_runs(model, prompt, gen, keep, 5, set())
    b = removal_runs(model, changed, gen, keep, 5, set())
    assert not np.isclose(a[0][0], b[0][0], atol=1e-4)  # unmasked: the token's content matters
    np.testing.assert_allclose(a[0][1], b[0][1], rtol=1e-5)  # masked: it is invisible
    np.testing.assert_allclose(a[1][1], b[1][1], rtol=1e-5)
    assert a[2][1] == b[2][1]  # so is the greedy regeneration


def test_masking_keeps_positions_of_other_tokens(llama):
    """An unmasked run equals the plain model call: explicit positions do not shift with the mask."""
    prompt = torch.tensor([5, 17, 40, 41, 42, 60])
    gen = torch.tensor([80, 81])
    keep = torch.ones(1, 6, dtype=torch.bool)
    logit = removal_runs(llama, prompt, gen, keep, 2, set())[0]
    with torch.no_grad():
        ref = llama(input_ids=torch.cat([prompt, gen])[None]).logits[0]
    expected = np.mean([float(ref[5, 80]), float(ref[6, 81])])
    assert logit[0] == pytest.approx(expected, rel=1e-4)


def test_orderings(attr):
    pos = np.asarray(attr.user_positions)
    o = removal_orderings(attr, "macs", pos)
    assert sorted(o["mif"].tolist()) == sorted(pos.tolist()) == sorted(o["lif"].tolist())
    r1, r2 = removal_orderings(attr, "random", pos, seed=3).values()
    assert not np.array_equal(r1, r2)  # two independent orderings
    np.testing.assert_array_equal(r1, removal_orderings(attr, "random", pos, seed=3)["mif"])  # seeded


def test_removal_curves_end_to_end(bundle, attr):
    report = removal_curves(bundle, attr, ["macs", "rollout"], config=RemovalConfig(max_new_tokens=4))
    assert set(report.curves) == {"macs", "rollout", "random"}
    for m, per_metric in report.curves.items():
        for metric, curves in per_metric.items():
            for name in ("mif", "lif"):
                assert len(curves[name]) == len(report.fractions)
                assert curves[name][0] == pytest.approx(1.0)  # c(0) = 1
            auc = report.auc[m][metric]
            assert auc["srg"] == pytest.approx(auc["lif"] - auc["mif"])
    assert registered_names() == [] and bundle.model.config._attn_implementation == "sdpa"


def test_removal_rejects_bad_input(bundle, attr):
    with pytest.raises(InputError, match="no scores"):
        removal_curves(bundle, attr, ["atman"])
    with pytest.raises(InputError, match="inside the prompt"):
        removal_curves(bundle, attr, ["macs"], positions=[10_000])
    with pytest.raises(InputError, match="pi-Soft needs a method with scores"):
        soft_curves(bundle, attr, ["atman"])


def test_soft_curves_end_to_end(bundle, attr):
    cfg = SoftConfig(samples=3, pis=(0.1, 0.5, 0.9), step_stride=5)
    report = soft_curves(bundle, attr, ["macs", "random"], config=cfg)
    assert report.steps == list(range(0, attr.num_steps, 5))
    for m in ("macs", "random"):
        assert len(report.ns[m]) == len(report.nc[m]) == 3
        assert all(0.0 <= v <= 1.0 for v in report.ns[m])
        assert all(0.0 <= v <= 3.0 for v in report.nc[m])  # NC may exceed 1 (zero baseline moves less)
        assert 0.0 <= report.auc_ns[m] <= 0.8
    # keeping more tokens (pi up) brings the prediction back: NS rises with pi, NC falls with pi
    assert report.ns["macs"][-1] > report.ns["macs"][0]
    again = soft_curves(bundle, attr, ["macs", "random"], config=cfg)
    assert again.ns == report.ns  # seeded


@pytest.mark.parametrize("kind", ["llama", "qwen2_sliding"])
def test_fixed_routing_reproduces_the_unperturbed_pass(kind):
    from explainer.faithfulness.soft import _recording

    llama = build_model(kind)
    ids = torch.tensor([[5, 17, 40, 41, 42, 60, 61, 62, 63]])
    probs: dict[int, torch.Tensor] = {}
    with torch.no_grad():
        with _recording(llama, probs):
            ref = llama(input_ids=ids).logits
        with fixed_routing(llama, probs):
            out = llama(input_ids=ids).logits
            changed = llama(input_ids=torch.tensor([[5, 17, 99, 41, 42, 60, 61, 62, 63]])).logits
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(changed[0, -1], ref[0, -1], atol=1e-4)  # content still flows through the values
    assert llama.config._attn_implementation == "sdpa"
    assert not [n for n in ALL_ATTENTION_FUNCTIONS.keys() if n.startswith("explainer_")]


def test_soft_fixed_routing_runs(bundle, attr):
    cfg = SoftConfig(samples=2, pis=(0.2, 0.8), step_stride=10, routing="fixed")
    report = soft_curves(bundle, attr, ["macs"], config=cfg)
    assert all(np.isfinite(report.ns["macs"])) and bundle.model.config._attn_implementation == "sdpa"


def test_measure_faithfulness_reports_progress(bundle, attr):
    seen = []
    soft = SoftConfig(samples=2, pis=(0.5,), step_stride=10)
    request = FaithfulnessRequest(methods=["macs"], removal=RemovalConfig(max_new_tokens=2), soft=soft)
    report = measure_faithfulness(bundle, attr, request, progress=lambda f, msg: seen.append(f))
    assert report.removal is not None and report.soft is not None
    assert seen and seen == sorted(seen) and seen[-1] == pytest.approx(1.0)


def test_curve_figures_colour_per_method_and_dashed_random(bundle, attr):
    from visuals.curves import faithfulness_rows, removal_figure, soft_figure

    request = FaithfulnessRequest(
        methods=["macs", "rollout"], removal=RemovalConfig(max_new_tokens=2),
        soft=SoftConfig(samples=2, pis=(0.3, 0.7), step_stride=10),
    )  # fmt: skip
    report = measure_faithfulness(bundle, attr, request)
    fig = removal_figure(report.removal, "ppl")
    assert len(fig.data) == 2 * 3  # MIF and LIF panels, three methods
    dashes = {t.legendgroup: t.line.dash for t in fig.data}
    assert dashes == {"macs": "solid", "rollout": "solid", "random": "dash"}
    assert len({t.line.color for t in fig.data}) == 3
    assert len(soft_figure(report.soft).data) == 2 * 2
    rows = faithfulness_rows(report)
    assert [r[0] for r in rows] == ["macs", "rollout", "random"]
    assert rows[2][5] is None and rows[0][5] is not None  # no pi-Soft for the random orderings


@pytest.mark.parametrize("kind", ["llama", "qwen2_sliding"])
def test_shared_prefix_gives_the_same_distribution(kind):
    from transformers import DynamicCache

    from explainer.faithfulness.soft import _next_token_probs

    model = build_model(kind)
    ids = torch.tensor([[5, 17, 40, 41, 42, 60, 61, 62, 63, 64]])
    with torch.no_grad():
        emb = model.get_input_embeddings()(ids).expand(3, -1, -1).clone()  # (3, T, D)
        emb[1, 6] *= 0.0
        emb[2, 8] *= 0.5
        prefix = DynamicCache(config=model.config)
        model(inputs_embeds=emb[:1, :5], position_ids=torch.arange(5)[None], past_key_values=prefix, use_cache=True)
        shared = _next_token_probs(model, emb, prefix)
        assert prefix.get_seq_length() == 5  # the prefix cache is left as it was
        torch.testing.assert_close(shared, _next_token_probs(model, emb), rtol=1e-5, atol=1e-7)
