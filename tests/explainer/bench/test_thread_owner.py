"""The `thread-owner` command (`explainer/bench/thread_owner.py`): its options, the alternating processes and the
summary, and `--library`, whose processes import another checkout's `explainer` (here a fake one that records
what it was asked). Nothing is timed and no model is loaded."""

from __future__ import annotations

import json

import pytest

from explainer.bench import thread_owner
from explainer.bench.thread_owner import AFTER_GENERATE, FRESH, ThreadOwnerConfig
from explainer.cli import build_parser, main
from explainer.cli.thread_owner import thread_owner_config


def test_the_options_become_one_config():
    args = build_parser().parse_args(
        ["thread-owner", "--rounds", "2", "--repeats", "3", "--prompt-tokens", "100", "--new-tokens", "8"]
    )
    assert thread_owner_config(args) == ThreadOwnerConfig(prompt_tokens=100, new_tokens=8, repeats=3, rounds=2)
    defaults = thread_owner_config(build_parser().parse_args(["thread-owner"]))
    assert defaults == ThreadOwnerConfig() and (defaults.prompt_tokens, defaults.dtype) == (581, "float32")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--rounds", "0"], "--rounds must be 1 or more, got 0"),
        (["--prompt-tokens", "-4"], "--prompt-tokens must be 1 or more"),
        (["--library", "no/such/checkout"], "--library must be a checkout holding explainer/"),
        (["--json", "no/such/folder/out.json"], "its folder does not exist"),
    ],
)
def test_bad_options_exit_with_one_line_before_any_process(args, message, capsys, monkeypatch):
    monkeypatch.setattr(thread_owner, "spawn", lambda *a: pytest.fail("a process started"))
    assert main(["thread-owner", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_the_kinds_alternate_and_the_summary_has_the_medians_ratio_and_command(tmp_path, monkeypatch):
    order = []

    def spawn(kind, config):
        order.append(kind)
        seconds = [1.0, 3.0] if kind == FRESH else [2.0, 4.0 + len(order)]
        return {"seconds": seconds, "device": "cpu", "torch_threads": 2}

    monkeypatch.setattr(thread_owner, "spawn", spawn)
    out = tmp_path / "owner.json"
    assert main(["thread-owner", "--rounds", "2", "--json", str(out)]) == 0
    summary = json.loads(out.read_text())
    assert order == [FRESH, AFTER_GENERATE] * 2
    assert summary["runs"] == {FRESH: [1.0, 3.0, 1.0, 3.0], AFTER_GENERATE: [2.0, 6.0, 2.0, 8.0]}
    assert (summary["fresh_s"], summary["after_generate_s"], summary["ratio"]) == (2.0, 4.0, 2.0)
    assert summary["command"] == f"python -m explainer thread-owner --rounds 2 --json {out}"
    assert summary["args"]["rounds"] == 2 and summary["machine"]["torch_threads"] == 2 and summary["date"]


FAKE_EXPLAIN = """
import json, os
CALLS = os.environ["FAKE_CALLS"]

def explain(bundle, prompt, **kwargs):
    with open(CALLS, "a") as f:
        f.write(json.dumps({"prompt": prompt, **kwargs}) + "\\n")
"""
FAKE_LOADING = """
import torch

class _Tokenizer:
    def decode(self, ids):
        return " ".join(map(str, ids))

class _Model:
    device = torch.device("cpu")
    generated = 0

    def generate(self, ids, **kwargs):
        with open(__import__("os").environ["FAKE_CALLS"], "a") as f:
            f.write('{"generate": %d}\\n' % ids.shape[1])

class _Bundle:
    tokenizer, model = _Tokenizer(), _Model()

def load_model(name=None, dtype=None, max_prompt_tokens=None):
    return _Bundle()
"""


def test_library_runs_the_processes_on_another_checkouts_explainer(tmp_path, monkeypatch):
    """Each kind in its own process, importing the `explainer` of `--library`: a fake that records the calls."""
    checkout = tmp_path / "checkout"
    files = {
        "explainer/__init__.py": "",
        "explainer/errors.py": "class ExplainerError(Exception): ...\nclass InputError(ExplainerError): ...\n",
        "explainer/explain.py": FAKE_EXPLAIN,
        "explainer/models/__init__.py": "",
        "explainer/models/loading.py": FAKE_LOADING,
        "explainer/bench/__init__.py": "",
        "explainer/bench/prompts.py": "def prompt_ids(tok, n, data, file):\n    return list(range(n)), 'fake'\n",
    }
    for rel, text in files.items():
        (checkout / rel).parent.mkdir(parents=True, exist_ok=True)
        (checkout / rel).write_text(text)
    calls = tmp_path / "calls.jsonl"
    monkeypatch.setenv("FAKE_CALLS", str(calls))
    monkeypatch.chdir(tmp_path)  # a relative --library: the processes run in it, so it is made absolute
    config = ThreadOwnerConfig(prompt_tokens=70, new_tokens=5, repeats=2, rounds=1, library="checkout")
    assert config.library == str(checkout.resolve())
    for kind in (FRESH, AFTER_GENERATE):
        got = thread_owner.spawn(kind, config)
        assert len(got["seconds"]) == 2 and got["device"] == "cpu"
    lines = [json.loads(line) for line in calls.read_text().splitlines()]
    prompt = " ".join(map(str, range(70)))
    one = [{"prompt": prompt, "methods": ["macs"], "chat_template": False, "answer": None, "max_new_tokens": k}
           for k in (2, 5, 5)]  # fmt: skip
    assert lines == one + [{"generate": 64}] + one  # the warm-up, two timed calls; a generate first after it
