"""SQuAD data for `eval` and `bench`: the official SQuAD 2.0 layout as our rows, and the dev set downloaded once.

Two layouts hold the same questions:

- ours, one row per question: a list of rows or `{"rows": [...]}`, each
  `{id, title, question, context, answers: [{text, answer_start}]}`;
- the official SQuAD 2.0 layout (Rajpurkar et al., 2018, "Know What You Don't Know"):
  `{"data": [{"title", "paragraphs": [{"context", "qas": [{"id", "question", "answers", "is_impossible"}]}]}]}`.

`rows_from_official` turns the second into the first, keeping answerable questions only (the MACS paper's AUC-PR
needs a gold span) and dropping repeated answers. `resolve_data("squad_v2-dev")` downloads the official dev set once
into `models.cache_root()/data/`, converted, and reuses that file afterwards (`squad_v2-train`, the training set, for
`calibrate`); any other value is a local path. `select_rows` picks the questions an ids file names (`--ids`), by
id or by a key of their text (`question_key`), so that a committed list of questions reproduces a run on data anyone
can download.
"""

from __future__ import annotations

import hashlib
import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError
from ..models.loading import cache_root
from ..result.segments import sentence_starts
from ..runtime.files import write_atomically

SQUAD_V2_DEV = "squad_v2-dev"
SQUAD_V2_TRAIN = "squad_v2-train"  # for `calibrate`: training questions, never the evaluated ones (~40 MB)
DOWNLOADS = {  # data set name -> official file (CC BY-SA 4.0)
    SQUAD_V2_DEV: "https://rajpurkar.github.io/SQuAD-explorer/dataset/dev-v2.0.json",
    SQUAD_V2_TRAIN: "https://rajpurkar.github.io/SQuAD-explorer/dataset/train-v2.0.json",
}
DOWNLOAD_TIMEOUT = 30.0  # seconds to connect and between reads; a stalled download fails with the offline message
_open_url = urllib.request.urlopen  # tests replace it; nothing here touches the network otherwise


def is_official_layout(data: Any) -> bool:
    """Whether parsed JSON has the official SQuAD layout (`{"data": [{"paragraphs": [...]}, ...]}`)."""
    return (
        isinstance(data, dict)
        and isinstance(data.get("data"), list)
        and all(isinstance(a, dict) and "paragraphs" in a for a in data["data"])
    )


def rows_from_official(data: dict[str, Any], answerable_only: bool = True) -> list[dict[str, Any]]:
    """One row per question of an official-layout SQuAD file, in file order.

    Args:
        data: the parsed file (`is_official_layout(data)`).
        answerable_only: drop questions marked `is_impossible` or without answers.

    Returns:
        Rows `{id, title, question, context, answers: [{text, answer_start}]}`; an answer given by several
        annotators (same text, same start) appears once, where it first appears.

    Raises:
        InputError: an article, paragraph or question without the keys above.
    """
    rows = []
    try:
        for article in data["data"]:
            title = str(article.get("title", ""))
            for paragraph in article["paragraphs"]:
                context = str(paragraph["context"])
                for qa in paragraph["qas"]:
                    row = {"id": str(qa["id"]), "title": title, "question": str(qa["question"]), "context": context}
                    seen = dict.fromkeys((str(a["text"]), int(a["answer_start"])) for a in qa.get("answers", []))
                    row["answers"] = [{"text": t, "answer_start": start} for t, start in seen]  # annotator order
                    if not (answerable_only and (qa.get("is_impossible") or not row["answers"])):
                        rows.append(row)
    except KeyError as e:
        raise InputError(f"Not a SQuAD 2.0 file: an article, paragraph, question or answer lacks {e}.") from e
    except (TypeError, ValueError, AttributeError) as e:
        raise InputError(f"Not a SQuAD 2.0 file: malformed entry ({e}).") from e
    return rows


def cached_file(name: str) -> Path:
    """Where the converted copy of a named data set is kept (it may not exist yet)."""
    return cache_root() / "data" / f"{name}-answerable.json"


def download(name: str) -> Path:
    """The converted copy of a named data set, downloaded and converted on the first call only.

    Raises:
        InputError: an unknown name, or the download failed (offline, blocked, not a SQuAD file); the message says
            how to download the file by hand and pass its path.
    """
    if name not in DOWNLOADS:
        raise InputError(f"Unknown data set {name!r}; known: {', '.join(DOWNLOADS)}.")
    target = cached_file(name)
    if target.is_file():
        return target
    url = DOWNLOADS[name]
    try:
        with _open_url(url, timeout=DOWNLOAD_TIMEOUT) as response:
            data = json.loads(response.read().decode("utf-8"))
    except (OSError, ValueError) as e:  # URLError, timeouts and HTTP errors are OSErrors; bad JSON a ValueError
        reason = getattr(e, "reason", None) or e
        raise InputError(
            f"Could not download {name} from {url} ({reason}). Download that file yourself and pass its path: "
            f"--data dev-v2.0.json"
        ) from e
    if not is_official_layout(data):
        raise InputError(f"{url} did not return a SQuAD 2.0 file. Download it yourself and pass its path with --data.")
    rows = rows_from_official(data)
    payload = {"source": f"SQuAD 2.0 dev set (CC BY-SA 4.0), answerable questions, from {url}", "rows": rows}
    return write_atomically(target, json.dumps(payload).encode("utf-8"))  # a concurrent or interrupted run never
    # sees half a file


def resolve_data(name_or_path: str | Path) -> Path:
    """A local SQuAD file for `--data`: a named data set (`squad_v2-dev`, downloaded once) or an existing path.

    Raises:
        InputError: the path does not exist, or the download failed.
    """
    if str(name_or_path) in DOWNLOADS:
        return download(str(name_or_path))
    path = Path(name_or_path)
    if not path.is_file():
        raise InputError(
            f"Cannot read data file {str(name_or_path)!r}: no such file. Pass a SQuAD-format JSON file, or "
            f"{SQUAD_V2_DEV} to download the SQuAD 2.0 dev set once."
        )
    return path


def question_key(row: dict[str, Any]) -> str:
    """A row's key made from its text, not its id: the first 16 hex digits of the SHA-1 of its title, context and
    question (joined by newlines), so that a list of keys picks the same questions out of any copy of the data."""
    text = "\n".join(str(row.get(k, "")) for k in ("title", "context", "question"))
    return hashlib.sha1(text.encode("utf-8")).hexdigest()[:16]


def select_rows(rows: list[dict[str, Any]], ids_path: str | Path) -> list[dict[str, Any]]:
    """The rows an ids file names, in the file's order (`--ids`): a list of questions anyone can take from data they
    can get (e.g. `squad_v2-dev`) without shipping the data.

    Each non-blank line (text after "#" ignored) is `ID` or `ID KEY`: a row matches when its id or its
    `question_key` is KEY (or, without KEY, when its id is ID), and it is returned with the id ID, so that results
    keep the ids (and the ablation masks seeded by them) of the runs that first measured those questions.

    Raises:
        InputError: the file cannot be read, a line has more than two fields, or a line matches no row.
    """
    try:
        lines = Path(ids_path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"Cannot read ids file {str(ids_path)!r}: {e}") from e
    by_id = {str(r["id"]): r for r in rows}
    by_key: dict[str, dict[str, Any]] = {}
    for r in rows:
        by_key.setdefault(question_key(r), r)
    out, missing = [], []
    for number, line in enumerate(lines, start=1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        if len(fields) > 2:
            raise InputError(f"{str(ids_path)!r} line {number}: expected 'ID' or 'ID KEY', got {line.strip()!r}.")
        name, key = fields[0], fields[-1]
        row = by_id.get(key) or by_key.get(key) or by_id.get(name)
        if row is None:
            missing.append(name)
        else:
            out.append({**row, "id": name})
    if missing:
        raise InputError(
            f"{len(missing)} questions of {str(ids_path)!r} are not in the data (first: {missing[0]!r}); the ids file "
            "names questions of another data set or version."
        )
    return out


HAYSTACK_PARAGRAPHS = 10  # the question's own paragraph among 9 from other articles: ~1,500-2,000 tokens
HAYSTACK_SEPARATOR = "\n\n"


def _sentence_span(text: str, start: int) -> tuple[int, int]:
    """(start, end) characters of the sentence of `text` holding character `start` (`segments.sentence_starts`)."""
    starts = [s for s in sentence_starts(text) if 0 < s < len(text)]
    begin = max([0, *[s for s in starts if s <= start]])
    end = min([len(text), *[s for s in starts if s > start]])
    return begin, end


def haystack_rows(rows: list[dict[str, Any]], paragraphs: int = HAYSTACK_PARAGRAPHS, seed: int = 0) -> list[dict]:
    """Long-context "which passage supports the answer?" rows built from SQuAD rows.

    Each row's own paragraph is placed at a random position among `paragraphs - 1` distinct paragraphs of *other*
    articles (by title) from the same rows, joined by blank lines; the choice depends only on `seed` and the row's
    index, so anyone can rebuild the same prompts. Answers are moved to their place in the new context.

    Returns:
        Rows `{id, title, question, context, answers, source_id, gold_paragraph: [start, end], gold_sentence:
        [start, end]}` (character spans in `context`; the gold sentence holds the first answer).

    Raises:
        InputError: too few paragraphs of other articles.
    """
    pool = list({(r["title"], r["context"]): None for r in rows})  # distinct paragraphs, in file order
    out = []
    for i, row in enumerate(rows):
        others = [p for t, p in pool if t != row["title"] and p != row["context"]]
        if len(others) < paragraphs - 1:
            raise InputError(f"Row {row['id']!r}: {len(others)} paragraphs of other articles, {paragraphs - 1} needed.")
        rng = np.random.default_rng([seed, i])
        chosen = [others[j] for j in rng.choice(len(others), paragraphs - 1, replace=False)]
        where = int(rng.integers(paragraphs))
        parts = chosen[:where] + [row["context"]] + chosen[where:]
        offset = sum(len(p) + len(HAYSTACK_SEPARATOR) for p in parts[:where])
        answers = [{"text": a["text"], "answer_start": a["answer_start"] + offset} for a in row["answers"]]
        sentence = _sentence_span(row["context"], row["answers"][0]["answer_start"])
        out.append({
            "id": f"haystack:{row['id']}", "title": row["title"], "question": row["question"],
            "context": HAYSTACK_SEPARATOR.join(parts), "answers": answers, "source_id": row["id"],
            "gold_paragraph": [offset, offset + len(row["context"])],
            "gold_sentence": [offset + sentence[0], offset + sentence[1]],
        })  # fmt: skip
    return out
