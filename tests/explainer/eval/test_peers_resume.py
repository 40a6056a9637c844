"""`run_peers` resumes from its results file: rows already there are neither measured nor trained for again
(explainer/eval/peers.py). The peers themselves are stubbed, so this runs without `pip install .[peers]`."""

from __future__ import annotations

import json
from types import SimpleNamespace

import torch

from explainer.errors import InputError
from explainer.eval import peers
from explainer.eval.peers import PeerConfig, run_peers


def test_run_peers_appends_each_row_and_a_rerun_skips_the_done_ones(tmp_path, monkeypatch):
    trained, measured = [], []

    def fake_train(bundle, rows, cfg, workdir):
        trained.append(len(rows))
        return "estimator"

    def fake_row(bundle, row, estimator, cfg):
        assert estimator == "estimator"
        measured.append(row["id"])
        if row["id"] == "bad":
            raise InputError("Row 'bad': no answer, or fewer than 2 context sentences to ablate.")
        return {"id": row["id"], "methods": {"at2": {"lds": 0.5}}}

    monkeypatch.setattr(peers, "train_at2", fake_train)
    monkeypatch.setattr(peers, "peer_row", fake_row)
    bundle = SimpleNamespace(model=torch.nn.Linear(1, 1))  # any weak-referenceable model
    path = tmp_path / "peers.jsonl"
    rows = [{"id": i} for i in ("a", "bad", "b")]

    first = run_peers(bundle, rows[:2], [], PeerConfig(), tmp_path, path)  # as if stopped after two rows
    assert [r["id"] for r in first] == ["a", "bad"] and "error" in first[1]
    assert [json.loads(line)["id"] for line in path.read_text().splitlines()] == ["a", "bad"]

    again = run_peers(bundle, rows, [], PeerConfig(), tmp_path, path)
    assert measured == ["a", "bad", "b"] and trained == [0, 0]
    assert [r["id"] for r in again] == ["a", "bad", "b"]
    assert [json.loads(line)["id"] for line in path.read_text().splitlines()] == ["a", "bad", "b"]

    run_peers(bundle, rows, [], PeerConfig(), tmp_path, path)  # all done: AT2 is not trained again
    assert trained == [0, 0] and measured == ["a", "bad", "b"]


def test_run_peers_trains_at2_only_when_it_is_asked_for(tmp_path, monkeypatch):
    trained, asked = [], []
    monkeypatch.setattr(peers, "train_at2", lambda *a: trained.append(1) or "estimator")
    monkeypatch.setattr(peers, "_prepared", lambda bundle, row, cfg: row)
    monkeypatch.setattr(peers, "peer_row", lambda b, row, est, cfg: asked.append(est) or {"id": row["id"]})
    bundle = SimpleNamespace(model=torch.nn.Linear(1, 1))
    run_peers(bundle, [{"id": "a"}], [{"id": "t"}], PeerConfig(peers=("context-cite",)), tmp_path, tmp_path / "c")
    assert trained == [] and asked == [None]
    run_peers(bundle, [{"id": "a"}], [{"id": "t"}], PeerConfig(peers=("at2",)), tmp_path, tmp_path / "a")
    assert trained == [1] and asked == [None, "estimator"]
