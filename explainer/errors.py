"""Typed errors with messages a user can act on. The UI turns them into `gr.Error`, the CLI into one line."""


class ExplainerError(Exception):
    """Base class of every error the library raises on purpose."""


class ModelLoadError(ExplainerError):
    """The model id or folder is unknown, unreadable or not a supported causal LM."""


class UnsupportedModelError(ExplainerError):
    """The model loaded but its attention cannot be captured (no attention layers, unsupported features)."""


class InputError(ExplainerError):
    """The user's input is unusable: empty prompt, prompt too long, unreadable file."""


class UnknownMethodError(ExplainerError, KeyError):
    """An attribution method name that is not in the registry."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class Cancelled(ExplainerError):
    """The request was cancelled (by the user, a closed browser tab or the caller's token) and stopped early."""
