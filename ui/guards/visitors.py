"""Who is asking: the one place a request's visitor is named, for the per-visitor limits and fair admission
(`ui/guards/admission.py`).

A visitor is Gradio's session (one per page load, and one per `gradio_client.Client`). Behind a trusted proxy (a
Hugging Face Space, or any box whose operator sets `EXPLAINER_TRUSTED_PROXIES` to the number of proxies in front of
the app) it is the client's address instead, so a script cannot become many visitors by opening many sessions. The
address is the entry the nearest trusted proxy appended to X-Forwarded-For (the N-th from the end for N proxies):
entries before it were written by the client and could be anything. Without a trusted proxy the header is ignored.
"""

from __future__ import annotations

import os
from typing import Any

TRUSTED_PROXIES_ENV = "EXPLAINER_TRUSTED_PROXIES"  # proxies in front of the app whose X-Forwarded-For is believed
SPACE_ENV = "SPACE_ID"  # set by Hugging Face on a Space, which sits behind one proxy


def trusted_proxies() -> int:
    """How many proxies in front of the app append to X-Forwarded-For: `EXPLAINER_TRUSTED_PROXIES`, else 1 on a
    Space, else 0 (the header is ignored)."""
    value = os.environ.get(TRUSTED_PROXIES_ENV, "").strip()
    if value:
        try:
            return max(0, int(value))
        except ValueError:
            return 0
    return 1 if os.environ.get(SPACE_ENV) else 0


def forwarded_address(headers: Any, proxies: int) -> str | None:
    """The client's address as the nearest of `proxies` trusted proxies saw it, from X-Forwarded-For; None when the
    header has fewer entries than that (the request did not come through them)."""
    if proxies < 1 or headers is None:
        return None
    lines = headers.getlist("x-forwarded-for") if hasattr(headers, "getlist") else [headers.get("x-forwarded-for")]
    entries = [part.strip() for line in lines if line for part in str(line).split(",") if part.strip()]
    return entries[-proxies] if len(entries) >= proxies else None


def visitor_key(request: Any) -> str:
    """The visitor of a Gradio request (`gr.Request`, or None outside a request): "address:..." behind a trusted
    proxy, else "session:..." (Gradio's session hash), else the direct peer's address."""
    if request is None:
        return "anonymous"
    address = forwarded_address(getattr(request, "headers", None), trusted_proxies())
    if address:
        return f"address:{address}"
    session = getattr(request, "session_hash", None)
    if session:
        return f"session:{session}"
    client = getattr(request, "client", None)
    return f"address:{getattr(client, 'host', None) or 'unknown'}"
