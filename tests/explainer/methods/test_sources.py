"""Sources (`explainer/methods/sources.py`) against a plain reference loop: one full forward per hidden unit, eager
attention edited in a loop (tests/reference.py), no cache, no batching; the hierarchy (paragraphs, then the
sentences of the strongest) and the units themselves; options; the JSON meta."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from explainer import bundle_from_objects, explain, get_method
from explainer.capture import registered_names
from explainer.errors import InputError
from explainer.methods import GenerationRun
from explainer.methods.sources import units
from explainer.result.segments import paragraph_groups

from ...conftest import BUILDERS, build_model
from ...reference import suppressed_eager_attention
from .test_atman import greedy_sequences

PROMPT = (
    "Paris is the capital of France. The quick brown fox jumps.\n\n"
    "Berlin is the capital of Germany. Numbers 0123456789.\n\n"
    "Question: What is the capital of France?"
)
K = 4


def _reference(model, ids: torch.Tensor, n: int, groups, factor: float, scope: str = "all") -> np.ndarray:
    """(K, U): CE_k(hide unit u) - CE_k(original), one full eager forward per unit; the unit hidden from every query
    (scope "all") or from the queries at positions N - 1 and later only, those that predict the answer ("answer")."""
    t = ids.shape[1]
    targets = ids[0, n:].tolist()

    def cross_entropy(hidden: dict[int, float]) -> list[float]:
        factors.clear()
        factors.update(hidden)
        logp = torch.log_softmax(model(input_ids=ids).logits[0].double(), dim=-1)  # (T, V)
        return [-float(logp[n - 1 + k, targets[k]]) for k in range(t - n)]

    out = np.zeros((t - n, len(groups)))
    from_query = n - 1 if scope == "answer" else 0
    with torch.no_grad(), suppressed_eager_attention(model.config, from_query) as factors:
        base = np.array(cross_entropy({}))
        for u, group in enumerate(groups):
            out[:, u] = np.array(cross_entropy(dict.fromkeys(range(group.start, group.stop), factor))) - base
    return out


@pytest.fixture(scope="module")
def run(tokenizer):
    """Per tiny model: a generation run over the prompt (no chat template) and K greedy tokens."""
    out = {}
    for kind, (model, ids, n) in greedy_sequences(tokenizer, PROMPT, K).items():
        tokens = bundle_from_objects(model, tokenizer, name=kind).readable(ids[0, :n].tolist())
        out[kind] = GenerationRun(model=model, input_ids=ids, num_prompt_tokens=n, prompt_tokens=tokens)
    return out


@pytest.mark.parametrize("kind", list(BUILDERS))
@pytest.mark.parametrize("factor", [0.0, 0.1])
@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("scope", ["answer", "all"])
def test_flat_sentence_scores_equal_one_full_forward_per_hidden_sentence(run, kind, factor, fast, scope):
    r = run[kind]
    groups = units(r.prompt_tokens, list(range(r.num_prompt_tokens)), "sentence")
    assert [g.text.strip() for g in groups] == [
        "Paris is the capital of France.", "The quick brown fox jumps.", "Berlin is the capital of Germany.",
        "Numbers 0123456789.", "Question: What is the capital of France?",
    ]  # fmt: skip
    method = get_method("sources", fit="leave_one_out", depth=0, suppression_factor=factor, fast=fast, batch_size=2,
                        scope=scope)  # fmt: skip
    raw = method.explain(r)  # (K, N)
    expected = _reference(r.model, r.input_ids, r.num_prompt_tokens, groups, factor, scope)  # (K, U)
    for u, group in enumerate(groups):
        for p in range(group.start, group.stop):  # every token of the unit carries the unit's score
            np.testing.assert_allclose(raw[:, p], expected[:, u], atol=1e-4, rtol=0)
    covered = sorted(p for g in groups for p in range(g.start, g.stop))
    assert covered == list(range(r.num_prompt_tokens))  # sentences carry their trailing spaces: every token once
    assert registered_names() == [] and r.model.config._attn_implementation == "sdpa"  # nothing left behind


@pytest.mark.parametrize("scope", ["answer", "all"])
def test_paragraphs_first_then_the_sentences_of_the_strongest(run, scope):
    r = run["llama"]
    positions = list(range(r.num_prompt_tokens))
    paragraphs = units(r.prompt_tokens, positions, "paragraph")
    sentences = units(r.prompt_tokens, positions, "sentence")
    per_paragraph = [len([s for s in sentences if p.start <= s.start < p.stop]) for p in paragraphs]
    assert per_paragraph == [2, 2, 1]
    method = get_method("sources", fit="leave_one_out", depth=1, keep=1, suppression_factor=0.1, scope=scope)
    raw = method.explain(r)
    para = _reference(r.model, r.input_ids, r.num_prompt_tokens, paragraphs, 0.1, scope)  # (K, 3)
    flat = _reference(r.model, r.input_ids, r.num_prompt_tokens, sentences, 0.1, scope)  # (K, 5)
    strongest = int(np.argmax(para.mean(axis=0)))
    for u, p in enumerate(paragraphs):
        inside = [s for s in range(len(sentences)) if p.start <= sentences[s].start < p.stop]
        for s in inside:
            want = flat[:, s] if u == strongest else para[:, u]  # refined, or the paragraph's own score
            np.testing.assert_allclose(raw[:, sentences[s].start], want, atol=1e-4, rtol=0)
    meta = method.meta()
    assert meta["units_scored"] == 3 + len([s for s in sentences if paragraphs[strongest].start <= s.start
                                              < paragraphs[strongest].stop])  # fmt: skip
    listed = [(s["start"], s["stop"]) for s in meta["sources"]]
    assert (paragraphs[strongest].start, paragraphs[strongest].stop) not in listed  # its sentences replace it
    scores = [s["score"] for s in meta["sources"]]
    assert scores == sorted(scores, reverse=True)
    assert meta["forward_positions"] < meta["leave_one_sentence_out_positions"] < meta["contextcite_positions"]
    json.dumps(meta)


@pytest.mark.parametrize("kind", list(BUILDERS))
def test_depth_0_paragraphs_are_the_flat_paragraph_scores_and_the_coarse_level_of_the_hierarchy(run, kind):
    r = run[kind]
    paragraphs = units(r.prompt_tokens, list(range(r.num_prompt_tokens)), "paragraph")
    flat = get_method("sources", fit="leave_one_out", unit="paragraph", depth=0, batch_size=2, scope="all")
    raw = flat.explain(r)  # (K, N)
    expected = _reference(r.model, r.input_ids, r.num_prompt_tokens, paragraphs, 0.0)  # (K, 3)
    for u, group in enumerate(paragraphs):
        for p in range(group.start, group.stop):  # every token of the paragraph carries its score
            np.testing.assert_allclose(raw[:, p], expected[:, u], atol=1e-4, rtol=0)
    assert flat.meta()["units_scored"] == len(paragraphs)
    deep = get_method("sources", fit="leave_one_out", unit="sentence", depth=1, keep=1, batch_size=2, scope="all")
    deep = deep.explain(r)
    strongest = int(np.argmax(expected.mean(axis=0)))
    for u, group in enumerate(paragraphs):  # the paragraphs not refined keep exactly their flat score
        if u != strongest:
            np.testing.assert_array_equal(deep[:, group.start : group.stop], raw[:, group.start : group.stop])


def test_paragraphs_end_at_blank_lines_and_special_tokens():
    tokens = ["<|im_start|>", "user", "\n", "A", " b", ".", " C", ".\n\n", "D", " e", ".", "\n", "F", ".", "<|im_end|>"]
    groups = paragraph_groups(tokens, list(range(len(tokens))))
    texts = [(g.text, g.kind) for g in groups]
    assert ("A b. C.\n\n", "paragraph") in texts and ("D e.\nF.", "paragraph") in texts  # one newline: same paragraph
    assert texts[0] == ("<|im_start|>", "special") and texts[-1] == ("<|im_end|>", "special")


def test_options_are_checked_and_the_tokens_are_needed(run):
    for bad in (
        {"unit": "chapter"},
        {"unit": "sentence", "depth": 2},
        {"keep": 0},
        {"suppression_factor": 1.0},
        {"scope": "prompt"},
    ):
        with pytest.raises(InputError):
            get_method("sources", **bad)
    r = run["llama"]
    with pytest.raises(InputError, match="prompt's tokens"):
        get_method("sources", fit="leave_one_out").explain(
            GenerationRun(model=r.model, input_ids=r.input_ids, num_prompt_tokens=5)
        )


def test_sources_through_explain_over_the_users_text_only(tokenizer):
    bundle = bundle_from_objects(build_model("qwen2"), tokenizer, name="tiny-qwen2")
    options = {"sources": {"fit": "leave_one_out", "unit": "sentence", "depth": 1}}
    attr = explain(bundle, PROMPT, methods=["sources", "macs"], max_new_tokens=3, method_options=options)
    raw, meta = attr.methods["sources"].raw, attr.methods["sources"].meta
    template = sorted(set(range(attr.num_prompt_tokens)) - set(attr.user_positions))
    assert np.all(raw[:, template] == 0)  # the chat template is not a source
    assert meta["sources"] and all(s["start"] >= min(attr.user_positions) for s in meta["sources"])
    again = json.loads(json.dumps(attr.to_dict()))["methods"]["sources"]["meta"]["sources"]
    assert again == meta["sources"]


def test_the_command_prints_the_top_sources(tiny_model_dir, capsys):
    from explainer.cli import main

    prompt = "Paris is the capital of France.\n\nBerlin is big.\n\nWhat is the capital of France?"
    code = main(["explain", "--model", str(tiny_model_dir), "--prompt", prompt, "--methods",
                 "sources:fit=leave_one_out:depth=0",
                 "--max-new-tokens", "2"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0 and "sources over the answer" in out and "leave-one-sentence-out without a cache" in out
    assert "loss increase when hidden from the answer" in out  # the default scope
    assert "'Paris is the capital of France.'" in out


def test_the_passes_keep_no_autograd_graph(run):
    """Without inference mode every pass kept its graph: 10 GB at 512 tokens on the embedded model."""
    r = run["llama"]
    seen = []
    handle = r.model.register_forward_pre_hook(lambda module, args: seen.append(torch.is_inference_mode_enabled()))
    try:
        get_method("sources", fit="leave_one_out", depth=0).explain(r)
    finally:
        handle.remove()
    assert seen and all(seen)


def test_answer_scope_recomputes_only_the_answer_positions_and_differs_from_removal(run):
    """Scope "answer" reuses the whole prompt's cache (each unit costs the K positions that predict the answer) and
    measures something else than removing the unit from the context: the two references differ on the tiny model,
    so the reference test above would fail if the bias reached the prompt's own queries."""
    r = run["llama"]
    n, t = r.num_prompt_tokens, r.input_ids.shape[1]
    groups = units(r.prompt_tokens, list(range(n)), "sentence")
    answer = get_method("sources", fit="leave_one_out", depth=0, scope="answer", batch_size=2)
    answer.explain(r)
    packs = -(-len(groups) // 2)  # passes of 2 units and the baseline segment each, after the prompt's N - 1
    assert answer.meta()["forward_positions"] == (n - 1) + (len(groups) + packs) * (t - n)
    everywhere = get_method("sources", fit="leave_one_out", depth=0, scope="all")
    everywhere.explain(r)
    assert everywhere.meta()["forward_positions"] == (t - 1) + sum(t - 1 - g.start for g in groups)
    direct = _reference(r.model, r.input_ids, n, groups, 0.0, "answer")
    removed = _reference(r.model, r.input_ids, n, groups, 0.0, "all")
    assert np.abs(direct - removed).max() > 1e-2


def test_answer_scope_counts_the_positions_its_forwards_computed(run):
    """meta.forward_positions of scope "answer" is what the model's forwards ran (batch x length, counted by a hook),
    with both levels of the hierarchy sharing one pass over the prompt."""
    r = run["qwen2"]
    seen = []
    handle = r.model.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(kwargs["input_ids"].numel()), with_kwargs=True
    )
    try:
        method = get_method("sources", fit="leave_one_out", depth=1, keep=1, scope="answer", batch_size=2)
        method.explain(r)
    finally:
        handle.remove()
    assert sum(seen) == method.meta()["forward_positions"]
    assert seen[0] == r.num_prompt_tokens - 1 and len(seen) > 2  # the prompt once, then the packed passes
