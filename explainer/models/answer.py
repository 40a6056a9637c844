"""A given answer as token ids: how `explain` tokenises an answer to teacher-force, and how many new tokens it needs."""

from __future__ import annotations

from collections.abc import Sequence

from .loading import ModelBundle

MAX_NEW_TOKENS_LIMIT = 1024
ANSWER_BOUNDARY_TOKENS = 4  # an answer's tokens in context may differ from its own at the prompt boundary


def answer_token_ids(
    bundle: ModelBundle, answer: str, prompt_ids: list[int], prompt_text: str, add_special_tokens: bool = False
) -> tuple[list[int], str]:
    """Token ids of `answer` as the continuation of a prompt, and how they were found.

    The prompt text (chat template and assistant prefix included) and the answer are tokenised together, the way a
    conversation is tokenised for training; when the first N ids are exactly the prompt's, the rest are the answer's
    ("in context"). A tokenizer may merge characters across the boundary (a prompt ending mid-word, or a newline
    followed by one); the prompt's ids then differ, and the answer is tokenised on its own, without special tokens
    ("on its own"): the model, which produced the prompt's last token already, could only continue from a token
    boundary too.

    Args:
        bundle: the model's bundle (its tokenizer is used).
        answer: the answer text, exactly as given (no whitespace is stripped).
        prompt_ids: the prompt's N ids.
        prompt_text: the text they were tokenised from.
        add_special_tokens: whether the prompt's tokenisation added special tokens (a prompt without template).

    Returns:
        (the answer's ids, "in context" or "on its own").
    """
    tok = bundle.tokenizer
    n = len(prompt_ids)
    joint = list(tok(prompt_text + answer, add_special_tokens=add_special_tokens)["input_ids"])
    if len(joint) > n and joint[:n] == list(prompt_ids):
        return joint[n:], "in context"
    return list(tok(answer, add_special_tokens=False)["input_ids"]), "on its own"


def answer_budget(bundle: ModelBundle, answer: str | Sequence[int] | None, max_new_tokens: int) -> int:
    """`max_new_tokens` raised to hold every token of a given `answer`, up to `MAX_NEW_TOKENS_LIMIT` (never lowered):
    the library's one rule for a given answer's length (`request.fit_answer` applies it for every front end).

    Token ids need their count. For text, byte-level BPE makes at most one token per UTF-8 byte, plus a prefix-space
    token; any other tokenizer is asked: the answer's own tokens plus `ANSWER_BOUNDARY_TOKENS`. An answer that still
    does not fit gets the InputError once it is tokenised (`request.answer_too_long`).
    """
    if answer is None or isinstance(answer, str) and not answer.strip():
        return max_new_tokens
    if not isinstance(answer, str):
        need = len(answer)
    elif bundle.byte_level:
        need = len(answer.encode("utf-8")) + 1
    else:
        need = len(bundle.tokenizer(answer, add_special_tokens=False)["input_ids"]) + ANSWER_BOUNDARY_TOKENS
    return min(max(max_new_tokens, need), MAX_NEW_TOKENS_LIMIT)
