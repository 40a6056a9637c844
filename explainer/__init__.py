"""Explain why a language model wrote what it wrote: per-token attribution maps (MACS and peers) while it generates."""

from .decoding.dispatch import generate_steps
from .errors import ExplainerError, InputError, ModelLoadError, UnknownMethodError, UnsupportedModelError
from .explain import decode_choice, explain, explain_request, stream_explain, stream_request
from .methods import METHODS, available_methods, get_method
from .models.loading import EMBEDDED_MODEL, ModelBundle, bundle_from_objects, load_model
from .request import ExplainRequest
from .result.attribution import Attribution, MethodScores, set_notebook_view, zscore


def _notebook_html(attr: Attribution) -> str:
    """A result in a notebook cell: its HTML report with the step slider (`visuals.report.notebook_html`)."""
    from visuals.report import notebook_html  # the views (Plotly, PIL) load only when a notebook shows a result

    return notebook_html(attr)


set_notebook_view(_notebook_html)  # Jupyter shows an Attribution through `Attribution._repr_html_`

__all__ = [
    "Attribution",
    "EMBEDDED_MODEL",
    "ExplainRequest",
    "ExplainerError",
    "InputError",
    "METHODS",
    "MethodScores",
    "ModelBundle",
    "ModelLoadError",
    "UnknownMethodError",
    "UnsupportedModelError",
    "available_methods",
    "bundle_from_objects",
    "decode_choice",
    "explain",
    "explain_request",
    "generate_steps",
    "get_method",
    "load_model",
    "stream_explain",
    "stream_request",
    "zscore",
]
