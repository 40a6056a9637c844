"""AtMan (AtMan paper, sections 3.1-3.3): the method and its batched suppression passes (`method`), its options
(`config`), the correlated-suppression factors (`factors`) and its cost model for the time estimates (`cost`)."""

from .config import AtManConfig
from .method import AtMan, atman_scores, prefix_pass_bytes, suppression_scores

__all__ = ["AtMan", "AtManConfig", "atman_scores", "prefix_pass_bytes", "suppression_scores"]
