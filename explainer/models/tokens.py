"""Readable token strings: byte-level BPE (`Ġ`, `Ċ`) and SentencePiece (`▁`, `<0x0A>`) markers turned into text."""

from __future__ import annotations

import functools
import re

from ..errors import InputError

_BYTE_TOKEN = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")
_SURROGATE = re.compile("[\ud800-\udfff]")


def encoding_problem(text: str) -> str | None:
    """Why no tokenizer can take `text`, or None: a lone UTF-16 surrogate (U+D800..U+DFFF) is not a character; it
    arrives from a broken copy-paste or a JSON escape such as "\\ud800" sent through the API."""
    m = _SURROGATE.search(text)
    if m is None:
        return None
    return (
        f"contains U+{ord(m.group()):04X} at character {m.start() + 1}: half of a UTF-16 surrogate pair, not a "
        "character. Remove it or copy the text again."
    )


def check_encodable(text: str, what: str) -> None:
    """Refuse text that no tokenizer can take (see `encoding_problem`).

    Raises:
        InputError: naming the first lone surrogate and where it is.
    """
    problem = encoding_problem(text)
    if problem is not None:
        raise InputError(f"{what} {problem}")


@functools.lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's `bytes_to_unicode` table: printable stand-in character -> byte."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


def is_byte_level(vocab_tokens) -> bool:
    """Whether a vocabulary uses GPT-2 style byte-level BPE (`Ġ` stands for a space)."""
    return any(t is not None and ("Ġ" in t or "Ċ" in t) for t in vocab_tokens)


def readable_tokens(
    tokens: list[str | None],
    special_tokens: set[str] | frozenset[str] = frozenset(),
    byte_level: bool | None = None,
) -> list[str]:
    """Turn raw vocabulary strings into the text each token stands for.

    Args:
        tokens: raw strings from `tokenizer.convert_ids_to_tokens` (None for ids outside the vocabulary).
        special_tokens: strings kept verbatim (e.g. `<|im_start|>`).
        byte_level: whether the vocabulary is byte-level BPE; guessed from `tokens` when None.

    Returns:
        One display string per token; partial UTF-8 sequences become U+FFFD, unknown ids `<unk>`.
    """
    if byte_level is None:
        byte_level = is_byte_level(tokens)
    decoder = _byte_decoder()
    out = []
    for tok in tokens:
        if tok is None:
            out.append("<unk>")
        elif tok in special_tokens:
            out.append(tok)
        elif (m := _BYTE_TOKEN.match(tok)) is not None:
            out.append(bytes([int(m.group(1), 16)]).decode("utf-8", errors="replace"))
        elif byte_level and all(ch in decoder for ch in tok):
            out.append(bytes(decoder[ch] for ch in tok).decode("utf-8", errors="replace"))
        else:
            out.append(tok.replace("▁", " "))
    return out
