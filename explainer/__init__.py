"""Explain why a language model wrote what it wrote: per-token attribution maps (MACS and peers) while it generates."""

from .decode import generate_steps
from .errors import ExplainerError, InputError, ModelLoadError, UnknownMethodError, UnsupportedModelError
from .explain import explain, explain_request, stream_explain, stream_request
from .methods import METHODS, available_methods, get_method
from .models.loading import EMBEDDED_MODEL, ModelBundle, bundle_from_objects, load_model
from .request import ExplainRequest
from .result.attribution import Attribution, MethodScores, zscore

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
    "explain",
    "explain_request",
    "generate_steps",
    "get_method",
    "load_model",
    "stream_explain",
    "stream_request",
    "zscore",
]
