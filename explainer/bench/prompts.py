"""Prompt text for the benchmark: exactly N tokens of real prose, from a SQuAD file, a text file, or the shipped text.

Three sources, in order of precedence:

- `data_path`: the contexts of a SQuAD file (any layout `evaluate.load_squad` reads), joined with blank lines;
- `prompt_file`: a plain UTF-8 text file;
- otherwise `DEFAULT_TEXT`, English essays that ship with the package in `explainer/data/` (public domain, see its
  first line).

The text is repeated when it is too short, tokenised without chat template or special tokens, and cut to N tokens.
Leading lines of a text file that start with `# ` are a header (source and licence), not prompt text; the report
names the source.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..eval.evaluate import load_squad

DEFAULT_TEXT: Traversable = resources.files("explainer").joinpath("data", "bench_text.txt")  # package data
DEFAULT_TEXT_NAME = "explainer/data/bench_text.txt"  # how reports name it


def _squad_contexts(path: Path) -> list[str]:
    """Distinct non-empty contexts of a SQuAD file, in file order."""
    rows = load_squad(path, required=())  # rows without a context are skipped, not refused
    contexts = list(dict.fromkeys(str(r["context"]) for r in rows if str(r.get("context", "")).strip()))
    if not contexts:
        raise InputError(f"{str(path)!r} has no contexts to use as benchmark text.")
    return contexts


def read_text_file(path: Path | Traversable) -> tuple[str, str]:
    """(body, header) of a text file: leading `# ` lines are the header (joined, without the `# `), the rest the body.

    Raises:
        InputError: unreadable file, or no text after the header.
    """
    try:
        lines = (Path(path) if isinstance(path, str) else path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"Cannot read benchmark text file {str(path)!r}: {e.__class__.__name__}: {e}") from e
    header = list(itertools.takewhile(lambda line: line.startswith("# "), lines))
    body = "\n".join(lines[len(header) :]).strip()
    if not body:
        raise InputError(f"Benchmark text file {str(path)!r} holds no text.")
    return body, " ".join(line[2:].strip() for line in header)


def prompt_text(data_path: Path | None = None, prompt_file: Path | None = None) -> tuple[list[str], str]:
    """The paragraphs to cycle through and a one-line description of where they come from (for the report).

    Raises:
        InputError: an unreadable or empty file.
    """
    if data_path is not None:
        return _squad_contexts(Path(data_path)), f"SQuAD contexts from {Path(data_path).name}"
    path = Path(prompt_file) if prompt_file is not None else DEFAULT_TEXT
    body, header = read_text_file(path)
    name = DEFAULT_TEXT_NAME if prompt_file is None else f"text file {path.name}"
    return [body], f"{name} ({header})" if header else name


def _cut(tokenizer: Any, paragraphs: Iterable[str], num_tokens: int) -> list[int]:
    text = ""
    ids: list[int] = []
    paragraphs = iter(paragraphs)
    # Re-tokenising the whole text keeps the cut exact: tokens at paragraph joins depend on both sides.
    while len(ids) < num_tokens:
        text = f"{text}\n\n{next(paragraphs)}" if text else next(paragraphs)
        ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    return ids[:num_tokens]


def prompt_ids(
    tokenizer: Any, num_tokens: int, data_path: Path | None = None, prompt_file: Path | None = None
) -> tuple[list[int], str]:
    """Exactly `num_tokens` token ids of real text.

    The source's paragraphs are joined with blank lines, cycling when the text is too short, and the tokens of the
    joined text, without chat template or special tokens, are cut to `num_tokens`.

    Args:
        tokenizer: a transformers tokenizer.
        num_tokens: N >= 1.
        data_path: SQuAD JSON whose contexts are the text (takes precedence over `prompt_file`).
        prompt_file: a plain text file; when neither is given, `DEFAULT_TEXT`.

    Returns:
        (ids, text_source): a list of N ints and a description of the text for the report.

    Raises:
        InputError: N < 1, or an unreadable or empty source.
    """
    if num_tokens < 1:
        raise InputError(f"Prompt length must be at least 1 token, got {num_tokens}.")
    paragraphs, source = prompt_text(data_path, prompt_file)
    if not tokenizer(paragraphs[0], add_special_tokens=False)["input_ids"]:
        raise InputError(f"The benchmark text ({source}) tokenises to no tokens.")
    return _cut(tokenizer, itertools.cycle(paragraphs), num_tokens), source
