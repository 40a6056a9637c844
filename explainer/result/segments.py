"""Words and sentences of the prompt: its tokens cut into consecutive groups, each with its text.

Pure text rules on the readable token strings (`Attribution.prompt_tokens`); no model. `token_groups`,
`word_groups` and `sentence_groups` each cover the chosen positions exactly once, in order; `explainer/spans.py`
scores the groups and ranks sentences.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# Chat-template and other special tokens as `readable_tokens` keeps them: `<|im_start|>`, `<s>`, `</s>`,
# `<start_of_turn>`, `<unk>`, `[INST]`. A user's `<b>` is normally several tokens, so it does not match.
_SPECIAL = re.compile(r"<\|[^<>|\s]{0,64}\|>|</?[A-Za-z_][A-Za-z0-9_.:-]{0,64}>|\[/?[A-Z_]{2,32}\]")
_ROLES = frozenset({"system", "user", "assistant", "model", "tool", "developer", "human", "bot", "ipython"})

# A "." after these does not end a sentence: Latin ones in any case, the others (titles before a name, references,
# months before a day) only capitalised, so that "I said no. Then" still splits.
_LATIN = frozenset("e.g i.e cf vs viz approx ca al et pp".split())
_TITLES = frozenset(
    "mr mrs ms dr prof sr jr st mt rev gen sen rep gov capt lt col sgt hon "
    "fig figs eq eqs sec ch no nos vol vols "
    "jan feb mar apr jun jul aug sep sept oct nov dec".split()
)
_CLOSERS = "\"'”’»)\\]}」』）】〕〉》"
# Western terminators end a sentence only before whitespace ("3.5" and "e.g.," do not); CJK ones need none.
_SENTENCE_END = re.compile(rf"(?P<w>[.!?…‽]+)[{_CLOSERS}]*(?=\s)|(?P<c>[。！？｡]+)[{_CLOSERS}]*|\n")
_CONNECTORS = {".": str.isdigit, ",": str.isdigit, "'": str.isalnum, "’": str.isalnum, "-": str.isalnum}


@dataclass(frozen=True)
class Group:
    """A run of consecutive prompt tokens shown and scored as one unit.

    Attributes:
        start: its first prompt position.
        stop: one past its last prompt position.
        text: its tokens' readable strings joined (spaces and newlines kept).
        kind: "token"; for words "word", "punct" (punctuation or symbols, emoji included), "space" (whitespace
            only) or "special" (a chat-template token); for sentences "sentence", "space", "special" or "role" (a
            template's role name such as `user` after `<|im_start|>`).
    """

    start: int
    stop: int
    text: str
    kind: str

    @property
    def positions(self) -> range:
        return range(self.start, self.stop)

    def __len__(self) -> int:
        return self.stop - self.start


def is_special(token: str) -> bool:
    """Whether a readable token is a chat-template or other special token (`<|im_start|>`, `</s>`, `[INST]`)."""
    return _SPECIAL.fullmatch(token) is not None


def _normalised(positions: Sequence[int] | np.ndarray | None, n: int) -> list[int]:
    if positions is None:
        return list(range(n))
    return [p for p in np.unique(np.asarray(positions, dtype=np.int64)).tolist() if 0 <= p < n]


def token_groups(tokens: Sequence[str], positions: Sequence[int] | np.ndarray | None = None) -> list[Group]:
    """One group per token (the token granularity in the same form as the others).

    Args:
        tokens: the N readable prompt tokens.
        positions: which positions to cover (default all); out-of-range ones are dropped, the rest sorted.
    """
    return [
        Group(p, p + 1, tokens[p], "special" if is_special(tokens[p]) else "token")
        for p in _normalised(positions, len(tokens))
    ]


def _is_cjk(ch: str) -> bool:
    o = ord(ch)
    return (
        0x3040 <= o <= 0x30FF  # Hiragana, Katakana
        or 0x3400 <= o <= 0x4DBF
        or 0x4E00 <= o <= 0x9FFF
        or 0xF900 <= o <= 0xFAFF
        or 0xFF66 <= o <= 0xFF9F  # half-width Katakana
        or 0x20000 <= o <= 0x3FFFF
    )


def _is_punct(text: str) -> bool:
    """Punctuation or symbols only (emoji included); U+FFFD, a piece of a character split across tokens, is not."""
    core = text.strip()
    return bool(core) and all(unicodedata.category(ch)[0] in "PS" and ch != "\ufffd" for ch in core)


def _word_kind(token: str) -> str:
    if is_special(token):
        return "special"
    if token.strip() == "":
        return "newline" if "\n" in token else "space"  # "" counts as space: it joins what follows
    if _is_punct(token):
        return "punct"
    return "word"


def word_groups(tokens: Sequence[str], positions: Sequence[int] | np.ndarray | None = None) -> list[Group]:
    """Sub-word pieces merged into words, from the readable token strings.

    Rules, in order: a special token (`<|im_start|>`) is a group alone; so is a whitespace token holding a newline
    ("space"). A token of punctuation or symbols only is a group alone ("punct", with a space token just before it),
    except `.` or `,` between digits ("3.5", "1,000") and `'`, `’` or `-` between letters or digits ("don't",
    "well-known"), which join the word. Any other token starts a new word when it starts with whitespace (`Ġ`/`▁`
    pieces after `readable_tokens`), follows a group that is closed (punctuation, newline, special, a token ending in
    whitespace) or holds or follows a CJK character (those scripts have no spaces, so each of their tokens is a
    word); otherwise it continues the word. A token of spaces only (SentencePiece's lone `▁` before digits) starts a
    word that the next token joins. A gap in `positions` always ends a group.

    Args:
        tokens: the N readable prompt tokens (`Attribution.prompt_tokens`).
        positions: which positions to cover (default all); out-of-range ones are dropped, the rest sorted.

    Returns:
        Groups covering `positions` exactly once, in order, each a contiguous run.
    """
    pos = _normalised(positions, len(tokens))
    grouper = _WordGrouper(tokens, set(pos))
    prev = -2
    for p in pos:
        if p != prev + 1:
            grouper.close(prev)
            grouper.open_ = False
        grouper.add(p)
        prev = p
    grouper.close(prev)
    return grouper.out


class _WordGrouper:
    """`word_groups`' state: the group being built (its start, text and kind) and whether the next token may join."""

    def __init__(self, tokens: Sequence[str], chosen: set[int]) -> None:
        self.tokens, self.chosen = tokens, chosen
        self.out: list[Group] = []
        self.start, self.text, self.kind = -1, "", ""
        self.open_ = False  # whether the next token may join the current group

    def close(self, last: int) -> None:
        """End the current group at position `last` (inclusive), if there is one."""
        if self.start >= 0:
            self.out.append(Group(self.start, last + 1, self.text, self.kind))
        self.start = -1

    def begin(self, p: int, text: str, kind: str) -> None:
        self.close(p - 1)
        self.start, self.text, self.kind = p, text, kind

    def add(self, p: int) -> None:
        tok = self.tokens[p]
        tk = _word_kind(tok)
        if tk in ("special", "newline"):
            self.begin(p, tok, "special" if tk == "special" else "space")
            self.open_ = False
        elif tk == "space":
            if self.open_ and self.kind == "space":
                self.text += tok
            else:
                self.begin(p, tok, "space")
            self.open_ = True
        elif tk == "punct":
            self._punct(p, tok)
        else:
            self._word(p, tok)

    def _punct(self, p: int, tok: str) -> None:
        nxt = self.tokens[p + 1] if p + 1 in self.chosen else ""
        test = _CONNECTORS.get(tok)
        joins = self.open_ and self.kind == "word" and test and nxt[:1]
        if joins and test(self.text[-1]) and test(nxt[0]) and not _is_cjk(nxt[0]):
            self.text += tok  # "3.5", "don't": the next piece joins too
        elif self.open_ and self.kind == "space":
            self.text, self.kind, self.open_ = self.text + tok, "punct", False
        else:
            self.begin(p, tok, "punct")
            self.open_ = False

    def _word(self, p: int, tok: str) -> None:
        core = tok.lstrip()
        joins = self.open_ and (self.kind == "space" or (self.kind == "word" and core == tok))
        if joins and self.kind == "word" and (_is_cjk(self.text.rstrip()[-1]) or _is_cjk(core[0])):
            joins = False
        if joins:
            self.text, self.kind = self.text + tok, "word"
        else:
            self.begin(p, tok, "word")
        self.open_ = not tok[-1].isspace()


def _is_abbreviation(text: str, dot: int) -> bool:
    """Whether the single "." at `text[dot]` ends an abbreviation, an initial or a list number, not a sentence."""
    word = re.search(r"\S*$", text[:dot]).group().lstrip("\"'“‘([{")
    if word.lower() in _LATIN or (word[:1].isupper() and word.lower() in _TITLES):
        return True
    if re.fullmatch(r"[A-Z]|(?:[^\W\d_]\.)+[^\W\d_]", word):  # an initial, or dotted like "U.S"
        return True
    line = text[: dot - len(word)]
    at_line_start = line.rstrip(" \t") == "" or line.rstrip(" \t").endswith("\n")
    return at_line_start and re.fullmatch(r"\d{1,3}|[a-z]", word) is not None  # "1. Preheat", "a. first"


def sentence_starts(text: str) -> list[int]:
    """Character offsets in `text` where a new sentence begins (its first non-space character), 0 excluded.

    A sentence ends after `.`, `!`, `?`, `…` or `‽` (runs such as `?!` or `...` included) and any closing quotes or
    brackets after them, when whitespace follows; after `。`, `！`, `？` or `｡` (and closers) whether or not whitespace
    follows; and at every newline (blank lines included). A `.` does not end one before a lowercase letter
    ("e.g. the", "... and then"), after a known abbreviation (e.g., i.e., vs., et al. in any case; Mr., Dr., Fig.,
    No., Jan. capitalised), a single capital (an initial: "J. K. Rowling"), a dotted abbreviation ("U.S."; so one at
    the end of a sentence is missed), or a number or letter opening a line ("1. Preheat"). Decimals ("3.5") never
    split: no whitespace follows their dot.
    """
    starts = []
    for m in _SENTENCE_END.finditer(text):
        nxt = m.end()
        while nxt < len(text) and text[nxt].isspace():
            nxt += 1
        if nxt >= len(text) or not text[: m.start()].strip():
            continue  # nothing after it, or nothing before it (leading newlines)
        run = m.group("w")
        if run and set(run) <= {".", "…"}:
            if text[nxt].islower():
                continue
            if run == "." and _is_abbreviation(text, m.start("w")):
                continue
        if not starts or starts[-1] != nxt:
            starts.append(nxt)
    return starts


def sentence_groups(tokens: Sequence[str], positions: Sequence[int] | np.ndarray | None = None) -> list[Group]:
    """The tokens cut into sentences (see `sentence_starts` for where a sentence ends).

    Special tokens are groups alone ("special") and, like a gap in `positions`, split the text into runs that are
    cut separately. A token belongs to the sentence of its first non-space character; whitespace tokens join the
    sentence before them, so a sentence carries its trailing spaces and newlines. A token that straddles a sentence
    end (rare: tokenizers split at spaces and punctuation) goes whole to the sentence where it starts. A role name
    right after a special token (`<|im_start|>user`) is a "role" group: with `positions` left at all tokens the
    template's lines stay out of the user's sentences.

    Args:
        tokens: the N readable prompt tokens (`Attribution.prompt_tokens`).
        positions: which positions to cover (default all; `Attribution.user_positions` for the user's text).

    Returns:
        Groups covering `positions` exactly once, in order, each a contiguous run.
    """
    pos = _normalised(positions, len(tokens))
    out: list[Group] = []
    run: list[int] = []

    def flush() -> None:
        if not run:
            return
        text = "".join(tokens[p] for p in run)
        starts = sentence_starts(text)
        offset, sentence, members = 0, 0, []  # members: (position, sentence index)
        for p in run:
            tok = tokens[p]
            core = len(tok) - len(tok.lstrip())
            if core < len(tok):  # has a non-space character: its offset decides
                sentence = int(np.searchsorted(starts, offset + core, side="right"))
            members.append((p, sentence))
            offset += len(tok)
        i = 0
        while i < len(members):
            j = i
            while j + 1 < len(members) and members[j + 1][1] == members[i][1]:
                j += 1
            lo, hi = members[i][0], members[j][0] + 1
            sub = "".join(tokens[lo:hi])
            kind = "sentence" if sub.strip() else "space"
            if i == 0 and lo > 0 and is_special(tokens[lo - 1]) and sub.strip().lower() in _ROLES:
                kind = "role"
            out.append(Group(lo, hi, sub, kind))
            i = j + 1
        run.clear()

    for p in pos:
        if run and p != run[-1] + 1:
            flush()
        if is_special(tokens[p]):
            flush()
            out.append(Group(p, p + 1, tokens[p], "special"))
        else:
            run.append(p)
    flush()
    return out


_BLANK_LINE = re.compile(r"\n[^\S\n]*\n")


def paragraph_groups(tokens: Sequence[str], positions: Sequence[int] | np.ndarray | None = None) -> list[Group]:
    """The tokens cut into paragraphs: consecutive sentences (`sentence_groups`) up to and including one that ends
    with a blank line; special tokens, role names and gaps in `positions` also end a paragraph and stay groups
    alone. A paragraph's kind is "paragraph" ("space" when it is whitespace only)."""
    out: list[Group] = []
    current: list[Group] = []

    def close() -> None:
        if current:
            text = "".join(g.text for g in current)
            out.append(Group(current[0].start, current[-1].stop, text, "paragraph" if text.strip() else "space"))
            current.clear()

    for group in sentence_groups(tokens, positions):
        if group.kind in ("special", "role"):
            close()
            out.append(group)
            continue
        if current and current[-1].stop != group.start:
            close()
        current.append(group)
        if _BLANK_LINE.search(group.text):
            close()
    close()
    return out
