"""The `explain` and `faithfulness` commands: explain one answer, or measure how faithful its explanation is."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from ..contrast import contrasted_steps, is_blank
from ..errors import InputError
from ..explain import explain, explain_request
from ..faithfulness import PAPER_SOFT, QUICK_SOFT, FaithfulnessRequest, RemovalConfig, measure_faithfulness
from ..faithfulness.common import image_ranked_positions
from ..methods import METHODS, parse_methods
from ..models.images import load_image
from ..models.loading import load_model
from ..models.vision import encode_image_prompt
from ..request import ExplainRequest
from ..result.attribution import zscore
from ..result.image_maps import image_map
from ..runtime.precision import parse_dtype
from .options import contrast_of, placement, read_answer, read_prompt


def _answer_label(attr) -> str:
    return "answer (given, teacher-forced)" if attr.meta.get("answer") == "given" else "answer"


def _print_summary(attr, top: int) -> None:
    precision = f" ({attr.meta['dtype']} on {attr.meta['device']})" if "dtype" in attr.meta else ""
    print(f"model: {attr.model}{precision}")
    print(f"prompt tokens: {attr.num_prompt_tokens}   answer tokens: {attr.num_steps}")
    print(f"{_answer_label(attr)}: {attr.generated_text!r}")
    for i, one in enumerate(attr.images):
        (h, w), (width, height) = one["grid"], one["size"]
        name = "image" if len(attr.images) == 1 else f"image {i + 1}"
        print(f"{name}: {width}x{height} px, {h}x{w} grid of image tokens (row, col)")
    _print_step_scores(attr)
    _print_reliance(attr)
    user = attr.user_positions or None
    for name, scores in attr.methods.items():
        label = f" {METHODS[name].display_name}" if name in METHODS else ""
        print(f"\n[{name}]{label}  {scores.seconds:.3f} s" + ("  (ranked over the user's text)" if user else ""))
        z = zscore(scores.raw, user) if user else scores.z  # (K, N)
        for k, tok in enumerate(attr.generated_tokens):
            if is_blank(attr, name, k):
                print(f"  step {k + 1:3d} {tok!r:>14}: no contrastive map (attention does not depend on the target)")
                continue
            row = z[k]
            order = [i for i in row.argsort()[::-1] if row[i] == row[i]][:top]
            tops = ", ".join(f"{attr.prompt_tokens[i]!r}@{i} {row[i]:+.2f}" for i in order)
            if attr.image:
                cells = image_map(attr, name, k)  # (h, w)
                r, c = divmod(int(cells.argmax()), cells.shape[1])
                tops += f" | image peak: row {r}, col {c} {cells[r, c]:+.2f}"
            print(f"  step {k + 1:3d} {tok!r:>14}: {tops}")
        _print_sources(scores.meta)


def _print_sources(meta: dict) -> None:
    """Sources' top units over the whole answer (nats: the surrogate's weight, or the loss increase when the unit is
    hidden) and its work."""
    if not meta.get("sources"):
        return
    if meta.get("fit") == "surrogate":
        held = meta.get("held_out_spearman")
        print(f"  sources over the answer (surrogate weight, nats, from {meta['ablations']} ablations; held-out "
              f"Spearman {'n/a' if held is None else f'{held:+.2f}'}):")  # fmt: skip
    else:
        hidden = {"answer": "hidden from the answer", "all": "removed from the context"}.get(meta.get("scope", "all"))
        print(f"  sources over the answer (loss increase when {hidden}, nats):")
    for i, unit in enumerate(meta["sources"][:5]):
        where = f"{unit['kind']} @{unit['start']}-{unit['stop']}"
        print(f"  {i + 1:2d}. {unit['score']:+.3f}  {where}: {unit['text'][:90]!r}")
    loo, cite = meta["leave_one_sentence_out_positions"], meta["contextcite_positions"]
    print(f"  forward positions: {meta['forward_positions']} (leave-one-sentence-out without a cache: {loo}; "
          f"ContextCite's 64 ablations: {cite})")  # fmt: skip


def _print_reliance(attr) -> None:
    """An image question's reliance per step (`visuals.reliance`): log p with the image visible and hidden, shares."""
    from visuals.reliance import reliance_lines

    lines = reliance_lines(attr)
    if lines:
        print("\n" + "\n".join(lines))


def _print_step_scores(attr) -> None:
    """Per step (1-based, as `--step` and `--contrast-step` count): p, entropy, the alternatives, any contrast."""
    scores, alternatives = attr.step_scores, attr.meta.get("alternatives") or []
    if not (scores.get("probability") and scores.get("entropy")):
        return
    print("\nstep scores: p = the model's probability of the token, H = entropy of its next-token distribution;")
    print("alternatives: the step's most probable tokens (foils for --contrast-step)")
    contrast = contrasted_steps(attr)
    for k, tok in enumerate(attr.generated_tokens):
        line = f"  step {k + 1:3d} {tok!r:>14}: p {scores['probability'][k]:.4f}  H {scores['entropy'][k]:.3f} nats"
        if k < len(alternatives):
            line += "  | " + ", ".join(f"{a['token']!r} {a['p']:.3f}" for a in alternatives[k])
        if k in contrast:
            line += f"  | contrast: {contrast[k]['target']!r} rather than {contrast[k]['foil']!r}"
        print(line)


def cmd_explain(args: argparse.Namespace) -> int:
    request = explain_request_of(args)  # every field checked before the (slow) model load
    dtype = parse_dtype(args.dtype)
    if args.json:
        out_dir = Path(args.json).resolve().parent
        if not out_dir.is_dir():
            raise InputError(f"Cannot write {args.json!r}: folder {str(out_dir)!r} does not exist.")
    if args.gif:
        if not request.images:
            raise InputError("--gif animates image overlays; it needs --image.")
        if Path(args.gif).suffix.lower() != ".gif" or not Path(args.gif).resolve().parent.is_dir():
            raise InputError(f"Cannot write {args.gif!r}: give a .gif path in an existing folder.")
    bundle = load_model(
        args.model, **placement(args), dtype=dtype, max_prompt_tokens=args.max_prompt_tokens,
        min_pixels=args.min_pixels,
        max_pixels=args.max_pixels,
    )  # fmt: skip
    attr = explain_request(bundle, request)
    if args.json:
        try:
            attr.save_json(args.json, layers=True)  # a method's per-layer scores, where kept (--macs-layers)
        except OSError as e:
            raise InputError(f"Cannot write {args.json!r}: {e}") from e
        print(f"wrote {args.json} ({attr.num_steps} steps x {attr.num_prompt_tokens} prompt tokens)")
    else:
        _print_summary(attr, args.top)
    if args.gif:
        _write_gif(args.gif, request.image, attr, list(request.method_names))
    return 0


def explain_request_of(args: argparse.Namespace):
    """The `explain` command's `ExplainRequest` from its arguments (images loaded and checked; no model needed)."""
    prompt = read_prompt(args)
    answer = read_answer(args)
    methods, method_options = parse_methods(args.methods)
    _macs_layers(args, methods, method_options)
    image = _load_image(args.image)
    return ExplainRequest.build(
        prompt, methods=methods, max_new_tokens=args.max_new_tokens, chat_template=not args.no_chat_template,
        method_options=method_options, image=image, answer=answer, contrast=contrast_of(args),
        reliance=not args.no_reliance,
    )  # fmt: skip


def _macs_layers(args: argparse.Namespace, methods: list[str], options: dict) -> None:
    """`--macs-layers`: MACS keeps its per-layer factors (`keep_layers`), which `--json` then writes."""
    if not args.macs_layers:
        return
    if "macs" not in methods or not args.json:
        raise InputError("--macs-layers writes MACS's per-layer factors into the --json file: give --json and macs.")
    options.setdefault("macs", {})["keep_layers"] = True


def _write_gif(path: str, image, attr, methods: list[str]) -> None:
    from visuals.overlay import gif_bytes  # the views load only when a GIF is asked for

    frames = max(attr.num_steps, 1)  # every step (the app's download keeps at most `MAX_GIF_FRAMES`)
    try:
        Path(path).write_bytes(gif_bytes(image, attr, methods, contour_top_percent=10, max_side=320, max_frames=frames))
    except (OSError, ValueError) as e:
        raise InputError(f"Cannot write {path!r}: {e}") from e
    print(f"wrote {path} ({attr.num_steps} frames, one overlay per method)")


def _format_faithfulness(report, attr, seconds: dict[str, float]) -> str:
    from visuals.curves import TABLE_HEADERS, faithfulness_rows  # the views load only for a table

    lines = [f"{_answer_label(attr)} ({attr.num_steps} tokens): {attr.generated_text!r}"]
    if report.removal:
        lines.append(f"removal: {report.removal.runs} distinct perturbed runs, fractions {report.removal.fractions}")
    if report.soft:
        cfg = report.soft.config
        steps = ", ".join(str(k + 1) for k in report.soft.steps)
        lines.append(f"pi-Soft: step(s) {steps}; {cfg['samples']} samples per pi, pi = {report.soft.pis}")
    widths = [max(10, len(h) + 1) for h in TABLE_HEADERS]
    lines.append("".join(f"{h:>{w}}" for h, w in zip(TABLE_HEADERS, widths)))
    for row in faithfulness_rows(report):
        cells = [row[0]] + ["-" if v is None else f"{v:+.4f}" for v in row[1:]]
        lines.append("".join(f"{c:>{w}}" for c, w in zip(cells, widths)))
    gen = seconds["generation"]
    lines.append(
        "seconds: "
        + ", ".join(
            f"{k} {v:.2f}" + (f" ({v / gen:.1f}x generation)" if k != "generation" and gen else "")
            for k, v in seconds.items()
        )  # fmt: skip
    )
    return "\n".join(lines)


def cmd_faithfulness(args: argparse.Namespace) -> int:
    prompt = read_prompt(args)
    if not prompt.strip():
        raise InputError("The prompt is empty: type a question or some text to continue.")
    answer = read_answer(args)
    methods, method_options = parse_methods(args.methods)
    dtype = parse_dtype(args.dtype)
    if args.json and not Path(args.json).resolve().parent.is_dir():
        raise InputError(f"Cannot write {args.json!r}: its folder does not exist.")
    image = _load_image(args.image)  # checked before the (slow) model load
    soft = _soft_setting(args, image is not None)
    bundle = load_model(args.model, **placement(args), dtype=dtype, max_prompt_tokens=args.max_prompt_tokens)
    options = dict(
        max_new_tokens=args.max_new_tokens, chat_template=not args.no_chat_template, method_options=method_options,
        image=image,
    )  # fmt: skip
    explain(bundle, prompt, methods=methods, **{**options, "max_new_tokens": 1})  # warm-up, not timed
    attr = explain(bundle, prompt, methods=methods, answer=answer, **options)  # removal teacher-forces its tokens
    steps = None
    if not args.all_steps and soft is not None:
        k = attr.num_steps if args.step is None else args.step
        if not 1 <= k <= attr.num_steps:
            raise InputError(f"--step must lie between 1 and {attr.num_steps} (the answer's tokens), got {k}.")
        steps = [k - 1]
    positions, image_inputs = _image_ranking(bundle, attr, prompt, image, args) if image is not None else (None, None)
    request = FaithfulnessRequest(
        methods=methods, positions=positions, removal=RemovalConfig(seed=args.seed), soft=soft, steps=steps,
        image_inputs=image_inputs,
    )  # fmt: skip
    report = measure_faithfulness(bundle, attr, request)
    seconds = {"generation": float(attr.meta["generation_seconds"]), **report.seconds}
    print(_format_faithfulness(report, attr, seconds))
    if args.json:
        ranked = {"ranked": args.rank if image is not None else "text", "ranked_positions": positions}
        _write_faithfulness_json(args.json, bundle.name, attr, methods, seconds, report, ranked)
    return 0


def _soft_setting(args: argparse.Namespace, image: bool):
    """pi-Soft's settings from `--soft` / `--routing`; None when off, or for an image question (text prompts only)."""
    soft = {"quick": QUICK_SOFT, "paper": PAPER_SOFT, "off": None}[args.soft]
    if soft is not None and image:
        print("pi-Soft is measured on text prompts only: skipped for an image question", file=sys.stderr)
        return None
    return dataclasses.replace(soft, routing=args.routing) if soft is not None and args.routing else soft


def _load_image(paths: list[str] | None):
    """`--image` (repeatable): None, one image, or a list of them in order."""
    if not paths:
        return None
    images = [load_image(path) for path in paths]
    return images[0] if len(images) == 1 else images


def _image_ranking(bundle, attr, prompt: str, image, args: argparse.Namespace) -> tuple[list[int], dict]:
    """The positions an image question's removal curves rank (`--rank`) and the prompt's image inputs."""
    encoded = encode_image_prompt(
        bundle, image, prompt, chat_template=not args.no_chat_template, max_new_tokens=args.max_new_tokens
    )
    return image_ranked_positions(attr, args.rank), encoded.prefill_inputs


def _write_faithfulness_json(
    path: str, model: str, attr: Any, methods: list[str], seconds: dict, report: Any, ranked: dict | None = None
) -> None:
    """`faithfulness --json`: the request, which tokens were ranked, the timings and both reports."""
    out = {
        "model": model,
        "dtype": attr.meta.get("dtype"),
        "device": attr.meta.get("device"),
        "prompt_tokens": attr.num_prompt_tokens,
        "answer": attr.generated_text,
        "answer_given": attr.meta.get("answer") == "given",
        "generated_tokens": attr.num_steps,
        "methods": methods,
        **(ranked or {"ranked": "text", "ranked_positions": None}),
        "seconds": seconds,
        "ratio_to_generation": {k: v / seconds["generation"] for k, v in seconds.items() if k != "generation"},
        "removal": dataclasses.asdict(report.removal),
        "soft": dataclasses.asdict(report.soft) if report.soft else None,
    }
    try:
        Path(path).write_text(json.dumps(out, indent=2), encoding="utf-8")
    except OSError as e:
        raise InputError(f"Cannot write {path!r}: {e}") from e
    print(f"wrote {path}")
