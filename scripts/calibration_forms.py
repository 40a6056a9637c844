"""Which calibrated form of MACS, if any, beats MACS on LDS: forms chosen on training rows by cross-validation, the
chosen one scored once on held-out rows, paired against MACS (`explainer/eval/forms.py` has the forms and the
protocol; this is its front end).

Rows are measured once (`calibrate.collect_forms_row`: MACS's layer factors and raw map, Sources' map, 32 ablation
masks of the context's sentences and the answer's log-probability under each, the masks the `lds` command draws) and
cached (.npz per row), so a rerun only fits.

Usage: python scripts/calibration_forms.py --data squad_v2-dev --ids docs/results/squad-dev-350.ids \
           --train 200:300 --heldout 0:100 --cache DIR [--results FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's packages, wherever it runs from

from explainer.eval import calibrate as cal  # noqa: E402
from explainer.eval import forms  # noqa: E402
from explainer.eval.datasets import resolve_data, select_rows  # noqa: E402
from explainer.eval.evaluate import load_squad  # noqa: E402
from explainer.methods.calibration import find_weights  # noqa: E402
from explainer.models.loading import load_model  # noqa: E402
from explainer.runtime.precision import parse_dtype  # noqa: E402


def ranges(text: str) -> list[tuple[int, int]]:
    """ "200:260,280:300" -> [(200, 260), (280, 300)]: row ranges, end excluded."""
    return [(int(a), int(b)) for a, b in (part.split(":") for part in text.split(","))]


def pick(rows: list[dict], spec: str) -> list[dict]:
    """The rows of `spec`'s ranges, counted in `rows`' order (the ids file's, with `--ids`)."""
    return [r for a, b in ranges(spec) for r in rows[a:b]]


def show(selection: dict, final: dict) -> None:
    for r in selection["forms"]:
        d = r["vs_macs"]
        record = f"(n {d['n']}, {d['wins']}/{d['losses']}/{d['ties']})"
        print(f"{r['form']:12s} cross-validated LDS {r['cv_lds']:.3f}  vs MACS {d['mean']:+.3f} ± "
              f"{d['half_width']:.3f} {record}", file=sys.stderr)  # fmt: skip
    d = final["vs_macs"]
    print(f"chosen: {final['form']}; held out: LDS {final['lds']:.3f}, vs MACS {d['mean']:+.3f} ± {d['half_width']:.3f}"
          f" (n {d['n']}, wins/losses/ties {d['wins']}/{d['losses']}/{d['ties']})", file=sys.stderr)  # fmt: skip
    for name, b in final["baselines"].items():
        d = b["vs_macs"]
        print(f"  {name}: LDS {b['lds']:.3f}, vs MACS {d['mean']:+.3f} ± {d['half_width']:.3f}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="SQuAD JSON file or squad_v2-dev")
    p.add_argument("--ids", default=None, help="ids file (`explainer lds --ids`) whose order the ranges count in")
    p.add_argument("--train", required=True, help="row ranges the forms are chosen on, e.g. 200:300")
    p.add_argument("--heldout", required=True, help="row ranges the chosen form is scored on once, e.g. 0:100")
    p.add_argument("--cache", required=True, help="folder of the measured rows (a rerun reuses them)")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--results", default=None, help="JSON file for the tables")
    args = p.parse_args(argv)
    torch.set_num_threads(1)  # a long background run beside other work
    rows = load_squad(resolve_data(args.data))
    rows = select_rows(rows, args.ids) if args.ids else rows
    bundle = load_model(None, device="cpu" if not torch.cuda.is_available() else None, dtype=parse_dtype(args.dtype))
    cfg = cal.CalibrateConfig()
    got = {name: cal.collect(bundle, pick(rows, spec), cfg, Path(args.cache), measure=cal.collect_forms_row)
           for name, spec in (("train", args.train), ("heldout", args.heldout))}  # fmt: skip
    train, test = (forms.usable(got[name]["examples"]) for name in ("train", "heldout"))
    every = forms.forms(find_weights(bundle.model).layer_weights)
    selection = forms.select(train, {name: every[name] for name in forms.CANDIDATES})
    baselines = {"macs": every["macs"], "shipped": every["shipped"],
                 "sources": forms.Form("sources", every["blend"].scores, fixed={"lambda": 1.0})}  # fmt: skip
    final = forms.held_out(every[selection["chosen"]], train, test, baselines)
    show(selection, final)
    if args.results:
        facts = {"command": "python scripts/calibration_forms.py " + " ".join(sys.argv[1:] if argv is None else argv),
                 "train_rows": len(train), "heldout_rows": len(test), "dtype": args.dtype,
                 "machine": "2-core Intel Xeon (native bf16), CPU, shared with other work",
                 "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}  # fmt: skip
        out = {**facts, "selection": selection, "held_out": final}
        Path(args.results).write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
