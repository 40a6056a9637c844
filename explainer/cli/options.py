"""The options and argument readers the commands share: prompt, answer, model placement, dtype, methods, contrast,
and a data-parallel rank's share of the rows."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import InputError
from ..eval.parallel import Rank, rank_path, shard
from ..methods import method_choices
from ..methods.calibration import training_ids
from ..models.loading import parse_device_map
from ..runtime.precision import DTYPE_CHOICES


def read_prompt(args: argparse.Namespace) -> str:
    """The prompt of `--prompt-file` or `--prompt`."""
    if args.prompt_file:
        try:
            return Path(args.prompt_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise InputError(f"Cannot read prompt file {args.prompt_file!r}: {e.__class__.__name__}: {e}") from e
    if args.prompt is None:
        raise InputError("Give a prompt with --prompt TEXT or --prompt-file PATH.")
    return args.prompt


def read_answer(args: argparse.Namespace) -> str | None:
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


def answer_options(p: argparse.ArgumentParser) -> None:
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
        help=f"weights' precision: {', '.join(DTYPE_CHOICES)} (auto: bfloat16 on a GPU or another accelerator and on a "
        "CPU with native bf16 (the avx512_bf16 or amx_bf16 flag), float32 on other CPUs)",
    )


def methods_help(what: str) -> str:
    """`--methods` help naming every registered method (`methods.method_choices`), e.g. for a newly added one."""
    return f"{what}; registered: {', '.join(method_choices())}"


def prompt_and_model_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prompt", help="the prompt text")
    p.add_argument("--prompt-file", help="read the prompt from a UTF-8 text file")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--max-prompt-tokens", type=int, default=4096, help="refuse longer prompts")
    p.add_argument("--no-chat-template", action="store_true", help="feed the prompt as plain text")
    model_options(p)


def model_options(p: argparse.ArgumentParser, device_map: bool = True) -> None:
    """`--model`, `--device`, `--dtype` and (with `device_map`) `--device-map`: which model, where, in what precision
    (`placement` and `precision.parse_dtype` read them)."""
    p.add_argument("--model", default=None, help="hub id or local folder (default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda if available)")
    dtype_option(p)
    if device_map:
        add_device_map_option(p)


DEVICE_MAP_HELP = (
    "instead of --device, spread the model over the GPUs (and CPU memory, disk) with accelerate: auto, balanced, "
    'sequential, or a JSON map of module names to devices, e.g. \'{"model.embed_tokens": 0, "model.layers": 1, ...}\''
)


def add_device_map_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device-map", default=None, help=DEVICE_MAP_HELP)


def placement(args: argparse.Namespace) -> dict:
    """`load_model` keywords for `--device` / `--device-map`."""
    return {"device": args.device, "device_map": parse_device_map(getattr(args, "device_map", None))}


def contrast_options(p: argparse.ArgumentParser) -> None:
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


def rank_share(rows: list, args: argparse.Namespace, rank: Rank) -> tuple[list, argparse.Namespace]:
    """Under torchrun / accelerate launch (`eval`, `lds`): this rank's block of rows, its own results and JSON files
    (created now, so a complete set of rank files tells that every rank ran) and, by default, the GPU of its local
    rank."""
    if args.device_map is not None and rank.local_world > 1:
        raise InputError(
            f"{rank.local_world} processes on this machine would each spread the model over all its GPUs with "
            "--device-map: launch one process per machine for that, or leave --device-map out (one GPU per rank)."
        )
    share = shard(rows, rank.rank, rank.world)
    results = rank_path(args.results, rank.rank, rank.world)
    results.touch()
    json_path = str(rank_path(args.json, rank.rank, rank.world)) if args.json else None
    device = args.device
    if device is None and args.device_map is None:
        import torch

        device = f"cuda:{rank.local_rank % torch.cuda.device_count()}" if torch.cuda.is_available() else None
    print(f"rank {rank.rank} of {rank.world}: {len(share)} of {len(rows)} rows -> {results}", file=sys.stderr)
    return share, argparse.Namespace(**{**vars(args), "results": str(results), "json": json_path, "device": device})


def held_out(rows: list[dict]) -> list[dict]:
    """The rows that the shipped calibration weights (macs_calibrated) were not fitted on: an evaluation scores no
    training row. Says on stderr how many it left out."""
    fitted = training_ids()
    kept = [r for r in rows if str(r["id"]) not in fitted]
    if len(kept) < len(rows):
        print(f"left out {len(rows) - len(kept)} rows that the shipped macs_calibrated weights were fitted on",
              file=sys.stderr)  # fmt: skip
    return kept


def comparisons(text: str | None) -> list[tuple[str, str]]:
    """The (a, b) method pairs of --compare "a/b,c/d" (paired differences a - b).

    Raises:
        InputError: a pair is not two names joined by "/".
    """
    pairs = [tuple(p.strip() for p in item.split("/")) for item in (text or "").split(",") if item.strip()]
    if any(len(p) != 2 or not all(p) for p in pairs):
        raise InputError(f"--compare takes pairs A/B separated by commas (A - B, paired), got {text!r}.")
    return pairs  # type: ignore[return-value]


def sentence_edges(text: str | None) -> list[int]:
    """The ascending bin edges of --by-sentences "20,24,28" (sentence counts).

    Raises:
        InputError: not ascending positive integers joined by commas.
    """
    try:
        edges = [int(item) for item in (text or "").split(",") if item.strip()]
    except ValueError:
        edges = []
    if not edges or edges[0] < 1 or any(b <= a for a, b in zip(edges, edges[1:], strict=False)):
        raise InputError(
            f"--by-sentences takes ascending sentence counts separated by commas, e.g. 20,24,28; got {text!r}."
        )
    return edges
