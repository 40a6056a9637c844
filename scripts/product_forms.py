"""Time the forms of MACS's stacked product at long prompts on one device (`explainer/bench/products.py`), for the
GPU session (`scripts/gpu_check.sh OUT products`); writes one JSON report."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from explainer.bench.products import SHAPES, TINY_SHAPES, TINY_TOKENS, TOKENS, measure  # noqa: E402
from explainer.bench.synthetic import machine  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--json", required=True)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--tiny", action="store_true", help="tiny shapes (the CPU dry run)")
    p.add_argument("--repeats", type=int, default=20)
    args = p.parse_args()
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    shapes, tokens = (TINY_SHAPES, TINY_TOKENS) if args.tiny else (SHAPES, TOKENS)
    rows = []
    for name, shape in shapes.items():
        for t in tokens[name]:
            for row in measure(shape, t, device, dtype, args.repeats):
                rows.append({"shape": name, **row})
                ms = "-" if row["ms"] is None else f"{row['ms']:.3f} ms"
                print(f"{name} @ {t}: {row['form']:<50} {ms:>12}  {row['relative_error'] or row['error']}")
    report = {"dtype": args.dtype, "date": datetime.now(UTC).isoformat(timespec="seconds"),
              "machine": machine(device), "rows": rows}  # fmt: skip
    Path(args.json).write_text(json.dumps(report, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
