"""Command line: `python -m explainer explain|faithfulness|bench|eval|agreement|haystack ...`.

Errors the user can fix (bad prompt, unknown model or method, unreadable file) end the program with exit code 2 and
a one-line message on stderr, never a traceback.

Each command lives in its own module (`explain.py`: explain and faithfulness, `eval.py`, `bench.py`,
`agreement.py`, `haystack.py`); this one holds the parser, the helpers they share and `main`. Only this package
imports `visuals`: the library returns data.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from ..errors import ExplainerError, InputError
from ..runtime.precision import DTYPE_CHOICES

EXIT_USER_ERROR = 2


def _read_prompt(args: argparse.Namespace) -> str:
    if args.prompt_file:
        try:
            return Path(args.prompt_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise InputError(f"Cannot read prompt file {args.prompt_file!r}: {e.__class__.__name__}: {e}") from e
    if args.prompt is None:
        raise InputError("Give a prompt with --prompt TEXT or --prompt-file PATH.")
    return args.prompt


def _read_answer(args: argparse.Namespace) -> str | None:
    """The answer of `--answer` / `--answer-file` (the file's final line break, which editors add, dropped), or None."""
    if args.answer_file:
        try:
            text = Path(args.answer_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise InputError(f"Cannot read answer file {args.answer_file!r}: {e.__class__.__name__}: {e}") from e
        text = text.removesuffix("\n").removesuffix("\r")
    elif args.answer is not None:
        text = args.answer
    else:
        return None
    if not text.strip():
        raise InputError("The answer is empty: give the answer's text, or leave --answer out to generate one.")
    return text


def _answer_options(p: argparse.ArgumentParser) -> None:
    which = p.add_mutually_exclusive_group()
    which.add_argument(
        "--answer", help="explain this answer (teacher-forced) instead of generating one; it must fit --max-new-tokens"
    )
    which.add_argument("--answer-file", help="read the answer to explain from a UTF-8 text file")


def dtype_option(p: argparse.ArgumentParser) -> None:
    """`--dtype`, kept as text: the command checks it with `precision.parse_dtype` before loading a model."""
    p.add_argument(
        "--dtype",
        default="auto",
        help=f"weights' precision: {', '.join(DTYPE_CHOICES)} (auto: bfloat16 on a GPU, float32 on the CPU)",
    )


def methods_help(what: str) -> str:
    """`--methods` help naming every registered method (`methods.method_choices`), e.g. for a newly added one."""
    from ..methods import method_choices

    return f"{what}; registered: {', '.join(method_choices())}"


def _prompt_and_model_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prompt", help="the prompt text")
    p.add_argument("--prompt-file", help="read the prompt from a UTF-8 text file")
    p.add_argument("--model", default=None, help="hub id or local folder (default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--max-prompt-tokens", type=int, default=4096, help="refuse longer prompts")
    p.add_argument("--no-chat-template", action="store_true", help="feed the prompt as plain text")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda if available)")
    dtype_option(p)
    add_device_map_option(p)


DEVICE_MAP_HELP = (
    "instead of --device, spread the model over the GPUs (and CPU memory, disk) with accelerate: auto, balanced, "
    'sequential, or a JSON map of module names to devices, e.g. \'{"model.embed_tokens": 0, "model.layers": 1, ...}\''
)


def add_device_map_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device-map", default=None, help=DEVICE_MAP_HELP)


def placement(args: argparse.Namespace) -> dict:
    """`load_model` keywords for `--device` / `--device-map`."""
    from ..models.loading import parse_device_map

    return {"device": args.device, "device_map": parse_device_map(getattr(args, "device_map", None))}


def _contrast_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--contrast-step",
        type=int,
        help="explain why answer token K (1-based) rather than --foil: the perturbation and gradient methods explain "
        "logit(token) - logit(foil) there; the step's alternatives are printed with the step scores",
    )
    which = p.add_mutually_exclusive_group()
    which.add_argument("--foil", help="with --contrast-step: the foil token's text (one token, e.g. ' London')")
    which.add_argument("--foil-id", type=int, help="with --contrast-step: the foil's token id")


def contrast_of(args: argparse.Namespace) -> dict[int, str | int] | None:
    """`explain(contrast=...)` from `--contrast-step` / `--foil` / `--foil-id` (0-based step), or None."""
    foil = args.foil if args.foil is not None else args.foil_id
    if args.contrast_step is None and foil is None:
        return None
    if args.contrast_step is None or foil is None:
        raise InputError("--contrast-step and --foil (or --foil-id) go together: the step to explain and its foil.")
    if args.contrast_step < 1:
        raise InputError(f"--contrast-step counts answer tokens from 1, got {args.contrast_step}.")
    return {args.contrast_step - 1: foil}


def _add_faithfulness_parser(sub, cmd_faithfulness) -> None:
    p = sub.add_parser(
        "faithfulness",
        help="generate an answer (or take --answer), then measure MIF/LIF/SRG removal curves and pi-Soft-NS/NC",
    )
    _prompt_and_model_options(p)
    _answer_options(p)
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
    parser = argparse.ArgumentParser(prog="python -m explainer", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    # Imported here, not at the top: the command modules import this package's shared helpers.
    from .agreement import add_agreement_parser
    from .bench import add_bench_parser
    from .eval import add_eval_parser
    from .explain import cmd_explain, cmd_faithfulness
    from .haystack import add_haystack_parser

    p = sub.add_parser("explain", help="generate an answer (or take --answer) and explain every token")
    _prompt_and_model_options(p)
    _answer_options(p)
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
    _contrast_options(p)
    p.set_defaults(func=cmd_explain)

    _add_faithfulness_parser(sub, cmd_faithfulness)

    add_bench_parser(sub)
    add_eval_parser(sub)
    add_agreement_parser(sub)
    add_haystack_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=os.environ.get("EXPLAINER_LOG", "WARNING"))
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ExplainerError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
