"""The batch's matrix products at one fixed row count, so that no row's numbers depend on how many others it shares a
step with.

A CPU's (or GPU's) matrix-product library picks its kernel by the shape: on this project's 2-core CPU a bfloat16
`down_proj` gives a row one result at 1 row and another at 2 (the last bit differs), and float32 products differ
between 1, 2, 3, 5, ... rows. So within `fixed_rows`, every linear layer of the model multiplies exactly `rows` rows
per call: a batch of B rows is cut into ceil(B / rows) calls, the last one padded with zero rows. Each row then meets
the same kernel whatever the batch holds, a row decoding alone included (it is padded to `rows`); the products of a
lone row therefore equal those of the same row in any batch, bit for bit.

What a padded product costs: on the 2-core CPU a bfloat16 product of 4 rows costs about what 1 row's does (the
weights are read once either way); see docs/benchmarks.md, "A crowd at once".
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch
import torch.nn.functional as F

CPU_ROWS = 4  # rows per product call on a CPU
ACCELERATOR_ROWS = 16  # on a GPU a product of 16 rows costs what one row's does (it reads the weights once)


def product_rows(device: torch.device) -> int:
    """Rows per matrix-product call in the batched decode on `device`."""
    return CPU_ROWS if device.type == "cpu" else ACCELERATOR_ROWS


def chunked_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, rows: int) -> torch.Tensor:
    """`F.linear(x, weight, bias)` with exactly `rows` rows of `x`'s first dimension per call (zero rows padded)."""
    b = x.shape[0]
    if b == rows:
        return F.linear(x, weight, bias)
    pad = -b % rows
    if pad:
        x = torch.cat([x, x.new_zeros((pad, *x.shape[1:]))])
    parts = [F.linear(x[i : i + rows], weight, bias) for i in range(0, b + pad, rows)]
    out = parts[0] if len(parts) == 1 else torch.cat(parts)
    return out[:b]


def linear_layers(model: torch.nn.Module) -> list[torch.nn.Linear]:
    """The model's `nn.Linear` layers that `fixed_rows` patches (those without a `forward` of their own already)."""
    return [m for m in model.modules() if isinstance(m, torch.nn.Linear) and "forward" not in vars(m)]


@contextlib.contextmanager
def fixed_rows(linears: Sequence[torch.nn.Linear], rows: int) -> Iterator[None]:
    """Within the block, each of `linears` (`linear_layers` of a model) multiplies `rows` rows per call
    (`chunked_linear`). Their own `forward` is restored on exit, also after an exception; the caller holds the model
    (`session.hold`)."""
    try:
        for m in linears:
            m.forward = lambda x, m=m: chunked_linear(x, m.weight, m.bias, rows)
        yield
    finally:
        for m in linears:
            vars(m).pop("forward", None)
