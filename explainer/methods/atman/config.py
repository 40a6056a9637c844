"""AtMan's options (the defaults are the AtMan paper's) and the CPU's batch of perturbed rows."""

from __future__ import annotations

from dataclasses import dataclass

CPU_BATCH_ROWS = 8  # perturbed rows per pass on a CPU, where throughput peaks well before


@dataclass
class AtManConfig:
    suppression_factor: float = 0.1  # attention weight to a suppressed token is scaled by this before renormalising;
    # 1 suppresses nothing (every score is exactly 0)
    correlated: bool = True  # section 3.3: also suppress prompt tokens with similar input embeddings
    cosine_threshold: float = 0.6  # kappa: embedding cosine similarity from which a prompt token counts as correlated
    batch_size: int = 0  # most perturbed sequences per forward pass, besides its one unperturbed row; 0: from the
    # device (`kv.batch_budget`: 8 on a CPU, from the free memory on a GPU); fewer when they are long
    fast: bool = True  # reuse the unperturbed prefix cache and batch; False: one full forward per token (reference)

    def __post_init__(self) -> None:
        if not self.suppression_factor > 0:
            raise ValueError(f"suppression_factor must be positive, got {self.suppression_factor}")
        if not -1.0 <= self.cosine_threshold <= 1.0:
            raise ValueError(f"cosine_threshold must lie in [-1, 1], got {self.cosine_threshold}")
        if self.batch_size < 0:
            raise ValueError(f"batch_size must be 0 (from the device) or more, got {self.batch_size}")
