"""The `calibrate` command: fit `macs_calibrated`'s layer weights for a model on a SQuAD file's rows, or for a
vision-language model on a folder of images (`--images`) with one question (`explainer/eval/calibrate.py`), and write
the weights file (`methods/calibration.py`), resumable from its cache."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import InputError
from ..eval.calibrate import CalibrateConfig, calibrate
from ..eval.datasets import SQUAD_V2_TRAIN, resolve_data
from ..eval.evaluate import load_squad
from ..eval.lds import KEEP_PROBABILITY, MASKS
from ..methods.calibration import config_fingerprint, user_dir
from ..models.loading import cache_root, load_model
from ..runtime.precision import parse_dtype
from .options import model_options, placement

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif")


def image_rows(folder: str, question: str, limit: int, offset: int = 0) -> list[dict]:
    """The image training rows of a folder: its image files in name order, each asked `question`."""
    if not Path(folder).is_dir():
        raise InputError(f"--images {folder!r} is not a folder.")
    paths = sorted(p for p in Path(folder).iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)[offset : offset + limit]
    return [{"id": p.name, "image": str(p), "question": question} for p in paths]


def cmd_calibrate(args: argparse.Namespace) -> int:
    if args.out and not Path(args.out).resolve().parent.is_dir():
        raise InputError(f"Cannot write {args.out!r}: its folder does not exist.")
    if args.images:
        rows = image_rows(args.images, args.question, args.limit, args.offset)
    else:
        rows = load_squad(resolve_data(args.data), args.limit, offset=args.offset)
    data = args.images or args.data
    if not rows:
        raise InputError(f"No rows in {data!r} from --offset {args.offset}.")
    cfg = CalibrateConfig(max_new_tokens=args.max_new_tokens, masks=args.masks, seed=args.seed, l2=args.l2,
                          batch_size=args.batch_size)  # fmt: skip
    bundle = load_model(args.model, **placement(args), dtype=parse_dtype(args.dtype))
    label = f"{Path(data).name} rows {args.offset}-{args.offset + len(rows) - 1} ({len(rows)} rows)"
    if args.images:
        label += f", each asked {args.question!r}"
    weights = calibrate(bundle, rows, cfg, Path(args.cache), label, not args.quiet, images=bool(args.images))
    weights.fit["command"] = args.command_line
    out = Path(args.out) if args.out else user_dir() / f"{config_fingerprint(bundle.model)}.json"
    weights.save(out)
    fit = weights.fit
    print(f"{fit['rows_fitted']} rows; mean Pearson over the masks: MACS {fit['pearson_train_macs']:.3f}, "
          f"calibrated {fit['pearson_train']:.3f} (training rows)", file=sys.stderr)  # fmt: skip
    print(f"wrote {out}: layer weights {' '.join(f'{w:.2f}' for w in weights.layer_weights)}")
    return 0


def add_calibrate_parser(sub) -> None:
    """Register `python -m explainer calibrate` on the CLI's subparsers."""
    p = sub.add_parser(
        "calibrate",
        help=f"fit macs_calibrated's layer weights for a model (AT2's objective: {MASKS} random ablations of the "
        f"context's sentences per row, each kept with probability {KEEP_PROBABILITY}) on a SQuAD file's rows; "
        "use training data, never the rows you evaluate on",
    )
    p.add_argument(
        "--data",
        default=SQUAD_V2_TRAIN,
        help=f"SQuAD JSON file, or {SQUAD_V2_TRAIN} (the default: SQuAD "
        "2.0 train, downloaded once into the cache; also github.com/chrischute/squad, data/train-v2.0.json)",
    )
    p.add_argument(
        "--out",
        default=None,
        help="weights file (default: the user's calibration folder, "
        "$EXPLAINER_CALIBRATION or <cache>/calibration, as <fingerprint>.json, where the method finds it)",
    )
    p.add_argument("--images", default=None, help="instead of --data, for a vision-language model: a folder of "
                   "images; the sources are each image's regions and the question's sentences")  # fmt: skip
    p.add_argument("--question", default="What is in the image?", help="with --images: the question asked of each")
    p.add_argument("--limit", type=int, default=100, help="use the first N rows (from --offset on)")
    p.add_argument("--offset", type=int, default=0, help="skip the first N rows")
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--masks", type=int, default=MASKS, help="random ablation masks per row")
    p.add_argument("--seed", type=int, default=0, help="seed of the masks (with each row's id)")
    p.add_argument("--l2", type=float, default=CalibrateConfig.l2, help="pull of the weights towards 1 (MACS)")
    p.add_argument("--batch-size", type=int, default=0, help="most ablation runs per forward (0: from the device)")
    p.add_argument("--cache", default=str(cache_root() / "calibration-rows"),
                   help="folder of the measured rows (a rerun reads them instead of measuring again)")  # fmt: skip
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    model_options(p)
    p.set_defaults(func=cmd_calibrate)
