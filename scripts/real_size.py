"""What a visitor waits for: the default models at their real size, with random weights, timed on this machine.

The default models' weights cannot be downloaded everywhere (CI has no Hub), but their cost depends only on their
shape. This script builds each from its real configuration (`explainer/data/configs`) with random weights, saves it
with an offline tokenizer (`explainer/bench/synthetic.py`: same special tokens, tiny vocabulary: token ids only set
the cost through the prompt length), and then, in a fresh process per model and precision, measures what the app does:

- load: `load_model` of the saved folder, seconds, and the process's peak RSS after it;
- text: a ~300-token prompt with MACS + Rollout, 32 answer tokens (teacher-forced token ids, the same forward passes
  as greedy generation; random weights would stop at a random end-of-sequence): time to the first token and tokens/s
  after it;
- image (vision-language models): a 448 x 448 image (larger for more tokens) at 256 image tokens (or
  `--image-tokens`) and a short question, MACS + Rollout, 32 answer tokens: total seconds and peak RSS.

`--methods` changes the methods (`all`: every registered method that applies), `--no-text` skips the text question.
On a machine with CUDA the model loads there (`load_model`'s default), and `--dtype bfloat16` is the GPU's precision.

Usage: python scripts/real_size.py --model Qwen/Qwen2-VL-2B-Instruct --dtype float32 --cache /tmp/real-size
       [--layers 2 --vision-depth 1 --vocab 4096] (reduced sizes, as the tests use) [--results file.jsonl]
Each run appends one JSON line to --results. Run nothing else meanwhile: the figures are wall-clock times.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's packages, wherever it runs from

def build(model_id: str, folder: Path, dtype: str, layers: int | None, vision_depth: int | None, vocab: int | None):
    """Save the model of `model_id`'s real configuration (optionally reduced) with random weights into `folder`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    from explainer.bench.synthetic import offline_tokenizer, random_config

    tok = offline_tokenizer()
    config = random_config(model_id, tok, layers=layers, vision_depth=vision_depth, vocab=vocab)
    vision = getattr(config, "vision_config", None)
    cls = AutoModelForImageTextToText if vision is not None else AutoModelForCausalLM
    torch.manual_seed(0)
    # built on the GPU where there is one: a 3B model built on the CPU had not been measured after a GPU window's 119 s
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = cls.from_config(config, dtype=getattr(torch, dtype))
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)


def _rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # kB on Linux


WORD_SOURCES = {"sources": {"unit": "word"}}  # the text prompt is words without sentence ends: Sources' units

def _methods(spec: str, image: bool, model) -> list[str]:
    """`--methods`: names, or "all": every registered method (for an image prompt those that explain images) that
    can run on `model`; one that needs data this model lacks (`macs_calibrated` without fitted weights, which random
    weights would make meaningless) is left out, with a line saying why."""
    from explainer.errors import InputError
    from explainer.methods import get_method, method_choices

    if spec != "all":
        return [m for m in spec.split(",") if m]
    chosen = []
    for name in method_choices(image=image):
        try:
            get_method(name).prepare(model)
        except InputError as e:
            print(f"real_size: {name} left out of 'all' on this model: {e}", file=sys.stderr)
            continue
        chosen.append(name)
    return chosen


def measure(folder: Path, dtype: str, prompt_tokens: int, new_tokens: int, image_tokens: int, methods: str = "macs,"
            "rollout", text: bool = True) -> dict:  # fmt: skip
    """Load and run the saved model as the app does (see the module docstring); returns the figures."""
    import numpy as np
    import torch
    from PIL import Image

    from explainer import load_model, stream_explain
    from explainer.bench.synthetic import WORDS

    torch.set_num_threads(len(__import__("os").sched_getaffinity(0)))
    t0 = time.perf_counter()
    bundle = load_model(str(folder), dtype=dtype)
    row = {"load_s": time.perf_counter() - t0, "load_rss_gb": _rss_gb()}
    words = (WORDS * (prompt_tokens // len(WORDS) + 2))[: prompt_tokens * 2]
    n = len(bundle.encode(" ".join(words), chat_template=True, max_new_tokens=new_tokens).input_ids[0])
    while n > prompt_tokens and words:
        words = words[: max(1, len(words) - max(1, (n - prompt_tokens) // 2))]
        n = len(bundle.encode(" ".join(words), chat_template=True, max_new_tokens=new_tokens).input_ids[0])
    answer = [int(i) for i in np.random.default_rng(0).integers(5, len(bundle.tokenizer) - 1, new_tokens)]
    if text:
        row.update(_timed(stream_explain(bundle, " ".join(words), methods=_methods(methods, False, bundle.model),
                                         method_options=WORD_SOURCES, max_new_tokens=new_tokens, answer=answer),
                          "text"))  # fmt: skip
        row["text_prompt_tokens"] = n
    if bundle.image_processor is not None:
        rng = np.random.default_rng(0)
        side = max(448, 28 * int(np.ceil(np.sqrt(image_tokens))))  # 28 pixels a merged token: room for all of them
        image = Image.fromarray(rng.integers(0, 255, (side, side, 3), dtype=np.uint8))
        chosen = _methods(methods, True, bundle.model)
        stream = stream_explain(bundle, "What is in the image?", methods=chosen, image=image,
                                max_image_tokens=image_tokens, max_new_tokens=new_tokens, answer=answer)  # fmt: skip
        row.update(_timed(stream, "image"))
    row["peak_rss_gb"] = _rss_gb()
    return row


def _timed(stream, key: str) -> dict:
    t0 = time.perf_counter()
    first = last = None
    for attr in stream:
        if first is None and attr.generated_token_ids:
            first = time.perf_counter() - t0
        last = attr
    total = time.perf_counter() - t0
    k = len(last.generated_token_ids)
    out = {f"{key}_first_token_s": first, f"{key}_total_s": total, f"{key}_tokens": k}
    out[f"{key}_tokens_per_s"] = (k - 1) / (total - first) if k > 1 and total > first else None
    out[f"{key}_decode_path"] = last.meta.get("decode", {}).get("path")  # cuda-graph, static, solo or batched
    if "reliance_seconds" in last.meta:  # the image reliance's knockout pass, part of the total
        out[f"{key}_reliance_s"] = last.meta["reliance_seconds"]
    if last.image:
        out[f"{key}_prompt_tokens"] = len(last.prompt_token_ids)
        out[f"{key}_image_tokens"] = len(last.image["token_positions"])
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="a default model's Hub id (its config ships with the package)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--cache", required=True, help="folder for the built random-weight models")
    p.add_argument("--layers", type=int, help="reduce the decoder depth (tests)")
    p.add_argument("--vision-depth", type=int, help="reduce the vision tower's depth (tests)")
    p.add_argument("--vocab", type=int, help="reduce the vocabulary (tests)")
    p.add_argument("--prompt-tokens", type=int, default=300)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--image-tokens", type=int, default=256)
    p.add_argument("--methods", default="macs,rollout", help="comma-separated, or all (every method that applies)")
    p.add_argument("--no-text", action="store_true", help="time the image question only")
    p.add_argument("--results", help="append the row to this JSON-lines file")
    p.add_argument("--measure-only", action="store_true", help=argparse.SUPPRESS)  # the fresh measuring process
    a = p.parse_args(argv)
    reduced = "-".join(f"{k}{v}" for k, v in (("L", a.layers), ("V", a.vision_depth), ("vocab", a.vocab)) if v)
    folder = Path(a.cache) / f"{a.model.rsplit('/', 1)[-1]}-{a.dtype}{'-' + reduced if reduced else ''}"
    if a.measure_only:
        row = measure(folder, a.dtype, a.prompt_tokens, a.new_tokens, a.image_tokens, a.methods, not a.no_text)
        print(json.dumps(row))
        return 0
    import torch

    from explainer.bench.synthetic import machine_label

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # where `load_model` puts it
    if not (folder / "config.json").is_file():
        build(a.model, folder, a.dtype, a.layers, a.vision_depth, a.vocab)
    out = subprocess.run([sys.executable, __file__, *(argv if argv is not None else sys.argv[1:]), "--measure-only"],
                         capture_output=True, text=True, check=True)  # fmt: skip
    row = {"model": a.model, "dtype": a.dtype, "reduced": reduced or None, "date": time.strftime("%Y-%m-%d"),
           "methods": a.methods, "image_tokens_asked": a.image_tokens, "machine": machine_label(device),
           **json.loads(out.stdout.strip().splitlines()[-1])}  # fmt: skip
    print(json.dumps(row))
    if a.results:
        with open(a.results, "a") as f:
            f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
