"""Command line: `python -m explainer COMMAND`, one of explain, faithfulness, bench, crowd, thread-owner, eval,
agreement, haystack, lds, surrogate, hitratio, calibrate (`COMMAND --help` for its options).

Errors the user can fix (bad prompt, unknown model or method, unreadable file) end the program with exit code 2 and
a one-line message on stderr, never a traceback.

Each command lives in its own module (`explain.py`: explain and faithfulness, `eval.py`, `bench.py`, `crowd.py`,
`thread_owner.py`, `agreement.py`, `haystack.py`, `lds.py`, `surrogate.py`, `hitratio.py`, `calibrate.py`), the
options they share in `options.py`; this one holds the parser and `main`. Only this package imports `visuals`: the
library returns data.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys

from ..errors import ExplainerError
from .agreement import add_agreement_parser
from .bench import add_bench_parser
from .calibrate import add_calibrate_parser
from .crowd import add_crowd_parser
from .eval import add_eval_parser
from .explain import cmd_explain, cmd_faithfulness
from .haystack import add_haystack_parser
from .hitratio import add_hitratio_parser
from .lds import add_lds_parser
from .options import answer_options, contrast_options, methods_help, prompt_and_model_options
from .surrogate import add_surrogate_parser
from .thread_owner import add_thread_owner_parser

EXIT_USER_ERROR = 2


def _add_faithfulness_parser(sub) -> None:
    p = sub.add_parser(
        "faithfulness",
        help="generate an answer (or take --answer), then measure MIF/LIF/SRG removal curves and pi-Soft-NS/NC",
    )
    prompt_and_model_options(p)
    answer_options(p)
    p.add_argument(
        "--methods", default="macs,rollout", help=methods_help("comma-separated methods (random baseline added)")
    )
    which = p.add_mutually_exclusive_group()
    which.add_argument("--step", type=int, help="pi-Soft at this answer token (1-based; default: the last)")
    which.add_argument("--all-steps", action="store_true", help="pi-Soft at every 5th answer token")
    p.add_argument(
        "--soft", choices=("quick", "paper", "off"), default="quick",
        help="pi-Soft settings: quick (the app's), paper (15 samples, pi step 0.05) or off",
    )  # fmt: skip
    p.add_argument("--routing", choices=("dynamic", "fixed"), default=None, help="pi-Soft routing (default dynamic)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random baseline's orderings")
    p.add_argument("--json", help="write curves, SRGs, pi-Soft and seconds {generation, removal, soft} here")
    p.add_argument(
        "--image", action="append",
        help="an image the prompt asks about (vision-language --model): removal over its tokens; repeat for several",
    )  # fmt: skip
    p.add_argument(
        "--rank", choices=("image", "image+question"), default="image",
        help="with --image: the tokens ranked and removed (pi-Soft is measured on text prompts only)",
    )  # fmt: skip
    p.set_defaults(func=cmd_faithfulness)


def build_parser() -> argparse.ArgumentParser:
    summary = " ".join(__doc__.split("\n\n")[0].split())  # the docstring's first paragraph, on one line
    parser = argparse.ArgumentParser(prog="python -m explainer", description=summary)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("explain", help="generate an answer (or take --answer) and explain every token")
    prompt_and_model_options(p)
    answer_options(p)
    p.add_argument(
        "--image", action="append",
        help="an image the prompt asks about (needs a vision-language --model, e.g. Qwen2.5-VL); repeat for several, "
        "in order: they share the image budget",
    )  # fmt: skip
    p.add_argument("--min-pixels", type=int, default=None, help="lower bound of the resized image area (VL models)")
    p.add_argument("--max-pixels", type=int, default=None, help="upper bound of the resized image area (VL models)")
    p.add_argument(
        "--methods",
        default="macs",
        help=methods_help("comma-separated methods, each with options if wanted: macs:alpha=0.5,atman"),
    )
    p.add_argument("--json", help="write the full result as JSON to this path")
    p.add_argument(
        "--macs-layers",
        action="store_true",
        help="with --json: also write MACS's per-layer factors (Eq. 6) of every step, K x L x N (the file grows by "
        "about L times MACS's scores); the product over layers is MACS's raw score",
    )
    p.add_argument("--gif", help="with --image: write an animated GIF of the overlays over the steps to this path")
    p.add_argument(
        "--no-reliance", action="store_true",
        help="with --image: skip the image reliance (each answer token's log p with the image hidden from the answer, "
        "and each method's share on the image; one more pass over the answer)",
    )  # fmt: skip
    p.add_argument("--top", type=int, default=3, help="top prompt tokens printed per step (without --json)")
    contrast_options(p)
    p.set_defaults(func=cmd_explain)

    _add_faithfulness_parser(sub)

    add_bench_parser(sub)
    add_crowd_parser(sub)
    add_thread_owner_parser(sub)
    add_eval_parser(sub)
    add_agreement_parser(sub)
    add_haystack_parser(sub)
    add_lds_parser(sub)
    add_surrogate_parser(sub)
    add_hitratio_parser(sub)
    add_calibrate_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=os.environ.get("EXPLAINER_LOG", "WARNING"))
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    parser = build_parser()
    args = parser.parse_args(argv)
    args.command_line = shlex.join(["python", "-m", "explainer", *(sys.argv[1:] if argv is None else argv)])
    try:
        return args.func(args)
    except ExplainerError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
