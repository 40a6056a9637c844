"""`python -m explainer bench`: prompt construction, ratio and table maths, and one end-to-end run on a tiny Llama."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from explainer import bench
from explainer.bench import BenchRow, format_markdown, format_table, prompt_ids, with_ratios
from explainer.cli import main

_SENTENCES = [
    "The river runs through the old city and past the university.",
    "Several kings built churches in the north during the early century.",
    "A small team recorded a new album with music from the region.",
    "The population of the island grew after the war ended.",
]


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A random 2-layer Llama with a byte-level BPE tokenizer trained offline, saved like a hub folder."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    folder = tmp_path_factory.mktemp("tiny-llama")
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(
        _SENTENCES * 4, vocab_size=320, min_frequency=1, show_progress=False, special_tokens=["<s>", "</s>"]
    )
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", pad_token="</s>")
    tokenizer.save_pretrained(folder)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        max_position_embeddings=512,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.mark.parametrize("layout", ["rows", "official"])
@pytest.mark.parametrize("n", [1, 17, 200])
def test_prompt_from_squad_file_has_exact_length_and_cycles(tokenizer, tmp_path, n, layout):
    data = tmp_path / "squad.json"
    contexts = [_SENTENCES[0], _SENTENCES[0], _SENTENCES[1]]
    if layout == "rows":
        payload = {"rows": [{"context": c} for c in contexts]}
    else:  # the official SQuAD 2.0 layout: one answerable question per paragraph
        qa = {"question": "q", "answers": [{"text": "The", "answer_start": 0}], "is_impossible": False}
        paragraphs = [{"context": c, "qas": [{**qa, "id": f"q{i}"}]} for i, c in enumerate(contexts)]
        payload = {"version": "v2.0", "data": [{"title": "t", "paragraphs": paragraphs}]}
    data.write_text(json.dumps(payload), encoding="utf-8")

    ids, source = prompt_ids(tokenizer, n, data)

    assert source == "SQuAD contexts from squad.json"
    assert len(ids) == n
    # The text starts with the first context, repeated contexts are dropped and the file cycles when too short.
    full = tokenizer(f"{_SENTENCES[0]}\n\n{_SENTENCES[1]}", add_special_tokens=False)["input_ids"]
    assert ids[: min(n, len(full) - 1)] == full[: min(n, len(full) - 1)]
    if n == 200:
        cycled = "\n\n".join([_SENTENCES[0], _SENTENCES[1]] * 40)
        assert ids == tokenizer(cycled, add_special_tokens=False)["input_ids"][:n]


def test_shipped_text_is_the_default_and_named_in_the_source(tokenizer):
    raw = bench.DEFAULT_TEXT.read_text(encoding="utf-8")
    header, _, body = raw.partition("\n")
    assert header.startswith("# Source:") and "Licence:" in header and "public domain" in header
    assert 25_000 <= len(raw.encode("utf-8")) <= 40_000 and len(body.split()) > 4_000
    shipped = Path(__file__).resolve().parents[3] / "explainer" / "data" / "bench_text.txt"
    assert bench.DEFAULT_TEXT_NAME == "explainer/data/bench_text.txt" and shipped.read_text(encoding="utf-8") == raw

    ids, source = prompt_ids(tokenizer, 300)

    assert len(ids) == 300
    assert source.startswith("explainer/data/bench_text.txt (Source:") and "CC0" in source
    assert ids == tokenizer(body.strip(), add_special_tokens=False)["input_ids"][:300]  # the header is not text
    assert "Source" not in tokenizer.decode(ids[:20])


def test_prompt_file_is_cycled_and_cut_exactly(tokenizer, tmp_path):
    path = tmp_path / "mine.txt"
    path.write_text(f"# Source: my notes\n\n{_SENTENCES[2]}\n", encoding="utf-8")
    per_copy = len(tokenizer(_SENTENCES[2], add_special_tokens=False)["input_ids"])
    n = 3 * per_copy + 5

    ids, source = prompt_ids(tokenizer, n, prompt_file=path)

    assert source == "text file mine.txt (Source: my notes)"
    assert ids == tokenizer("\n\n".join([_SENTENCES[2]] * 5), add_special_tokens=False)["input_ids"][:n]
    plain = tmp_path / "plain.txt"
    plain.write_text(_SENTENCES[3], encoding="utf-8")
    assert prompt_ids(tokenizer, 4, prompt_file=plain)[1] == "text file plain.txt"


@pytest.mark.parametrize("content", [None, "", "# only a header\n\n  \n", b"\xff\xfe\x00bad"])
def test_unusable_text_sources_are_input_errors(tokenizer, tmp_path, content):
    from explainer.errors import InputError

    path = tmp_path / "text.txt"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content, encoding="utf-8")
    with pytest.raises(InputError, match="text.txt"):
        prompt_ids(tokenizer, 8, prompt_file=path)
    with pytest.raises(InputError, match="at least 1 token"):
        prompt_ids(tokenizer, 0)


def test_squad_file_without_contexts_is_an_input_error(tokenizer, tmp_path):
    from explainer.errors import InputError

    data = tmp_path / "empty.json"
    data.write_text(json.dumps({"rows": [{"id": "x", "context": "  "}]}), encoding="utf-8")
    with pytest.raises(InputError, match="no contexts"):
        prompt_ids(tokenizer, 8, data)


def _row(method: str, n: int, tps: float, mem: float, k: int = 32) -> BenchRow:
    return BenchRow(method, n, k, tps, mem, repeats=3, seconds_all=[k / tps] * 3, mem_method="vmhwm")


def test_ratios_are_relative_to_none_at_same_lengths():
    rows = [
        _row("none", 256, 40.0, 800.0),
        _row("macs", 256, 36.0, 820.0),
        _row("none", 1024, 20.0, 1000.0),
        _row("macs", 1024, 10.0, 1000.0),
        _row("macs", 2048, 5.0, 1200.0),  # no baseline at this length
        _row("macs", 256, 30.0, 900.0, k=8),  # nor at this number of new tokens
    ]

    out = with_ratios(rows)

    assert [r.tokens_per_s_ratio for r in out] == pytest.approx([1.0, 0.9, 1.0, 0.5, None, None])
    assert [r.peak_mem_ratio for r in out] == pytest.approx([1.0, 1.025, 1.0, 1.0, None, None])
    assert rows[1].tokens_per_s_ratio is None  # inputs are not modified


def test_tables_show_every_row_and_mark_missing_ratios():
    rows = with_ratios([_row("none", 256, 40.0, 800.0), _row("macs", 256, 36.0, 820.0), _row("macs", 512, 5.0, 9.0)])

    plain = format_table(rows).splitlines()
    md = format_markdown(rows, caption="measured somewhere").splitlines()

    assert plain[0].split() == [
        "method",
        "prompt_tokens",
        "new_tokens",
        "tokens_per_s",
        "ratio",
        "peak_mem_mb",
        "mem_ratio",
    ]
    assert plain[2].split() == ["macs", "256", "32", "36.00", "0.900", "820.0", "1.025"]
    assert plain[3].split()[-3:] == ["-", "9.0", "-"]
    assert len({len(line) for line in plain}) == 1  # aligned columns
    assert md[0].startswith("| method |") and md[1].count("---") == 7
    assert md[3] == "| macs | 256 | 32 | 36.00 | 0.900 | 820.0 | 1.025 |"
    assert md[-1] == "_measured somewhere_"


def test_live_memory_columns_appear_only_when_measured():
    rows = [_row("none", 256, 40.0, 800.0), _row("macs", 256, 36.0, 820.0)]
    rows[0].live_peak_mem_mb, rows[1].live_peak_mem_mb = 700.0, 707.0

    out = with_ratios(rows)

    assert out[1].live_peak_mem_ratio == pytest.approx(1.01)
    assert format_table(out).splitlines()[2].split()[-2:] == ["707.0", "1.010"]
    assert "live" not in format_table(with_ratios([_row("none", 256, 40.0, 800.0)]))


def test_bench_end_to_end_on_tiny_llama(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "bench.json"
    argv = [
        "bench",
        "--model",
        str(tiny_model_dir),
        "--prompt-tokens",
        "16,32",
        "--new-tokens",
        "4",
        "--methods",
        "none,macs",
        "--repeats",
        "1",
        "--device",
        "cpu",
        "--json",
        str(out),
        "--markdown",
        "--live-mem",
    ]

    assert main(argv) == 0

    report = json.loads(out.read_text())
    rows = report["rows"]
    assert [(r["method"], r["prompt_tokens"]) for r in rows] == [("none", 16), ("macs", 16), ("none", 32), ("macs", 32)]
    for r in rows:
        assert r["new_tokens"] == 4 and r["repeats"] == 1 and len(r["seconds_all"]) == 1
        assert r["tokens_per_s"] > 0 and r["peak_mem_mb"] > 0 and r["seconds_all"][0] > 0
        assert r["tokens_per_s_ratio"] > 0 and r["peak_mem_ratio"] > 0
        assert r["mem_method"] and r["base_mem_mb"] > 0 and r["cpu_seconds_all"][0] >= 0
        assert len(r["other_cpu_frac_all"]) == 1 and 0 <= r["other_cpu_frac_all"][0] <= 1
        assert r["live_peak_mem_mb"] > 0 and r["live_peak_mem_ratio"] > 0
        assert r["peak_mem_mb_all"] == [r["peak_mem_mb"]]
    assert all(r["tokens_per_s_ratio"] == 1.0 for r in rows if r["method"] == "none")
    assert report["machine"]["torch_threads"] >= 1 and report["machine"]["device"] == "cpu"
    assert report["text_source"].startswith("explainer/data/bench_text.txt (Source:")  # the shipped text by default
    assert report["model"] and report["date"]
    printed = capsys.readouterr().out
    assert "tokens_per_s" in printed and "| method |" in printed


def test_position_columns_appear_only_when_a_method_counts_them():
    rows = [_row("none", 2048, 6.0, 800.0), _row("sources", 2048, 0.3, 1400.0)]
    rows[0].positions = {"forward_positions": 2079}
    assert "forward positions" not in format_markdown(with_ratios(rows[:1]))  # plain generation's alone: no columns
    rows[1].positions = {
        "forward_positions": 33973, "leave_one_sentence_out_positions": 183040, "contextcite_positions": 133120,
    }  # fmt: skip

    plain = format_table(with_ratios(rows)).splitlines()
    md = format_markdown(with_ratios(rows)).splitlines()

    assert plain[0].split()[-3:] == ["forward_positions", "loo_sentence_positions", "contextcite_positions"]
    assert plain[1].split()[-3:] == ["2,079", "-", "-"] and plain[2].split()[-3:] == ["33,973", "183,040", "133,120"]
    assert md[0].endswith("| forward positions | leave-one-sentence-out | ContextCite (64) |")


def test_bench_of_sources_counts_its_forward_positions(tiny_model_dir, tmp_path):
    """A smoke run of the bench path for Sources (no timing is checked): its seconds against plain generation's and
    the forward positions it computed against leave-one-sentence-out and ContextCite's 64 ablations."""
    out = tmp_path / "bench.json"
    argv = ["bench", "--model", str(tiny_model_dir), "--prompt-tokens", "64", "--new-tokens", "2", "--methods",
            "none,sources:fit=leave_one_out:depth=0:batch_size=2,sources", "--repeats", "1", "--device", "cpu",
            "--json", str(out)]  # fmt: skip

    assert main(argv) == 0

    plain, sources, surrogate = json.loads(out.read_text())["rows"]
    assert plain["positions"] == {"forward_positions": 64 + 2 - 1}
    assert sources["method"] == "sources:fit=leave_one_out:depth=0:batch_size=2" and 0 < sources["tokens_per_s_ratio"]
    ablations = surrogate["positions"]["forward_positions"]  # 20 removal passes, each from its first removed unit on
    assert 64 + 2 - 1 < ablations < surrogate["positions"]["contextcite_positions"]
    counts = sources["positions"]
    assert set(counts) == {"forward_positions", "leave_one_sentence_out_positions", "contextcite_positions"}
    assert counts["contextcite_positions"] == 64 * (64 + 2)  # 64 full passes over the prompt and answer
    sentences = counts["leave_one_sentence_out_positions"] // (64 + 2) - 1
    assert sentences >= 2 and counts["forward_positions"] < counts["leave_one_sentence_out_positions"]
    phases = surrogate["phase_seconds"]  # the surrogate's own split of its time: passes on the model, fit on the host
    assert set(phases) == {"passes_seconds", "fit_seconds"} and min(phases.values()) > 0
    assert plain["phase_seconds"] is None and sources["phase_seconds"] is None  # leave-one-out times no phases


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--methods", "none,nope"], "Available for bench: none, plain, macs"),
        (["--prompt-tokens", "16,x"], "comma-separated integers"),
        (["--prompt-tokens", "0"], "positive"),
        (["--data", "/no/such/file.json"], "no such file"),
        (["--prompt-file", "/no/such/file.txt"], "does not exist"),
    ],
)
def test_bad_input_is_a_one_line_error_before_any_model_loads(flags, message, capsys):
    assert main(["bench", "--model", "/no/such/model", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and message in err and len(err.splitlines()) == 1


def test_text_options_exclude_each_other_and_are_read_before_any_model_loads(tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("# header only\n", encoding="utf-8")
    text = tmp_path / "t.txt"
    text.write_text("Some text.", encoding="utf-8")

    assert main(["bench", "--model", "/no/such/model", "--prompt-file", str(empty)]) == 2
    assert "holds no text" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:  # argparse: not allowed with argument
        main(["bench", "--prompt-file", str(text), "--data", "squad_v2-dev"])
    assert exit_info.value.code == 2 and "not allowed with" in capsys.readouterr().err


def test_method_spec_options():
    from explainer.bench import method_from_spec
    from explainer.errors import InputError

    naive = method_from_spec("atman:fast=false:batch_size=2")
    assert naive.name == "atman" and naive.config.fast is False and naive.config.batch_size == 2
    assert method_from_spec("macs:alpha=0.5:pooling=mean").config.alpha == 0.5
    with pytest.raises(InputError, match="key=value"):
        method_from_spec("macs:alpha")
    with pytest.raises(InputError, match="Unknown option 'nope' for macs; its options: alpha, pooling"):
        method_from_spec("macs:nope=1")


def test_efficiency_table_means_and_changes_by_hand():
    from explainer.bench import efficiency_rows, format_efficiency

    rows = [
        _row("none", 256, 40.0, 800.0),
        _row("none", 1024, 20.0, 1000.0),
        _row("macs", 256, 36.0, 820.0),
        _row("macs", 1024, 18.0, 1100.0),
        _row("atman", 256, 2.0, 1200.0),  # measured at one length only: compared with plain at that length
    ]
    table = {e.method: e for e in efficiency_rows(rows)}
    assert list(table) == ["none", "macs", "atman"]
    macs = table["macs"]
    assert (macs.mean_tokens_per_s, macs.mean_peak_mem_mb) == (27.0, 960.0)
    assert macs.speed_change == pytest.approx(27.0 / 30.0 - 1) and macs.mem_change == pytest.approx(960 / 900 - 1)
    atman = table["atman"]
    assert atman.lengths == [256] and atman.speed_change == pytest.approx(-0.95)
    assert atman.mem_change == pytest.approx(0.5)

    text = format_efficiency(rows).splitlines()
    assert text[1].split()[:4] == ["Pure", "inference", "900", "30.00"]
    assert "960 (+7%)" in text[2] and "27.00 (-10%)" in text[2]
    assert "1200 (+50%)" in text[3] and "2.00 (-95%)" in text[3] and text[3].endswith("256")
    md = format_efficiency(rows, markdown=True).splitlines()
    assert md[0].startswith("| Method |") and md[3] == "| macs | 960 (+7%) | 27.00 (-10%) | 256,1024 |"


def _report(rows: list[BenchRow], date: str, model: str = "tiny", k: int = 32) -> dict:
    from dataclasses import asdict

    machine = {"device": "cpu", "torch_threads": 2, "cpu_model": "x", "cpu_count": 2, "torch": "t", "transformers": "t"}
    return {"rows": [asdict(r) for r in rows], "machine": machine, "model": model, "text_source": "s",
            "new_tokens": k, "date": date}  # fmt: skip


def test_reports_combine_later_rows_win_and_ratios_are_recomputed(tmp_path, capsys):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(_report([_row("none", 256, 40.0, 800.0), _row("macs", 256, 10.0, 900.0)], "day 1")))
    b.write_text(json.dumps(_report([_row("macs", 256, 38.0, 820.0), _row("atman", 256, 2.0, 840.0)], "day 2")))

    merged = bench.load_reports([str(a), str(b)])

    by_method = {r["method"]: r for r in merged["rows"]}
    assert set(by_method) == {"none", "macs", "atman"} and merged["date"] == "day 1, day 2"
    assert by_method["macs"]["tokens_per_s"] == 38.0 and by_method["macs"]["tokens_per_s_ratio"] == pytest.approx(0.95)
    assert by_method["atman"]["peak_mem_ratio"] == pytest.approx(1.05)

    png, html = tmp_path / "plot.png", tmp_path / "plot.html"
    assert main(["bench", "--report", f"{a},{b}", "--plot", str(png)]) == 0
    assert main(["bench", "--report", f"{a},{b}", "--plot", str(html), "--markdown"]) == 0
    out = capsys.readouterr().out
    assert "Table 3 layout" in out and "| atman | 840 (+5%) | 2.00 (-95%) | 256 |" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "plotly" in html.read_text()[:100_000].lower()

    c = tmp_path / "c.json"
    c.write_text(json.dumps(_report([_row("none", 256, 40.0, 800.0, k=8)], "day 3", k=8)))
    assert main(["bench", "--report", f"{a},{c}"]) == 2
    assert "differ in new_tokens" in capsys.readouterr().err
    assert main(["bench", "--report", str(tmp_path / "missing.json")]) == 2
    assert main(["bench", "--report", str(a), "--plot", str(tmp_path / "plot.svg")]) == 2
    assert ".html or .png" in capsys.readouterr().err


def test_the_warm_up_generates_every_token_on_an_accelerator():
    from explainer.bench.worker import WARMUP_NEW_TOKENS, warmup_new_tokens

    assert warmup_new_tokens("cpu", 32) == WARMUP_NEW_TOKENS < 32
    assert warmup_new_tokens("cpu", 1) == 1
    assert warmup_new_tokens("cuda", 32) == 32


def test_plain_rows_say_which_decode_loop_ran(tiny_model_dir, monkeypatch):
    """`plain` times the library's own loop without methods; each row names the loop (`--decode` chooses it)."""
    from explainer.bench.config import BenchConfig
    from explainer.bench.worker import measure
    from explainer.decoding import DECODE_ENV

    monkeypatch.setenv(DECODE_ENV, "auto")  # restored after the test, whatever the worker sets
    paths = {}
    for method, decode in [
        ("none", None),
        ("plain", None),
        ("plain", "static"),
        ("macs", "static"),
        ("rollout", "static"),
    ]:
        config = BenchConfig(
            model=str(tiny_model_dir), prompt_lengths=(16,), new_tokens=3, methods=(method,), repeats=1, device="cpu",
            dtype="float32", decode=decode,
        )  # fmt: skip
        row = measure(config, method, 16)["row"]
        assert row["new_tokens"] == 3 and row["tokens_per_s"] > 0
        paths[method, decode] = row["decode_path"]
    assert paths == {("none", None): "generate", ("plain", None): "solo", ("plain", "static"): "static",
                     ("macs", "static"): "static", ("rollout", "static"): "static"}  # fmt: skip
