"""Explaining a given answer (teacher forcing) and the step scores (probability and entropy of every answer token).

A forced answer runs the same forward passes as the generation that produced it, so every registered method must
give identical maps; step scores are checked against a plain forward of the full sequence with softmax and entropy
computed by hand.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from explainer import InputError, bundle_from_objects, decode_choice, explain, generate_steps, stream_explain
from explainer.capture import registered_names
from explainer.decoding import DecodeJob
from explainer.faithfulness import QUICK_SOFT, FaithfulnessRequest, measure_faithfulness
from explainer.methods import METHODS, available_methods, get_method
from explainer.models.answer import ANSWER_BOUNDARY_TOKENS, MAX_NEW_TOKENS_LIMIT, answer_budget, answer_token_ids
from explainer.models.vision import encode_image_prompt, full_sequence_inputs
from explainer.request import ExplainRequest, fit_answer
from explainer.result.attribution import Attribution

from ..conftest import BUILDERS, CHAT_TEMPLATE, CORPUS, VOCAB, build_model, eager_attentions
from ..reference import reference_macs
from ..vl_tiny import build_vl_model, make_vl_tokenizer, vl_bundle

PROMPT = "What is the capital of France?"
OPTIONS = {"sources": {"unit": "word"}}  # one sentence: Sources' surrogate fits over its words
ANSWER = "Paris is the capital of France."  # not what the random tiny models generate
ALL = available_methods()
IMAGE_METHODS = [m for m, cls in METHODS.items() if cls.explains_images]


def _bundle(tokenizer, kind: str = "llama"):
    return bundle_from_objects(build_model(kind), tokenizer, name=f"tiny-{kind}")


def _in_context_ids(tokenizer, prompt_text: str, n: int, answer: str) -> list[int]:
    """The answer's ids when prompt text and answer are tokenised together (the prompt's n ids unchanged)."""
    ids = tokenizer(prompt_text + answer, add_special_tokens=False)["input_ids"]
    return list(ids[n:])


def _assert_same_maps(a: Attribution, b: Attribution, methods) -> None:
    assert a.generated_token_ids == b.generated_token_ids
    for m in methods:
        np.testing.assert_array_equal(a.methods[m].raw, b.methods[m].raw, err_msg=m)
        np.testing.assert_array_equal(a.methods[m].z, b.methods[m].z, err_msg=m)


def _plain_step_scores(model, attr: Attribution, extra_inputs=None) -> tuple[list[float], list[float]]:
    """Probability of each answer token and entropy (nats) from one forward of prompt + answer, by hand in float64."""
    ids = torch.tensor([attr.prompt_token_ids + attr.generated_token_ids])  # (1, N + K)
    with torch.no_grad():
        logits = model(input_ids=ids, **(extra_inputs or {})).logits[0].double()  # (N + K, V)
    n = attr.num_prompt_tokens
    probs, entropies = [], []
    for k, token in enumerate(attr.generated_token_ids):
        row = logits[n - 1 + k]  # (V,): the position that predicts answer token k
        p = torch.exp(row - torch.logsumexp(row, dim=0))
        probs.append(float(p[token]))
        entropies.append(float(-(p * torch.log(p)).sum()))
    return probs, entropies


@pytest.fixture(scope="module", params=list(BUILDERS))
def generated_and_forced(request, tokenizer):
    """Per tiny model: a generation with every method, and the same token ids forced back in."""
    bundle = _bundle(tokenizer, request.param)
    generated = explain(bundle, PROMPT, methods=ALL, method_options=OPTIONS, max_new_tokens=6)
    forced = explain(
        bundle, PROMPT, methods=ALL, method_options=OPTIONS, max_new_tokens=6, answer=generated.generated_token_ids
    )
    return generated, forced


@pytest.mark.parametrize("method", ALL)
def test_forced_ids_give_the_maps_of_the_generation_that_produced_them(generated_and_forced, method):
    generated, forced = generated_and_forced
    _assert_same_maps(generated, forced, [method])
    assert generated.meta["answer"] == "generated"
    assert forced.meta["answer"] == "given" and forced.meta["answer_tokenization"] == "ids"
    assert forced.step_scores == generated.step_scores


@pytest.mark.parametrize("kind", list(BUILDERS))
def test_forced_text_of_a_generation_gives_its_maps(tokenizer, kind):
    bundle = _bundle(tokenizer, kind)
    probe = explain(bundle, PROMPT, methods=["random"], max_new_tokens=8).generated_token_ids
    enc = bundle.encode(PROMPT)
    n = enc.input_ids.shape[1]

    # a random model also emits byte pieces whose text tokenises differently: keep the longest prefix that round-trips
    def round_trips(j: int) -> bool:
        return _in_context_ids(tokenizer, enc.text, n, tokenizer.decode(probe[:j])) == probe[:j]

    length = max((j for j in range(1, len(probe) + 1) if round_trips(j)), default=0)
    assert length >= 1, "the seeded tiny model's first token should round-trip through its text"
    generated = explain(bundle, PROMPT, methods=ALL, method_options=OPTIONS, max_new_tokens=length)
    text = tokenizer.decode(generated.generated_token_ids)
    forced = explain(bundle, PROMPT, methods=ALL, method_options=OPTIONS, max_new_tokens=length, answer=text)
    assert forced.meta["answer_tokenization"] == "in context"
    _assert_same_maps(generated, forced, ALL)


def test_an_answer_the_model_would_not_generate(tokenizer):
    bundle = _bundle(tokenizer)
    enc = bundle.encode(PROMPT)
    n = enc.input_ids.shape[1]
    expected = _in_context_ids(tokenizer, enc.text, n, ANSWER)
    attr = explain(bundle, PROMPT, methods=ALL, method_options=OPTIONS, max_new_tokens=32, answer=ANSWER)
    assert attr.generated_token_ids == expected and attr.num_steps == len(expected) > 5
    assert tokenizer.decode(attr.generated_token_ids) == ANSWER and attr.generated_text == ANSWER
    assert attr.meta["answer"] == "given" and attr.meta["answer_tokenization"] == "in context"
    greedy = explain(bundle, PROMPT, methods=["random"], max_new_tokens=len(expected))
    assert greedy.generated_token_ids[:2] != expected[:2]
    for m in ALL:
        assert attr.methods[m].raw.shape == (len(expected), n) and np.isfinite(attr.methods[m].raw).all(), m
    # MACS of the forced answer against the plain reference on eager attention over prompt + answer
    attentions, _ = eager_attentions(bundle.model, torch.tensor([attr.prompt_token_ids + expected]))
    ref_raw, ref_z = reference_macs(attentions, n, len(expected))
    np.testing.assert_allclose(attr.methods["macs"].z, np.array(ref_z), atol=1e-4)
    np.testing.assert_allclose(attr.methods["macs"].raw, np.array(ref_raw), rtol=1e-4, atol=0)
    assert registered_names() == [] and bundle.model.config._attn_implementation == "sdpa"


@pytest.mark.parametrize("answer", [None, ANSWER], ids=["generated", "given"])
@pytest.mark.parametrize("kind", list(BUILDERS))
def test_step_scores_equal_a_plain_forward(tokenizer, kind, answer):
    bundle = _bundle(tokenizer, kind)
    attr = explain(bundle, PROMPT, methods=["random"], max_new_tokens=16, answer=answer)
    probs, entropies = _plain_step_scores(bundle.model, attr)
    assert set(attr.step_scores) == {"probability", "entropy"}
    np.testing.assert_allclose(attr.step_scores["probability"], probs, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(attr.step_scores["entropy"], entropies, rtol=1e-4, atol=1e-5)
    vocab = bundle.model.config.vocab_size
    assert all(0 <= h <= np.log(vocab) + 1e-4 for h in attr.step_scores["entropy"])
    if answer is None:  # greedy: each token is the most probable one
        ids = torch.tensor([attr.prompt_token_ids + attr.generated_token_ids])
        with torch.no_grad():
            logits = bundle.model(input_ids=ids).logits[0]  # (N + K, V)
        top = torch.softmax(logits[attr.num_prompt_tokens - 1 : -1].double(), dim=-1).max(dim=-1).values
        np.testing.assert_allclose(attr.step_scores["probability"], top.numpy(), rtol=1e-4)
    else:
        assert min(attr.step_scores["probability"]) < 0.5  # a random model does not expect this answer


def test_step_scores_survive_json_and_grow_with_the_stream(tokenizer, tmp_path):
    bundle = _bundle(tokenizer)
    updates = list(stream_explain(bundle, PROMPT, methods=["macs", "random"], max_new_tokens=16, answer=ANSWER))
    for update in updates:  # every snapshot is consistent: one score per token so far
        assert all(len(v) == update.num_steps for v in update.step_scores.values())
    assert [u.num_steps for u in updates[:3]] == [1, 2, 3]
    assert updates[0].meta["status"].startswith("teacher-forcing the answer: 1 of")
    final = updates[-1]
    path = tmp_path / "r.json"
    final.save_json(path)
    back = Attribution.load_json(path)
    assert back.step_scores == final.step_scores and back.meta["answer"] == "given"
    assert json.loads(path.read_text())["step_scores"]["entropy"] == final.step_scores["entropy"]


def test_empty_or_whitespace_answer_generates(tokenizer):
    bundle = _bundle(tokenizer)
    greedy = explain(bundle, PROMPT, methods=["macs"], max_new_tokens=4)
    for blank in ("", "  \n\t"):
        attr = explain(bundle, PROMPT, methods=["macs"], max_new_tokens=4, answer=blank)
        assert attr.meta["answer"] == "generated" and "answer_tokenization" not in attr.meta
        _assert_same_maps(greedy, attr, ["macs"])


@pytest.mark.parametrize(
    "answer, message",
    [
        ("Paris\ud800", "The answer contains U\\+D800"),
        ([], "The answer has no tokens"),
        ([1, 10_000], "from 0 to 319, found 10000"),
        ([1, -1], "found -1"),
        ([1, True], "found True"),
        ([[1, 2]], "found \\[1, 2\\]"),
        (3, "must be a list of whole numbers, got int"),
        (list(range(1025)), r"The answer has 1025 tokens; at most 1024 answer tokens can be explained"),
    ],
)
def test_bad_answers_are_input_errors(tokenizer, answer, message):
    bundle = _bundle(tokenizer)
    with pytest.raises(InputError, match=message):
        explain(bundle, PROMPT, methods=["macs"], max_new_tokens=8, answer=answer)
    assert registered_names() == []


@pytest.mark.parametrize("answer", ["word " * 40, list(range(3, 12))])
def test_a_given_answer_longer_than_max_new_tokens_is_explained_in_full(tokenizer, answer):
    """The one rule of a given answer's length (`request.fit_answer`), the same for every front end: all its tokens
    are explained, `max_new_tokens` raised to hold them (the CLI and the library no longer refuse it, the app no
    longer differs)."""
    bundle = _bundle(tokenizer)
    attr = explain(bundle, PROMPT, methods=["macs"], max_new_tokens=8, answer=answer)
    k = attr.num_steps
    assert k > 8 and attr.meta["answer"] == "given" and attr.meta["max_new_tokens"] >= k
    if not isinstance(answer, str):
        assert attr.generated_token_ids == answer
    request = ExplainRequest.build(PROMPT, ["macs"], 8, answer=answer)
    fitted = fit_answer(bundle, request)
    assert fitted.max_new_tokens >= k and fit_answer(bundle, fitted) == fitted  # never lowered, applied once
    assert fit_answer(bundle, request.replace(max_new_tokens=300)).max_new_tokens == 300


def test_an_end_of_sequence_token_inside_the_answer_does_not_stop_it(tokenizer):
    bundle = _bundle(tokenizer)
    eos = next(iter(bundle.eos_token_ids))
    forced = [5, eos, 7]
    attr = explain(bundle, PROMPT, methods=["macs", "atman"], max_new_tokens=3, answer=forced)
    assert attr.generated_token_ids == forced
    assert attr.methods["macs"].raw.shape == attr.methods["atman"].raw.shape == (3, attr.num_prompt_tokens)


def test_generate_steps_yields_forced_tokens(tokenizer):
    model = build_model("qwen2")
    ids = torch.tensor([tokenizer("Paris is")["input_ids"]])  # (1, N)
    forced = [40, 41, 42, 43]
    job = DecodeJob(ids, [get_method("macs")], 10, forced_ids=forced)
    steps = list(generate_steps(model, job, decode_choice(model, job)))
    assert [s.token_id for s in steps] == forced and [s.index for s in steps] == [0, 1, 2, 3]
    assert all(s.scores["macs"].shape == (ids.shape[1],) for s in steps)
    with pytest.raises(InputError, match="shape"):
        DecodeJob(ids[0], [], 3)


def test_a_merge_across_the_boundary_tokenises_the_answer_on_its_own(tokenizer):
    bundle = _bundle(tokenizer)
    prompt, answer = "Paris is the capit", "al of France."
    enc = bundle.encode(prompt, chat_template=False)
    n = enc.input_ids.shape[1]
    joint = tokenizer(prompt + answer)["input_ids"]
    assert joint[:n] != enc.input_ids[0].tolist()  # "capit" + "al" merge: the prompt's ids would change
    attr = explain(bundle, prompt, methods=["macs"], max_new_tokens=16, chat_template=False, answer=answer)
    assert attr.meta["answer_tokenization"] == "on its own"
    assert attr.generated_token_ids == tokenizer(answer, add_special_tokens=False)["input_ids"]
    assert attr.prompt_token_ids == enc.input_ids[0].tolist() and attr.generated_text == answer
    # without a merge, the joint tokenisation is used
    ids, how = answer_token_ids(bundle, " capital of France.", *_plain(bundle, "Paris is the"))
    assert how == "in context" and ids == tokenizer(" capital of France.")["input_ids"]


def _plain(bundle, prompt):
    enc = bundle.encode(prompt, chat_template=False)
    return enc.input_ids[0].tolist(), enc.text, True


def test_faithfulness_works_on_a_forced_answer(tokenizer):
    """Removal curves teacher-force the given answer; the unperturbed regeneration is the model's own answer."""
    bundle = _bundle(tokenizer)
    prompt = "Question: What is the capital of France? Context: France is a country in Europe."
    attr = explain(bundle, prompt, methods=["macs", "rollout"], max_new_tokens=8, answer="Paris.")
    greedy = explain(bundle, prompt, methods=["random"], max_new_tokens=8)
    report = measure_faithfulness(bundle, attr, FaithfulnessRequest(methods=["macs", "rollout"], soft=QUICK_SOFT))
    for m in ("macs", "rollout", "random"):
        assert report.removal.curves[m]["logit"]["mif"][0] == pytest.approx(1.0)
        assert all(np.isfinite(v) for v in report.removal.auc[m]["ppl"].values())
    unperturbed = report.removal.generations["macs"]["mif"][0]
    assert unperturbed == tokenizer.decode(greedy.generated_token_ids, skip_special_tokens=True)
    assert unperturbed != "Paris."
    assert set(report.soft.auc_ns) == {"macs", "rollout"}


@pytest.fixture(scope="module")
def vl():
    tokenizer = make_vl_tokenizer()
    return vl_bundle(build_vl_model(tokenizer), tokenizer), tokenizer


def test_image_prompt_forced_ids_give_the_maps_of_the_generation(vl):
    bundle, _ = vl
    image = Image.fromarray(np.random.default_rng(3).integers(0, 256, (50, 90, 3), dtype=np.uint8))
    question = "What is in the image?"
    generated = explain(bundle, question, image=image, methods=IMAGE_METHODS, max_new_tokens=4)
    forced = explain(
        bundle, question, image=image, methods=IMAGE_METHODS, max_new_tokens=4, answer=generated.generated_token_ids
    )
    _assert_same_maps(generated, forced, IMAGE_METHODS)
    assert forced.image == generated.image and forced.step_scores == generated.step_scores


def test_image_prompt_forced_text_and_its_step_scores(vl):
    bundle, tokenizer = vl
    image = Image.fromarray(np.random.default_rng(4).integers(0, 256, (60, 60, 3), dtype=np.uint8))
    question, answer = "What is in the image?", "A red square on a blue background."
    attr = explain(bundle, question, image=image, methods=IMAGE_METHODS, max_new_tokens=32, answer=answer)
    assert attr.meta["answer_tokenization"] == "in context" and tokenizer.decode(attr.generated_token_ids) == answer
    assert attr.generated_token_ids == tokenizer(answer, add_special_tokens=False)["input_ids"]  # after "\n"
    for m in IMAGE_METHODS:
        assert attr.methods[m].raw.shape == (attr.num_steps, attr.num_prompt_tokens), m
    enc = encode_image_prompt(bundle, image, question)
    assert enc.input_ids[0].tolist() == attr.prompt_token_ids
    probs, entropies = _plain_step_scores(bundle.model, attr, full_sequence_inputs(enc.prefill_inputs, attr.num_steps))
    np.testing.assert_allclose(attr.step_scores["probability"], probs, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(attr.step_scores["entropy"], entropies, rtol=1e-4, atol=1e-5)
    assert registered_names() == [] and bundle.model.model.rope_deltas is None


# --- the answer budget: max_new_tokens raised to hold a given answer ------------------------------------------------


def _sentencepiece_tokenizer() -> PreTrainedTokenizerFast:
    """A SentencePiece-style (Metaspace, `▁`) BPE tokenizer trained offline: not byte-level."""
    special = ["<unk>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=300, special_tokens=special, show_progress=False))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    fast.chat_template = CHAT_TEMPLATE
    assert len(fast) <= VOCAB
    return fast


@pytest.fixture(scope="module")
def budget_bundles(tokenizer):
    model = build_model("llama")
    return {
        "byte-level": bundle_from_objects(model, tokenizer, name="tiny-bpe"),
        "sentencepiece": bundle_from_objects(model, _sentencepiece_tokenizer(), name="tiny-sp"),
    }


@pytest.mark.parametrize("kind", ["byte-level", "sentencepiece"])
@pytest.mark.parametrize(
    "answer", ["Paris.", " It is Paris, the capital of France!\n\nYes.", "🙂 Zürich — 東京 \t", "a\n\n\n\n"]
)
def test_the_answer_budget_holds_every_token_of_the_answer(budget_bundles, kind, answer):
    bundle = budget_bundles[kind]
    assert bundle.byte_level is (kind == "byte-level")
    budget = answer_budget(bundle, answer, 1)
    own = len(bundle.tokenizer(answer, add_special_tokens=False)["input_ids"])
    want = len(answer.encode("utf-8")) + 1 if kind == "byte-level" else own + ANSWER_BOUNDARY_TOKENS
    assert budget == want and budget >= own
    for template in (True, False):  # the real request fits: no "more than max_new_tokens" error
        attr = explain(
            bundle, "Where is Paris?", methods=["macs"], max_new_tokens=budget, chat_template=template, answer=answer
        )
        assert attr.meta["answer"] == "given" and 1 <= attr.num_steps <= budget


def test_the_answer_budget_is_never_lowered_and_stays_within_the_limit(budget_bundles):
    for bundle in budget_bundles.values():
        assert answer_budget(bundle, None, 7) == answer_budget(bundle, " \n", 7) == 7  # generate: the slider's length
        assert answer_budget(bundle, "Paris", 200) == 200
        assert answer_budget(bundle, "é " * 3000, 8) == MAX_NEW_TOKENS_LIMIT
