"""The one rule for text from outside: every string a visitor, a saved result, a model (its tokens, its name) or an
error message brings is escaped here before it is put into Markdown, HTML or a toast.

Gradio draws `gr.Markdown` as Markdown with inline HTML (its sanitizer keeps `<a>` and `<img>`, so a saved result's
model name could draw a link or make the browser fetch an address), and its toasts (`gr.Error`, `gr.Warning`,
`gr.Info`) as HTML. So:

- `html_text`: for HTML text content and toasts, `html.escape` of `&`, `<` and `>` (quotes stay readable: this is
  not for attribute values, and an API caller reads the same message as JSON): the text shows as typed, no tag is
  made.
- `markdown_text`: for Markdown, the same plus a backslash before each punctuation character that starts Markdown
  (`[x](url)`, `![](url)`, `*`, `_`, `#`, backticks, `~`, `$`, `|`, `@`, the `:` of `http://`, the `.` of `www.`, a
  leading `-` or `1.`), and line breaks as spaces: CommonMark shows a backslash-escaped punctuation character as
  itself, so the text shows as typed and draws no link, image, emphasis, list or heading. Other text (`.`, `-`,
  `:`, brackets) is left alone, so the Markdown source stays readable.
- `markdown_code`: a code span of the text (for model ids), fenced so that no backtick in it ends the span.

Prefer a component that cannot render markup (a Textbox, a Dataframe's "str" cell, a Dropdown's labels) where the
text is plain; the views (`visuals/`) escape their own HTML with `html.escape` (pure functions, no gradio).
"""

from __future__ import annotations

import html
import re
from typing import Any

_INLINE = re.compile(r"([\\`*_\[\]!|~$#+@])")  # links, images, code, emphasis, tables, maths, headings, emails
_AUTOLINK = re.compile(r"(?i)(:)(?=//)|(?<=www)(\.)")  # GFM links bare http:// and www. addresses
_LINE_START = re.compile(r"^(\s*)(-|\d+[.)])")  # a list item, were the text the line's start


def html_text(text: Any) -> str:
    """`text` (any value, as `str`) safe as HTML text content or a toast: shown as typed, no tag or entity made."""
    return html.escape(str(text), quote=False)


def markdown_text(text: Any) -> str:
    """`text` (any value, as `str`) safe inside Markdown: shown as typed, with no link, image, tag or formatting."""
    text = _AUTOLINK.sub(lambda m: "\\" + m.group(0), _INLINE.sub(r"\\\1", str(text)))
    text = text.replace("\r", " ").replace("\n", " ")
    text = _LINE_START.sub(lambda m: m.group(1) + m.group(2)[:-1] + "\\" + m.group(2)[-1], text)
    return html_text(text)


def markdown_code(text: Any) -> str:
    """`text` as a Markdown code span (shown verbatim in a monospace font), whatever backticks it holds."""
    text = str(text).replace("\r", " ").replace("\n", " ")
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence, pad = "`" * (longest + 1), " " if text[:1] == "`" or text[-1:] == "`" else ""  # CommonMark strips the pad
    return f"{fence}{pad}{text}{pad}{fence}"
