"""Image reliance, drawn: did each answer token come from the image, or from the text alone?

Reads `Attribution.reliance` (`explainer/result/reliance.py`): the strip shows the answer with every token coloured
by its drop in log-probability when the image is hidden from the answer (red: the token needed the image; white: the
text alone gives it; blue: the image argued against it), the token on the step slider outlined; its hover title and
the line under the strip give the probabilities and each method's share of its evidence on the image. The CLI
prints the same numbers (`reliance_lines`).

Pure: an `Attribution` in, HTML or text out; no model.
"""

from __future__ import annotations

import html
import math

from explainer.result.attribution import Attribution
from explainer.result.reliance import Reliance
from explainer.result.steps import clamp_step
from visuals.heatmap import diverging_color, visible_whitespace

DROP_SCALE = 3.0  # nats at full colour: hiding the image makes the token e^3 ~ 20x less likely
STRONG_DROP = 1.0  # nats: tokens that lost at least this much (a factor e) are also bold, so colour is not the only cue
_TEXT, _MUTED = "#1f2328", "#57606a"
_CARD = (
    f"background:#ffffff;color:{_TEXT};border:1px solid #d0d7de;border-radius:8px;padding:10px 12px;"
    "font-family:ui-sans-serif,system-ui,-apple-system,'Segoe UI',sans-serif;"
)
_FLOW = "white-space:pre-wrap;word-break:break-word;line-height:1.9;font-size:15px;"
_SELECTED = "outline:2px solid #cf222e;outline-offset:1px;"
TITLE = "Image reliance per answer token"
NO_IMAGE = "Image reliance is measured for image questions only."
LIVE = "Image reliance appears when the answer is complete: one more pass hides the image from the answer."
NOT_MEASURED = (
    "This result has no image reliance: it was turned off, the request stopped early, or the file was saved before "
    "it existed."
)


def _note(text: str) -> str:
    return f'<div style="font-size:13px;color:{_MUTED};margin:4px 0;">{html.escape(text)}</div>'


def _p(logp: float) -> str:
    if not math.isfinite(logp):
        return "?"
    p = math.exp(logp)
    return f"{p:.3f}" if p >= 0.001 else f"{p:.1e}"


def _shares_text(rel: Reliance, step: int, sep: str = ", ") -> str:
    parts = [f"{name} {'–' if math.isnan(float(s[step])) else f'{float(s[step]):.2f}'}" for name, s in
             rel.image_share.items()]  # fmt: skip
    return sep.join(parts)


def _even(rel: Reliance) -> str:
    even = rel.even_share
    return "" if math.isnan(even) else f" (an even spread: {even:.2f})"


def _token_title(attr: Attribution, rel: Reliance, step: int) -> str:
    lp, hidden, drop = float(rel.logprob[step]), float(rel.image_hidden_logprob[step]), float(rel.drop[step])
    title = (
        f"step {step + 1}: '{visible_whitespace(attr.generated_tokens[step])}' · p {_p(lp)} with the image, "
        f"{_p(hidden)} with it hidden from the answer: drop {drop:+.2f} nats"
    )
    if rel.image_share:
        title += f" · share of each method's evidence on the image: {_shares_text(rel, step)}{_even(rel)}"
    return title


def _token_html(attr: Attribution, rel: Reliance, step: int, selected: bool) -> str:
    drop = float(rel.drop[step])
    style = f"border-radius:3px;padding:1px 0;background:{diverging_color(drop, DROP_SCALE)};"
    if math.isfinite(drop) and abs(drop) >= 0.75 * DROP_SCALE:
        style += "color:#fff;"
    if math.isfinite(drop) and drop >= STRONG_DROP:
        style += "font-weight:700;"
    mark = ' data-selected="true"' if selected else ""
    token = attr.generated_tokens[step]
    text = html.escape(token.replace("\r", ""), quote=False).replace("\n", "⏎<br>") if token else "∅"
    return (
        f'<span class="xai-rel" data-step="{step}" data-drop="{drop:.4f}"{mark} '
        f'style="{style}{_SELECTED if selected else ""}" title="{html.escape(_token_title(attr, rel, step))}">'
        f"{text}</span>"
    )


def _legend() -> str:
    stops = ", ".join(diverging_color(DROP_SCALE * (i - 8) / 8, DROP_SCALE) for i in range(17))
    return (
        '<div class="xai-legend" style="display:flex;align-items:center;gap:10px;flex-wrap:wrap;font-size:12px;'
        f'margin-top:8px;color:{_TEXT};"><span>drop in log p when the image is hidden</span>'
        '<div style="width:200px;" aria-hidden="true"><div style="height:10px;border:1px solid #d0d7de;'
        f'border-radius:2px;background:linear-gradient(to right, {stops});"></div>'
        '<div style="display:flex;justify-content:space-between;">'
        f"<span>{-DROP_SCALE:+.0f}</span><span>0</span><span>{DROP_SCALE:+.0f} nats</span></div></div>"
        f'<span style="color:{_MUTED};">red, bold: needed the image · white: the text alone gives it · blue: the '
        "image argued against it · hover a token for its numbers</span></div>"
    )


def _usable(attr: Attribution) -> Reliance | None:
    rel = attr.reliance
    return rel if isinstance(rel, Reliance) and rel.num_steps == attr.num_steps > 0 else None


def reliance_html(attr: Attribution | None, step: int | None = None) -> str:
    """The answer coloured by each token's reliance on the image, the token at `step` outlined and described.

    Args:
        attr: the result; its `reliance` is drawn (a note instead when it has none: a text prompt, a live answer, a
            result without it).
        step: 0-based answer step described under the strip; None is the last, out-of-range values are clamped.

    Returns:
        An HTML fragment (`xai-reliance`); each token is a `span.xai-rel` with `data-step` and `data-drop` (nats).
    """
    head = f'<div style="font-weight:600;font-size:14px;margin-bottom:4px;">{TITLE}</div>'
    if not isinstance(attr, Attribution) or not attr.image:
        return f'<div class="xai-reliance" style="{_CARD}">{head}{_note(NO_IMAGE)}</div>'
    rel = _usable(attr)
    if rel is None:
        live = attr.meta.get("status", "done") != "done"
        why = LIVE if live else str(attr.meta.get("reliance_error") or NOT_MEASURED)
        return f'<div class="xai-reliance" style="{_CARD}">{head}{_note(why)}</div>'
    s = clamp_step(step, rel.num_steps)
    tokens = "".join(_token_html(attr, rel, i, i == s) for i in range(rel.num_steps))
    return (
        f'<div class="xai-reliance" style="{_CARD}">{head}<div style="{_FLOW}">{tokens}</div>'
        f"{_note(_token_title(attr, rel, s))}{_legend()}</div>"
    )


def reliance_lines(attr: Attribution) -> list[str]:
    """The reliance as text, a line per answer token (the CLI's print); [] when the result has none."""
    rel = _usable(attr)
    if rel is None:
        return []
    lines = [
        "image reliance: log p of each token with the image visible / hidden from the answer, and the drop (nats; "
        "> 0: the token needed the image)",
        f"image share: each method's positive evidence on the image against the question's text{_even(rel)}",
    ]
    for k, token in enumerate(attr.generated_tokens):
        line = (
            f"  step {k + 1:3d} {token!r:>14}: log p {float(rel.logprob[k]):8.3f} / "
            f"{float(rel.image_hidden_logprob[k]):8.3f}  drop {float(rel.drop[k]):+7.3f}"
        )
        if rel.image_share:
            line += "  | share " + _shares_text(rel, k, "  ")
        lines.append(line)
    return lines
