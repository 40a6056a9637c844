"""Prompt text for the benchmark: exactly N tokens of real text (SQuAD contexts), or seeded filler text without it."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..evaluate import load_squad

_REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_DATA = _REPO_ROOT.parent / "shared/data/squad2-dev-350.json"
SQUAD_SOURCE = "squad2-dev-350"
GENERATED_SOURCE = "generated"

# Plain English-ish vocabulary for the fallback prompt: real words tokenise like real text, random ids do not.
_WORD_LIST = (
    "the of and to in is was for on that with as by at from his her their this which an be are were it not or "
    "have has had one all new more first year city river people time world state school music water history "
    "during after before between under through early later most many other several large small known called "
    "built founded became began remained used named part north south central western eastern government army "
    "church university company century war region island population language family team season album "
    "record film series book king queen law court power trade market energy system"
)
_WORDS = _WORD_LIST.split()


def _squad_contexts(path: Path | None) -> list[str] | None:
    """Distinct contexts in file order, or None when the file is absent or has none (then filler text is used)."""
    if path is None or not Path(path).is_file():
        return None
    rows = load_squad(path, required=())  # rows without a context are skipped, not refused
    contexts = list(dict.fromkeys(str(r["context"]) for r in rows if str(r.get("context", "")).strip()))
    return contexts or None


def _generated_paragraphs(seed: int) -> Iterator[str]:
    """Endless deterministic paragraphs of eight sentences built from `_WORDS`."""
    rng = random.Random(seed)
    while True:
        sentences = []
        for _ in range(8):
            words = [rng.choice(_WORDS) for _ in range(rng.randint(6, 14))]
            sentences.append(" ".join(words).capitalize() + ".")
        yield " ".join(sentences)


def prompt_ids(
    tokenizer: Any, num_tokens: int, data_path: Path | None = DEFAULT_DATA, seed: int = 0
) -> tuple[list[int], str]:
    """Exactly `num_tokens` token ids of real text.

    Contexts of the SQuAD file are joined with blank lines (cycling when the file is too short) and the tokens of
    the joined text, without chat template or special tokens, are cut to `num_tokens`.

    Args:
        tokenizer: a transformers tokenizer.
        num_tokens: N >= 1.
        data_path: SQuAD-style JSON read by `evaluate.load_squad` (`{"rows": [{"context": ...}]}` or a list of
            rows); when absent, seeded filler text is used.
        seed: seed of the filler text.

    Returns:
        (ids, text_source): a list of N ints and "squad2-dev-350" or "generated".
    """
    if num_tokens < 1:
        raise InputError(f"Prompt length must be at least 1 token, got {num_tokens}.")
    contexts = _squad_contexts(data_path)
    if contexts is not None:
        paragraphs, source = itertools.cycle(contexts), SQUAD_SOURCE
    else:
        paragraphs, source = _generated_paragraphs(seed), GENERATED_SOURCE
    text = ""
    ids: list[int] = []
    # Re-tokenising the whole text keeps the cut exact: tokens at paragraph joins depend on both sides.
    while len(ids) < num_tokens:
        text = f"{text}\n\n{next(paragraphs)}" if text else next(paragraphs)
        ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    return ids[:num_tokens], source
