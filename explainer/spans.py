"""Spans of the answer, words and sentences of the prompt: maps aggregated over answer steps and prompt groups.

Pure numpy on an `Attribution`; no model. Three steps, each usable alone:

1. `span_scores`: one method's map over an inclusive range of answer steps `[first, last]`, the **mean of the
   per-step z-scores** (a single step is the span `[k, k]`).
2. `word_groups` / `sentence_groups` (or `groups` by name): the prompt positions cut into consecutive runs of
   tokens, each with its text; together they cover the chosen positions exactly once, in order.
3. `group_scores`: a group's score is the **mean of its tokens' z-scores**. This keeps the token view's units (a
   score of +1 means "one standard deviation above the average token", whatever the method), so groups compare
   across methods and with the token view, and a long sentence is not favoured over a short one as a sum would.

`top_sentences` chains the three. Steps are 0-based indices into the generated tokens, as everywhere in the library.
"""

from __future__ import annotations

import math
import operator
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .errors import InputError
from .result import Attribution, zscore

GRANULARITIES = ("token", "word", "sentence")

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


@dataclass(frozen=True)
class ScoredGroup:
    """A group with its score and 1-based rank (see `top_sentences`)."""

    rank: int
    score: float
    group: Group

    @property
    def text(self) -> str:
        return self.group.text

    @property
    def positions(self) -> range:
        return self.group.positions


def is_special(token: str) -> bool:
    """Whether a readable token is a chat-template or other special token (`<|im_start|>`, `</s>`, `[INST]`)."""
    return _SPECIAL.fullmatch(token) is not None


def shown_positions(attr: Attribution, user_only: bool = True) -> tuple[np.ndarray, bool]:
    """The prompt positions a view shows, as the token heatmap chooses them.

    Returns:
        (n,) int64 ascending positions: `attr.user_positions` when `user_only` and there are any, else all N; and
        whether they are that user subset (then z-scores are re-standardised over them, see `span_scores`).
    """
    n = len(attr.prompt_tokens)
    if user_only and attr.user_positions:
        pos = np.unique(np.asarray([p for p in attr.user_positions if 0 <= p < n], dtype=np.int64))
        if pos.size:
            return pos, True
    return np.arange(n, dtype=np.int64), False


def _step_index(value, name: str) -> int:
    if isinstance(value, bool):
        raise InputError(f"The span's {name} step must be a whole number, got {value!r}.")
    if isinstance(value, float) and value.is_integer():
        return int(value)
    try:
        return operator.index(value)
    except TypeError:
        raise InputError(f"The span's {name} step must be a whole number, got {value!r:.40}.") from None


def span_range(num_steps: int, first=None, last=None) -> tuple[int, int]:
    """Validate an inclusive, 0-based range of answer steps against an answer of `num_steps` tokens.

    Args:
        num_steps: how many steps there are (K).
        first: first step; None means the newest (K - 1).
        last: last step, inclusive; None means `first` (a single step).

    Returns:
        (first, last) as ints with 0 <= first <= last < K.

    Raises:
        InputError: no steps, steps that are not whole numbers, reversed or out of range (the message counts answer
            tokens from 1, as the app shows them).
    """
    k = int(num_steps)
    if k <= 0:
        raise InputError("There are no scored answer tokens yet: generate an answer first.")
    first = k - 1 if first is None else _step_index(first, "first")
    last = first if last is None else _step_index(last, "last")
    if first > last:
        raise InputError(f"The span runs backwards: answer token {first + 1} to {last + 1}. Put the earlier one first.")
    if first < 0 or last >= k:
        raise InputError(
            f"The span covers answer tokens {first + 1} to {last + 1}, but there are scores for tokens 1 to {k}."
        )
    return first, last


def check_span(attr: Attribution, method: str, first=None, last=None) -> tuple[int, int]:
    """Validate an inclusive, 0-based range of answer steps for one method's scores.

    Args:
        attr: the generation; `attr.methods[method].raw` is (K, N).
        method: the method whose K scored steps bound the range.
        first: first step, 0-based; None is the newest.
        last: last step, inclusive; None means `first` (a single step).

    Returns:
        (first, last) as ints with 0 <= first <= last < K.

    Raises:
        InputError: an unknown method, or as in `span_range`.
    """
    if method not in attr.methods:
        have = ", ".join(attr.methods) or "none"
        raise InputError(f"This result has no scores for the method {method!r}; it has: {have}.")
    try:
        return span_range(attr.methods[method].raw.shape[0], first, last)
    except InputError as e:
        raise InputError(f"{method}: {e}") from None
    return first, last


def span_scores(
    attr: Attribution, method: str, first=None, last=None, positions: Sequence[int] | np.ndarray | None = None
) -> np.ndarray:
    """One method's map over the answer steps `first..last` (inclusive): the mean of the per-step z-scores.

    Each step's row is z-scored on its own first, so every step weighs the same whatever the spread of its raw
    scores; averaging the raw scores instead would let one peaked step dominate the span. At a position, steps where
    it has no score (NaN) are skipped; a position with no score at any step of the span stays NaN.

    Args:
        attr: the generation; `attr.methods[method]` holds (K, N) `raw` and `z`.
        method: which method's scores.
        first: first step, 0-based; None is the newest.
        last: last step, inclusive; None means `first`.
        positions: None uses the stored z-scores (standardised over all N prompt tokens); otherwise each step's raw
            row is re-standardised over these positions (those with a finite score), as the token heatmap does for
            the user's tokens, and every other position is NaN.

    Returns:
        (N,) float32.

    Raises:
        InputError: see `check_span`.
    """
    first, last = check_span(attr, method, first, last)
    scores = attr.methods[method]
    if positions is None:
        z = np.asarray(scores.z[first : last + 1], dtype=np.float64)  # (S, N)
    else:
        pos = np.asarray(positions, dtype=np.int64)
        raw = np.asarray(scores.raw[first : last + 1], dtype=np.float32)  # (S, N)
        z = np.stack([zscore(row[None, :], pos[np.isfinite(row[pos])])[0] for row in raw]).astype(np.float64)
    known = np.isfinite(z)  # (S, N)
    count = known.sum(axis=0)  # (N,)
    total = np.where(known, z, 0.0).sum(axis=0)  # (N,)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / count, np.nan).astype(np.float32)


def group_scores(z: np.ndarray, groups: Sequence[Group]) -> np.ndarray:
    """Each group's score: the mean of its tokens' z-scores, skipping tokens with no score (NaN).

    Args:
        z: (N,) token z-scores of one step or a span (`span_scores`).
        groups: groups of positions into `z`.

    Returns:
        (G,) float32; NaN for a group none of whose tokens has a score.
    """
    z = np.asarray(z, dtype=np.float64)  # (N,)
    if z.ndim != 1:
        raise ValueError(f"expected an (N,) row of z-scores, got shape {z.shape}")
    if not groups:
        return np.zeros(0, dtype=np.float32)
    starts = np.asarray([g.start for g in groups], dtype=np.int64)  # (G,)
    stops = np.asarray([g.stop for g in groups], dtype=np.int64)  # (G,)
    known = np.isfinite(z)
    total = np.concatenate([[0.0], np.cumsum(np.where(known, z, 0.0))])  # (N + 1,) prefix sums
    count = np.concatenate([[0], np.cumsum(known)])  # (N + 1,)
    n = count[stops] - count[starts]  # (G,)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, (total[stops] - total[starts]) / n, np.nan).astype(np.float32)


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
    chosen = set(pos)
    out: list[Group] = []
    start, text, kind = -1, "", ""
    open_ = False  # whether the next token may join the current group

    def close() -> None:
        nonlocal start
        if start >= 0:
            out.append(Group(start, prev + 1, text, kind))
        start = -1

    prev = -2
    for p in pos:
        tok = tokens[p]
        if p != prev + 1:
            close()
            open_ = False
        tk = _word_kind(tok)
        if tk in ("special", "newline"):
            close()
            start, text, kind, open_ = p, tok, "special" if tk == "special" else "space", False
        elif tk == "space":
            if open_ and kind == "space":
                text += tok
            else:
                close()
                start, text, kind = p, tok, "space"
            open_ = True
        elif tk == "punct":
            nxt = tokens[p + 1] if p + 1 in chosen else ""
            test = _CONNECTORS.get(tok)
            if (
                open_
                and kind == "word"
                and test
                and nxt[:1]
                and test(text[-1])
                and test(nxt[0])
                and not _is_cjk(nxt[0])
            ):
                text += tok  # "3.5", "don't": the next piece joins too
            elif open_ and kind == "space":
                text, kind, open_ = text + tok, "punct", False
            else:
                close()
                start, text, kind, open_ = p, tok, "punct", False
        else:
            core = tok.lstrip()
            joins = open_ and (kind == "space" or (kind == "word" and core == tok))
            if joins and kind == "word" and (_is_cjk(text.rstrip()[-1]) or _is_cjk(core[0])):
                joins = False
            if joins:
                text, kind = text + tok, "word"
            else:
                close()
                start, text, kind = p, tok, "word"
            open_ = not tok[-1].isspace()
        prev = p
    close()
    return out


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


def groups(attr: Attribution, granularity: str, user_only: bool = True) -> list[Group]:
    """The groups of one granularity over the positions a view shows (`shown_positions`).

    Args:
        attr: the generation; only its prompt tokens and user positions are read.
        granularity: "token", "word" or "sentence".
        user_only: only the user's own text (falls back to all tokens when there is none).

    Raises:
        InputError: an unknown granularity (the message lists the valid ones).
    """
    builders = {"token": token_groups, "word": word_groups, "sentence": sentence_groups}
    if granularity not in builders:
        raise InputError(f"Unknown granularity {granularity!r}; choose one of: {', '.join(GRANULARITIES)}.")
    pos, _ = shown_positions(attr, user_only)
    return builders[granularity](attr.prompt_tokens, pos)


def top_sentences(
    attr: Attribution, method: str, first=None, last=None, k: int = 3, user_only: bool = True
) -> list[ScoredGroup]:
    """The k sentences of the prompt that support the answer span most, for one method.

    Sentences come from `sentence_groups` over `shown_positions`, scored by `group_scores` on `span_scores` (z
    re-standardised over the user's tokens when `user_only`, as in the token view). Only "sentence" groups are
    ranked (not special tokens, role names or whitespace), and not those with no score.

    Args:
        attr: the generation and its scores.
        method: which method's scores.
        first: first answer step, 0-based; None is the newest.
        last: last answer step, inclusive; None means `first`.
        k: how many at most.
        user_only: as in `shown_positions`.

    Returns:
        Up to k entries, best first (ties keep prompt order), ranks from 1.

    Raises:
        InputError: see `check_span`.
    """
    pos, subset = shown_positions(attr, user_only)
    z = span_scores(attr, method, first, last, pos if subset else None)  # (N,)
    sentences = sentence_groups(attr.prompt_tokens, pos)
    scores = group_scores(z, sentences)  # (G,)
    order = np.argsort(-np.nan_to_num(scores, nan=-np.inf), kind="stable").tolist()  # ties keep prompt order
    ranked = [i for i in order if sentences[i].kind == "sentence" and math.isfinite(scores[i])]
    return [ScoredGroup(r, float(scores[i]), sentences[i]) for r, i in enumerate(ranked[: max(int(k), 0)], start=1)]
