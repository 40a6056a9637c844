"""How Sources' surrogate should choose its masks and passes, measured on development questions, never on the evaluated
ones (the LDS table's are the first 100 of the 350-question file; these are rows 200-299). A front end of
`explainer.eval.design_lab`, whose docstring says what is collected and how it is scored.

Usage: python scripts/sources_design.py collect --data squad_v2-dev --ids docs/results/squad-dev-350.ids
           --offset 200 --limit 100 --results docs/results/sources-design-lab-f32-DATE.jsonl
       python scripts/sources_design.py report docs/results/sources-design-lab-f32-DATE.jsonl
       python scripts/sources_design.py report-half LAB.jsonl ...   # the half fraction against the fold
       RANK=0 WORLD_SIZE=2 python scripts/sources_design.py collect-long --data squad_v2-dev \
           --ids docs/results/squad-dev-350.ids --offset 200 --limit 20 --results LONG.jsonl   # and RANK=1
       python scripts/sources_design.py report-long LONG.jsonl   # finds the rank files
(`collect-long`, `report-long`: long contexts, four paragraphs joined as `surrogate --paragraphs 4` joins them;
`explainer.eval.design_lab_long`.)
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's packages, wherever it runs from

from explainer.eval import design_lab, design_lab_long  # noqa: E402
from explainer.eval.intervals import paired_t  # noqa: E402
from explainer.eval.parallel import results_files  # noqa: E402
from explainer.eval.resumable import measure_rows, read_results  # noqa: E402


def collect(args: argparse.Namespace) -> None:
    from explainer.eval.datasets import resolve_data, select_rows
    from explainer.eval.evaluate import load_squad
    from explainer.models.loading import load_model
    from explainer.runtime.precision import parse_dtype

    rows = load_squad(resolve_data(args.data))
    if args.ids:
        rows = select_rows(rows, args.ids)
    rows = rows[args.offset : args.offset + args.limit]
    bundle = load_model(None, dtype=parse_dtype(args.dtype))
    command = shlex.join(["python", "scripts/sources_design.py", *sys.argv[1:]])
    done = {r["id"]: r for r in read_results(args.results)}
    measure_rows(rows, lambda row: {**design_lab.collect_row(bundle, row), "command": command}, done, args.results,
                 bundle.model, lambda m: print(m, file=sys.stderr))  # fmt: skip


def collect_long(args: argparse.Namespace) -> None:
    from explainer.cli.lds import chosen_rows
    from explainer.eval.datasets import haystack_rows
    from explainer.eval.parallel import rank_from_env, rank_path, shard
    from explainer.models.loading import load_model
    from explainer.runtime.precision import parse_dtype

    place = rank_from_env()
    rows = shard(haystack_rows(chosen_rows(args), args.paragraphs), place.rank, place.world)  # as `surrogate` builds
    path = rank_path(args.results, place.rank, place.world) if place.world > 1 else args.results
    bundle = load_model(None, dtype=parse_dtype(args.dtype))
    command = shlex.join(["python", "scripts/sources_design.py", *sys.argv[1:]])
    done = {r["id"]: r for r in read_results(path)}
    measure_rows(rows, lambda row: {**design_lab_long.collect_long_row(bundle, row), "command": command}, done, path,
                 bundle.model, lambda m: print(m, file=sys.stderr))  # fmt: skip


def report_long(path: str, per_token: bool = False) -> None:
    rows = [r for f in results_files(path) for r in read_results(f) if "logp" in r]
    what = "per-token LDS, fits sharing strength" if per_token else "whole-answer LDS, fits as the method's"
    print(f"{len(rows)} long contexts; {what}, k = 32")
    for e in design_lab_long.report_long(rows, per_token):
        pairs = "; ".join(f"{key} {e[key][0]:+.3f} ± {e[key][1]:.3f}" for key in e if key.startswith("minus"))
        print(f"  {e['sentences']:6s} {e['fit']:20s} N={e['n']:3d}: {e['lds']:.3f} ± {e['half']:.3f}  {pairs}")


def report(path: str) -> None:
    rows = [r for r in read_results(path) if "removal" in r]
    print(f"{len(rows)} questions; LDS whole answer / per token (mean over questions, and over seeds)")
    entries = design_lab.report(rows)
    for entry in entries:
        known = entry["lds_token"] is not None and entry["design"] != "reference"  # the reference fits the whole answer
        token = f"{entry['lds_token']:.3f}" if known else "-"
        print(f"k={entry['k']:2d} {entry['design']:9s} {entry['passes']:13s} N={entry['n']:3d}: "
              f"{entry['lds']:.3f} / {token}")  # fmt: skip
    print("paired over questions (mean ± 95% t half-width, N):")
    for a, b in design_lab.PAIRS:
        mean, half, n = design_lab.paired(entries, a, b)
        print(f"  {' '.join(map(str, a))} - {' '.join(map(str, b))}: {mean:+.3f} ± {half:.3f} (N = {n})")
    print("where no orthogonal design fits (questions with at least k sentences), paired against the ridge on")
    print("leave-one-out then pairs (the fallback until 2026-11-29):")
    fallbacks = design_lab.fallback(rows)
    pick = {(e["k"], e["design"], e["passes"]): e["per_question"] for e in fallbacks}
    for entry in fallbacks:
        mean, half, n = paired_t(entry["per_question"], pick[(entry["k"], "loo_pairs", "removal-ridge")])
        token = f"{entry['lds_token']:.3f}" if entry["lds_token"] is not None else "-"
        print(f"  k={entry['k']} {entry['design']:9s} {entry['passes']:20s} N={entry['n']:3d}: {entry['lds']:.3f} / "
              f"{token} ({mean:+.3f} ± {half:.3f})")
    ceiling = design_lab.projections(rows)
    print("the projection on every mask (questions of up to 8 sentences), by the target's scale, paired against log p:")
    for name, values in ceiling.items():
        mean, half, n = paired_t(values, ceiling["log p"])
        print(f"  {name:15s} N={n:3d}: {sum(values) / max(len(values), 1):.3f} ({mean:+.3f} ± {half:.3f})")


def report_half(paths: list[str]) -> None:
    rows = list({r["id"]: r for path in paths for r in read_results(path) if "removal" in r}.values())  # once each
    print("the half fraction (the default where it fits) against the fold it replaced, questions of U sentences;")
    print("LDS whole answer / per token, mean over questions (the fold: and over its seeds)")
    for e in design_lab.half_fraction(rows):
        name = {"hadamard": "default", "folded": "fold"}[e["design"]] if e["k"] < 2 ** e["units"] - 1 else "every mask"
        line = f"  U={e['units']} k={e['k']:2d} {name:10s} N={e['n']:3d}: {e['lds']:.3f} / {e['lds_token']:.3f}"
        if "minus folded" in e:
            (w, wh, _), (t, th, _) = e["minus folded"], e["minus folded, per token"]
            line += f"  minus the fold: whole {w:+.3f} ± {wh:.3f}, per token {t:+.3f} ± {th:.3f}"
        print(line)


def _collect_parser(sub, name: str, limit: int):
    """A `collect` subcommand's parser: the questions (data, ids, offset, limit), the dtype and the results file."""
    c = sub.add_parser(name)
    c.add_argument("--data", required=True)
    c.add_argument("--ids")
    c.add_argument("--offset", type=int, default=200)
    c.add_argument("--limit", type=int, default=limit)
    c.add_argument("--dtype", default="float32")
    c.add_argument("--results", required=True)
    return c


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    _collect_parser(sub, "collect", 100)
    sub.add_parser("report").add_argument("results")
    _collect_parser(sub, "collect-long", 20).add_argument("--paragraphs", type=int, default=4)
    long = sub.add_parser("report-long")
    long.add_argument("results")
    long.add_argument("--per-token", action="store_true", help="per-token LDS of fits sharing strength across tokens")
    sub.add_parser("report-half").add_argument("results", nargs="+")
    args = p.parse_args()
    if args.command == "collect":
        collect(args)
    elif args.command == "collect-long":
        collect_long(args)
    elif args.command == "report-long":
        report_long(args.results, args.per_token)
    elif args.command == "report-half":
        report_half(args.results)
    else:
        report(args.results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
