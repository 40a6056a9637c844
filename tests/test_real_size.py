"""scripts/real_size.py at reduced depth: it builds a default model from its real configuration with random weights,
loads it as the app does, and times a text and an image request (the README's deployment table comes from it)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import real_size  # noqa: E402


def test_real_size_measures_a_reduced_default_vision_model(tmp_path, capsys):
    results = tmp_path / "rows.jsonl"
    args = ["--model", "Qwen/Qwen2-VL-2B-Instruct", "--cache", str(tmp_path), "--layers", "1", "--vision-depth", "1",
            "--vocab", "2048", "--prompt-tokens", "60", "--new-tokens", "4", "--image-tokens", "16",
            "--results", str(results)]  # fmt: skip
    assert real_size.main(args) == 0
    row = json.loads(results.read_text())
    assert row["model"] == "Qwen/Qwen2-VL-2B-Instruct" and row["reduced"] == "L1-V1-vocab2048"
    assert row["text_tokens"] == row["image_tokens"] == 4 and row["image_image_tokens"] <= 16
    assert 50 <= row["text_prompt_tokens"] <= 60
    assert row["load_s"] > 0 and row["peak_rss_gb"] >= row["load_rss_gb"] > 0
    assert row["text_first_token_s"] > 0 and row["image_total_s"] >= row["image_first_token_s"] > 0
