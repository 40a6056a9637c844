"""Throughput and peak-memory benchmark: attribution methods against plain `model.generate` with SDPA.

`python -m explainer bench` measures generated tokens per second and peak memory for every (method, prompt length)
pair. Each pair runs in a fresh Python process that loads the model, does one short untimed warm-up generation (for
post-hoc methods on a short prefix of the prompt, see `WARMUP_POSTHOC_PROMPT_TOKENS`), resets the memory high-water
mark and then times `repeats` generations of exactly K tokens (end-of-sequence never stops either side). Because
every process loads the same model the same way, peak memory is comparable across methods. Rows report the median
tokens/s and their ratio to the baseline `none` at the same prompt length.

How a method is timed follows from its registry entry alone, so new methods need no change here:

- `none`: `model.generate(input_ids, max_new_tokens=K, min_new_tokens=K, do_sample=False)`.
- `plain`: `generate_steps` without methods: the library's own decode loop (on a GPU the CUDA-graph path of
  `decoding/static.py`), what explained generation is compared with in the same engine.
- streaming methods (e.g. `macs`): `generate_steps` with that method, the MACS path of the app.
- post-hoc methods (e.g. `random`): `generate_steps` without methods, then `method.explain(...)`; the time covers both.

On a shared machine other processes slow the timed runs badly (two torch threads on two busy cores can take 10x
longer): every run records the share of the CPUs others used (`other_cpu_frac_all`), flagged rows are warned about,
and `--quiet-wait` holds each timed run until the machine is idle.

Each row records the loop that generated (`decode_path`: "generate", "dynamic", "static" or "cuda-graph");
`--decode` chooses it for the library's runs (`decoding.OVERRIDES`, set as `EXPLAINER_DECODE`).

Prompts are real text, tokenised without chat template and cut to exactly N tokens: the essays in
`explainer/data/bench_text.txt` by default, a text file (`--prompt-file`) or the contexts of a SQuAD file (`--data`,
e.g. `squad_v2-dev`); the report names the source.

Modules, one job each: `config` (`BenchConfig`, one run's settings, checked once and sent whole to every worker),
`prompts` (the prompt text), `probes` (peak memory and CPU contention), `worker` (the timing inside a worker
process), `runner` (one fresh process per configuration, the report), `report` (rows, ratios, tables, merging saved
reports). The command line is `explainer/cli/bench.py`.
"""

from .config import BenchConfig
from .probes import BUSY_WARNING
from .prompts import DEFAULT_TEXT, DEFAULT_TEXT_NAME, prompt_ids, prompt_text
from .report import (
    BASELINE,
    PLAIN,
    BenchRow,
    EfficiencyRow,
    efficiency_rows,
    format_efficiency,
    format_markdown,
    format_table,
    load_reports,
    markdown_caption,
    with_ratios,
)
from .runner import machine_info, run_bench
from .worker import WARMUP_NEW_TOKENS, WARMUP_POSTHOC_PROMPT_TOKENS, make_runner, measure, method_from_spec, worker_main

__all__ = [
    "BASELINE",
    "PLAIN",
    "BUSY_WARNING",
    "BenchConfig",
    "DEFAULT_TEXT",
    "DEFAULT_TEXT_NAME",
    "WARMUP_NEW_TOKENS",
    "WARMUP_POSTHOC_PROMPT_TOKENS",
    "BenchRow",
    "EfficiencyRow",
    "efficiency_rows",
    "format_efficiency",
    "format_markdown",
    "format_table",
    "load_reports",
    "machine_info",
    "make_runner",
    "markdown_caption",
    "measure",
    "method_from_spec",
    "prompt_ids",
    "prompt_text",
    "run_bench",
    "with_ratios",
    "worker_main",
]
