"""The result layer: plain CPU data a request produces, and what is read from it without a model.

`Attribution` (tokens, per-method (K, N) scores, step scores, meta) and its file format (`schema`), prompt
segments (words, sentences, paragraphs), answer spans, steps, attention sinks, image maps and region queries.
"""

from .attribution import Attribution, MethodScores, load_result, zscore

__all__ = ["Attribution", "MethodScores", "load_result", "zscore"]
