"""The `surrogate` command's rows (`explainer/eval/surrogate_lds.py`): each variant's fit, made from masks pooled
across variants and run once, equals the Sources method run on its own on the same answer, scored by the same LDS."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from explainer.cli import main
from explainer.eval.lds import ablation_masks, centred_predictions, lds, predictions, source_scores
from explainer.eval.lds_eval import answer_row
from explainer.eval.surrogate_lds import SurrogateLdsConfig, measure
from explainer.methods import GenerationRun, get_method
from explainer.models.loading import ModelBundle

from .test_lds_eval import ROW

RANKS = 2e-3  # the shared passes batch and pad the masks otherwise than a run alone: their log-probabilities agree to
# float rounding (~1e-6), which can swap two nearly tied masks among the 32, moving a Spearman by ~4e-4 each


@pytest.mark.parametrize("passes", ["removal", "knockout"])
def test_each_variant_equals_the_method_run_alone(llama, tokenizer, passes):
    bundle = ModelBundle(name="tiny", model=llama, tokenizer=tokenizer)
    cfg = SurrogateLdsConfig(counts=(4, 5), passes=("removal", "knockout"), options={"design": "hadamard"},
                             more_options=({"design": "hadamard", "regulariser": "lasso"},
                                           {"design": "hadamard", "regulariser": "saturating"}),
                             max_new_tokens=4, reference=6)  # fmt: skip
    got = measure(bundle, ROW, cfg)
    answered = answer_row(bundle, ROW, ["random"], 4)
    attr, sentences, k = answered.attr, answered.sentences, answered.k
    masks = ablation_masks(len(sentences), 32, 0.5, [0, zlib.crc32(b"q1")])
    measured = None
    for count, regulariser in ((4, "auto"), (5, "auto"), (5, "lasso"), (5, "saturating")):  # auto: the Lasso at 4
        # masks over 4 units (not 3: 4 rows leave the Lasso at its largest penalty, its weights near 0, ranked by
        # float rounding)
        method = get_method("sources", ablations=count, check=0, design="hadamard", passes=passes,
                            regulariser=regulariser)  # fmt: skip
        run = GenerationRun(llama, answered_ids(attr), attr.num_prompt_tokens, prompt_tokens=attr.prompt_tokens,
                            user_positions=attr.user_positions)  # fmt: skip
        raw = method.explain(run)[:k]
        if measured is None:  # the evaluation masks' removal log-probabilities, from the `lds` command's own rows
            measured = evaluation_logprobs(bundle, attr, sentences, masks, k)
        lasso = f":regulariser={regulariser}" if regulariser != "auto" else ""
        knockout = ":passes=knockout" if passes == "knockout" else ""
        label = f"sources:design=hadamard{lasso}:ablations={count}{knockout}"
        want = lds(measured.sum(axis=1), predictions(masks, source_scores(raw, sentences).sum(axis=0)))
        assert got["methods"][label]["lds"] == pytest.approx(want, abs=RANKS)
        zero_mean = np.array(raw, dtype=np.float64)  # each step minus its mean over the context's tokens, by hand
        for step in range(len(zero_mean)):
            zero_mean[step] -= sum(float(raw[step][p]) for p in answered.positions) / len(answered.positions)
        want = lds(measured.sum(axis=1), centred_predictions(masks, source_scores(zero_mean, sentences).sum(axis=0)))
        assert got["methods"][label]["lds_centred"] == pytest.approx(want, abs=RANKS)
        whole = source_scores(raw, sentences).sum(axis=0)  # a reader's check on the first 4 masks, and the rest
        want = lds(measured[:4].sum(axis=1), predictions(masks[:4], whole))
        assert got["fits"][label]["check_spearman"] == pytest.approx(want, abs=RANKS)
        want = lds(measured[4:].sum(axis=1), predictions(masks[4:], whole))
        assert got["fits"][label]["lds_rest"] == pytest.approx(want, abs=RANKS)
    assert set(got["methods"]) >= {"least-squares:masks=6"} and got["n_sentences"] == len(sentences) == 4
    assert got["passes_run"]["removal"] < 1 + 32 + 6 + 3 + 5  # shared masks ran once


def answered_ids(attr):
    import torch

    return torch.tensor([attr.prompt_token_ids + attr.generated_token_ids])


def evaluation_logprobs(bundle, attr, sentences, masks, k):
    import torch

    from explainer.eval.ablate import response_logprobs

    n = attr.num_prompt_tokens
    keep = np.ones((len(masks), n), dtype=bool)
    for m, mask in enumerate(masks):
        for s, positions in enumerate(sentences):
            if not mask[s]:
                keep[m, positions] = False
    ids = torch.tensor(attr.prompt_token_ids + attr.generated_token_ids[:k])
    return response_logprobs(bundle.model, ids[:n], ids[n:], torch.as_tensor(keep))


def test_bad_counts_and_passes_are_refused_in_one_line(capsys):
    assert main(["surrogate", "--data", "x.json", "--counts", "0,8"]) == 2
    assert "--counts" in capsys.readouterr().err
    assert main(["surrogate", "--data", "x.json", "--passes", "attention"]) == 2
    assert "--passes" in capsys.readouterr().err
    assert main(["surrogate", "--data", "x.json", "--options", "ablations=8"]) == 2
    assert "--counts" in capsys.readouterr().err


def test_paired_differences_use_the_rows_holding_both_methods():
    from explainer.eval.intervals import t975
    from explainer.eval.lds_eval import paired_lines

    samples = [{"id": str(i), "methods": {"a": {"lds": 0.5 + d}, "b": {"lds": 0.5}}} for i, d in
               enumerate([0.1, 0.2, 0.3])]  # fmt: skip
    samples.append({"id": "x", "methods": {"a": {"lds": 0.9}}})  # no b: left out
    (line,) = paired_lines(samples, [("a", "b")])
    half = t975(2) * 0.1 / np.sqrt(3)  # sd of (0.1, 0.2, 0.3) is 0.1
    assert line == f"paired a - b: lds +0.200 ± {half:.3f} (N = 3)"
    assert paired_lines(samples, [("a", "c")]) == ["paired a - c: no row holds both"]


def test_a_side_joined_by_plus_is_each_row_s_mean_over_its_methods():
    from explainer.eval.lds_eval import paired_lines

    samples = [{"id": "1", "methods": {"a": {"lds": 0.2}, "b": {"lds": 0.6}, "c": {"lds": 0.1}}},
               {"id": "2", "methods": {"a": {"lds": 0.4}, "b": {"lds": 0.8}, "c": {"lds": 0.3}}},
               {"id": "3", "methods": {"a": {"lds": 0.9}, "c": {"lds": 0.0}}}]  # fmt: skip  # no b: left out
    (line,) = paired_lines(samples, [("a+b", "c")])  # (0.4 - 0.1, 0.6 - 0.3): +0.300, no spread
    assert line == "paired a+b - c: lds +0.300 ± 0.000 (N = 2)"


def test_report_rows_keeps_only_the_ids_of_a_rerun(tmp_path, capsys):
    import json

    def write(name, rows):
        path = tmp_path / name
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        return str(path)

    old = write("old.jsonl", [{"id": i, "answer": i, "methods": {"a": {"lds": 0.1}, "b": {"lds": 0.5}}} for i in "xyz"])
    new = write("new.jsonl", [{"id": "x", "answer": "x", "methods": {"a": {"lds": 0.9}}}])
    assert main(["lds", "--report", f"{old},{new}", "--rows", new, "--compare", "a/b"]) == 0
    printed = capsys.readouterr().out
    assert "paired a - b: lds +0.400" in printed and "(N = 1)" in printed  # y and z (old a only) left out
    assert main(["lds", "--report", f"{old},{new}", "--compare", "a/b"]) == 0
    assert "(N = 3)" in capsys.readouterr().out  # without --rows every row joins
    assert main(["lds", "--rows", new]) == 2
    assert "--report" in capsys.readouterr().err


def test_by_sentences_repeats_the_paired_differences_in_each_bin_of_sentence_counts(tmp_path, capsys):
    import json

    from explainer.eval.intervals import t975
    from explainer.eval.lds_eval import sentence_bins

    counts, gaps = [12, 19, 20, 23, 24, 30, 31], [0.1, 0.3, -0.2, 0.0, 0.05, 0.4, 0.2]  # a - b, row by row
    rows = [{"id": str(i), "answer": "x", "n_sentences": n, "methods": {"a": {"lds": 0.5 + d}, "b": {"lds": 0.5}}}
            for i, (n, d) in enumerate(zip(counts, gaps, strict=True))]  # fmt: skip
    rows.append({"id": "u", "answer": "x", "methods": {"a": {"lds": 0.9}, "b": {"lds": 0.1}}})  # no count: no bin
    bins = sentence_bins(rows, [20, 24])
    assert [(label, [r["id"] for r in kept]) for label, kept in bins] == [
        ("up to 19 sentences", ["0", "1"]),
        ("20-23 sentences", ["2", "3"]),
        ("24 or more sentences", ["4", "5", "6"]),
    ]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    assert main(["lds", "--report", str(path), "--compare", "a/b", "--by-sentences", "20,24"]) == 0
    printed = capsys.readouterr().out
    for label, values in (("up to 19", [0.1, 0.3]), ("20-23", [-0.2, 0.0]), ("24 or more", [0.05, 0.4, 0.2])):
        mean, sd = np.mean(values), np.std(values, ddof=1)  # each bin's paired t interval, by hand
        half = t975(len(values) - 1) * sd / np.sqrt(len(values))
        assert f"{label} sentences: paired a - b: lds {mean:+.3f} ± {half:.3f} (N = {len(values)})" in printed
    assert f"\npaired a - b: lds {np.mean([*gaps, 0.8]):+.3f}" in printed  # every row, the one without a count too
    for bad in ("24,20", "0,5", "x"):
        assert main(["lds", "--report", str(path), "--compare", "a/b", "--by-sentences", bad]) == 2
        assert "--by-sentences takes ascending" in capsys.readouterr().err
    assert main(["lds", "--by-sentences", "20"]) == 2
    assert "--report" in capsys.readouterr().err


def test_the_informed_variant_runs_the_masks_the_method_runs_alone(llama, tokenizer):
    """Ten sentences at k = 16 make a plain design, whose columns the informed design places by the answer's overlap:
    the command's variant must fit the masks the method itself draws from the same answer, and score as it does."""
    bundle = ModelBundle(name="tiny", model=llama, tokenizer=tokenizer)
    context = ROW["context"] + (" Rome is the capital of Italy. Madrid lies in Spain. Snow is cold. Tea is hot."
                                " Lisbon sits by the sea. Cats sleep a lot.")
    row = {**ROW, "id": "q6", "context": context}
    cfg = SurrogateLdsConfig(counts=(16,), options={"context": "Context", "design": "informed"},
                             max_new_tokens=4)  # fmt: skip
    got = measure(bundle, row, cfg)
    answered = answer_row(bundle, row, ["random"], 4)
    attr, sentences, k = answered.attr, answered.sentences, answered.k
    method = get_method("sources", ablations=16, check=0, design="informed", context="Context")
    run = GenerationRun(llama, answered_ids(attr)[:, : attr.num_prompt_tokens + k], attr.num_prompt_tokens,
                        prompt_tokens=attr.prompt_tokens, user_positions=attr.user_positions)  # fmt: skip
    raw = method.explain(run)
    masks = ablation_masks(len(sentences), 32, 0.5, [0, zlib.crc32(b"q6")])
    measured = evaluation_logprobs(bundle, attr, sentences, masks, k)
    want = lds(measured.sum(axis=1), predictions(masks, source_scores(raw, sentences).sum(axis=0)))
    label = "sources:context=Context:design=informed:ablations=16"
    assert len(sentences) == 10 and got["fits"][label]["units"] == 10
    assert got["methods"][label]["lds"] == pytest.approx(want, abs=RANKS)
    plain = get_method("sources", ablations=16, check=0, design="aberration", context="Context")  # no prior
    other = lds(measured.sum(axis=1), predictions(masks, source_scores(plain.explain(run), sentences).sum(axis=0)))
    assert abs(other - want) > 10 * RANKS  # the prior moved the columns here, so the check can fail
