"""Which answer step a view shows: clamping, and the last content token a finished answer opens on."""

from __future__ import annotations

import pytest

from explainer.result.attribution import Attribution
from explainer.result.steps import clamp_step, last_content_step


@pytest.mark.parametrize(
    "step, k, shown", [(None, 4, 3), (0, 4, 0), (2, 4, 2), (3, 4, 3), (4, 4, 3), (10**6, 4, 3), (-1, 4, 0),
                       (-(10**6), 4, 0), (2.0, 4, 2), (None, 0, None), (1, 0, None), (0, 1, 0), (5, 1, 0)],
)  # fmt: skip
def test_clamp_step_keeps_steps_within_the_answer(step, k, shown):
    assert clamp_step(step, k) == shown


def _answer(tokens: list[str]) -> Attribution:
    return Attribution(
        model="tiny", prompt_token_ids=[0], prompt_tokens=["a"], generated_token_ids=list(range(len(tokens))),
        generated_tokens=tokens,
    )  # fmt: skip


@pytest.mark.parametrize(
    "tokens, step",
    [
        ([" It", " is", " Paris", "<|im_end|>"], 2),  # the QA example used to open on <|im_end|>
        ([" It", " is", " Paris", ".", "\n", "<|im_end|>", "<|endoftext|>"], 3),  # "." is content; "\n" is not
        (["Hello", "</s>"], 0),
        (["Hello", " world"], 1),  # stopped at max new tokens: the newest token
        (["<|im_end|>"], 0),  # nothing but the end: its last step
        (["\n", " "], 1),
        ([" a", "<|im_end|>", " b", "<|im_end|>"], 2),  # only trailing ones are skipped
        ([], None),
    ],
)
def test_a_finished_answer_opens_on_its_last_content_token(tokens, step):
    assert last_content_step(_answer(tokens)) == step
