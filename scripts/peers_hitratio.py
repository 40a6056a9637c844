"""The external references' hit ratio (ContextCite 0.0.4, AT2 0.0.1) on the needle prompts the `hitratio` command
builds, written as rows of its results file so that `python -m explainer hitratio --report HITS.jsonl,PEERS.jsonl`
shows them beside the methods (`peers.peer_needle_row` says how their sentence scores become a token map).

Needs the optional extras: pip install .[peers]. The prompts are the `hitratio` command's for the same --lengths,
--depths, --samples, --seed and haystack (--data / --text), and the answer is the same greedy one at the same --dtype
and --max-new-tokens. AT2 is first trained by its own trainer on --train-limit rows of the SQuAD file --train-data from
--train-offset on (as `peers_lds.py` trains it; with the same rows, options and --at2-work folder it reuses the
features stored there). Resumable: each prompt is appended to --results as it finishes.

Usage: python scripts/peers_hitratio.py --lengths 1024 --samples 1 --results peers-hits.jsonl
       [--peers context-cite,at2 --train-data squad2-dev.json --train-offset 200 --train-limit 100 --at2-steps 1000]
"""

from __future__ import annotations

import argparse
import sys

from peers_lds import add_peer_options, at2_folder, parse_peers, peer_config

from explainer.bench.prompts import prompt_text
from explainer.cli.hitratio import needle_plan
from explainer.errors import InputError
from explainer.eval.datasets import resolve_data
from explainer.eval.evaluate import load_squad
from explainer.eval.hitratio import DEPTHS, LENGTHS, format_table, needle_rows, summarise
from explainer.eval.peers import peer_needle_row, run_peers
from explainer.models.loading import load_model
from explainer.runtime.precision import parse_dtype


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", default=",".join(map(str, LENGTHS)), help="prompt lengths in tokens, about")
    p.add_argument("--depths", default=",".join(map(str, DEPTHS)), help="needle depths, %% of the haystack")
    p.add_argument("--samples", type=int, default=4, help="prompts per length and depth")
    p.add_argument("--limit", type=int, default=None, help="run only the first N prompts (whole depth sweeps first)")
    p.add_argument("--data", default=None, help="haystack text from the contexts of a SQuAD file (as `hitratio`)")
    p.add_argument("--text", default=None, help="haystack text from a plain UTF-8 file instead")
    p.add_argument("--seed", type=int, default=0, help="seed of the passwords and of where each haystack starts")
    add_peer_options(p, "SQuAD file AT2 is trained on (needed when AT2 runs)", "prompt")
    args = p.parse_args(argv)
    peers = parse_peers(p, args)
    if "at2" in peers and not args.train_data:
        p.error("--train-data: AT2 is trained on SQuAD rows before it scores the needle prompts; give a SQuAD file")
    try:
        specs = needle_plan(args.lengths, args.depths, args.samples, args.limit)
    except InputError as e:
        p.error(str(e))
    paragraphs, _ = prompt_text(resolve_data(args.data) if args.data else None, args.text)
    train = []
    if "at2" in peers:
        train = load_squad(resolve_data(args.train_data), args.train_limit, offset=args.train_offset or 0)
    cfg = peer_config(args, peers, "peers_hitratio.py", argv)
    bundle = load_model(args.model, device=args.device, dtype=parse_dtype(args.dtype), max_prompt_tokens=8192)
    rows = needle_rows(bundle.tokenizer, paragraphs, specs, args.seed)
    with at2_folder(args.at2_work, train, args) as work:
        results = run_peers(bundle, rows, train, cfg, work, args.results, log=lambda m: print(m, file=sys.stderr),
                            measure=peer_needle_row)  # fmt: skip
    print(format_table(summarise(results)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
