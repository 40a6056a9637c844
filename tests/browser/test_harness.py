"""The harness itself, without a browser: when the browser tests skip, and when CI turns the skip into a failure."""

from __future__ import annotations

import os
import sys

import pytest

from . import conftest


def test_a_missing_playwright_is_named(monkeypatch):
    monkeypatch.setitem(sys.modules, "playwright", None)  # import fails as if not installed
    monkeypatch.setitem(sys.modules, "playwright.sync_api", None)
    assert "playwright is not installed" in conftest.missing_piece()


def test_a_missing_chromium_is_named(monkeypatch):
    pytest.importorskip("playwright.sync_api")
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    assert conftest.chromium_path() is None
    assert "no Chromium binary" in conftest.missing_piece()


def test_chromium_can_be_named_by_the_environment(monkeypatch, tmp_path):
    fake = tmp_path / "my-chromium"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("EXPLAINER_CHROMIUM", str(fake))
    assert conftest.chromium_path() == str(fake)


def test_missing_pieces_skip_unless_ci_requires_the_browser(monkeypatch):
    monkeypatch.delenv(conftest.REQUIRE_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match="browser tests skipped: no Chromium"):
        conftest._unavailable("no Chromium")
    monkeypatch.setenv(conftest.REQUIRE_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match="EXPLAINER_REQUIRE_BROWSER=1 but the browser tests cannot run"):
        conftest._unavailable("no Chromium")
