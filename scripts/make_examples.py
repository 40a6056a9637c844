"""Regenerate the saved results of the text examples (`assets/examples.json` -> `assets/examples/<slug>.json`).

The app shows these at once when an example is clicked, and the first example's on the first page view, before any
model has loaded (`ui/tabs/examples.py`). Each comes from the embedded model (SmolLM2-135M-Instruct, `load_model()`),
in float32 (so the file does not depend on the CPU having native bf16), greedy, with the chat template, up to the
app's 64 new tokens, and these methods, each with its default options: the app's defaults MACS and Attention Rollout,
then AtMan, the random baseline and Grad-ELLM (about a minute per example on a busy 2-core CPU). Input x Gradient and
AttnLRP are left out: each took over 80 s alone per example there (`--methods` adds them). Tokens and scores are
deterministic; only the timings and the date in `meta` change from one run to the next.

Image examples get no saved result: the only vision-language weights here are random, whose answers mean nothing
(the examples' UI says so: run them live with a real model).

Run from the repository root: `python scripts/make_examples.py`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from explainer.explain import explain  # noqa: E402
from explainer.models.loading import load_model  # noqa: E402
from explainer.result.attribution import result_json  # noqa: E402

EXAMPLES = ROOT / "assets" / "examples.json"
METHODS = ("macs", "rollout", "atman", "random", "grad_ellm")
DTYPE = "float32"  # not bf16: the same file on every CPU
MAX_NEW_TOKENS = 64  # the app's default: Generate with the defaults gives the same answer (in float32)
MAX_BYTES = 1_000_000


def slug(label: str) -> str:
    """The file name of an example: its label in lower case, words joined by '-'."""
    return re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated methods")
    args = parser.parse_args()
    methods = [m for m in args.methods.split(",") if m]
    examples = json.loads(EXAMPLES.read_text(encoding="utf-8"))
    bundle = load_model(dtype=DTYPE)
    for example in examples:
        if "image" in example:  # random vision weights only: no saved result (see the docstring)
            continue
        path = Path("assets") / "examples" / f"{slug(example['label'])}.json"
        start = time.perf_counter()
        attr = explain(bundle, example["prompt"], methods=methods, max_new_tokens=MAX_NEW_TOKENS)
        attr.meta["saved"] = {
            "date": datetime.date.today().isoformat(),
            "by": "scripts/make_examples.py",
            "prompt": example["prompt"],
        }
        text = result_json(attr)
        if len(text.encode("utf-8")) > MAX_BYTES:
            raise SystemExit(f"{path}: {len(text) / 1e6:.1f} MB, over {MAX_BYTES / 1e6:.0f} MB: fewer tokens, methods")
        (ROOT / path).parent.mkdir(parents=True, exist_ok=True)
        (ROOT / path).write_text(text + "\n", encoding="utf-8")
        example["result"] = str(path)
        seconds = time.perf_counter() - start
        print(f"{path}: {attr.num_steps} tokens, {len(text) / 1e3:.0f} kB, {seconds:.0f} s", flush=True)
    EXAMPLES.write_text(json.dumps(examples, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
