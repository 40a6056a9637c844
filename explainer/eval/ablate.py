"""The removal ablations that LDS and the top-k drop measure live in the method layer now (`methods/ablate.py`), where
Sources' surrogate runs the same batched passes; evaluation imports them from here as before."""

from ..methods.ablate import CPU_ROWS, has_sliding_window, response_logprobs

__all__ = ["CPU_ROWS", "has_sliding_window", "response_logprobs"]
