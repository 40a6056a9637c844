"""Fixtures of the browser tests: the real app in a subprocess on a free loopback port, headless Chromium driven by
Playwright for Python, and one fresh page per test wrapped in `AppPage`.

Every test in this folder gets the `browser` marker. The tests are skipped, with the reason, when Playwright, a
Chromium binary or the embedded model is missing; with `EXPLAINER_REQUIRE_BROWSER=1` (set by `.ci/run`) a missing
piece fails them instead. Chromium is found at `$EXPLAINER_CHROMIUM`, else `/usr/bin/chromium` or `chromium` on the
PATH (Debian's package; Playwright's own browser download is not needed). Screenshots go to `$EXPLAINER_SCREENSHOTS`
if set, else a pytest temporary folder; a failing test leaves `FAILED-<test>-<window width>.png` there, and the app's
log is appended to the failure report.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from .app_page import AppPage

ROOT = Path(__file__).resolve().parents[2]
APP_START_SECONDS = 180  # importing gradio and torch on a loaded 2-core machine takes a while
REQUIRE_ENV = "EXPLAINER_REQUIRE_BROWSER"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark this folder's tests `browser` and run them after all others: Playwright's sync API keeps an event loop
    running in the main thread from the first browser test to the end of the session, and every later test that
    calls `asyncio.run` (the app's handlers) or starts Playwright itself would fail."""
    here = Path(__file__).parent
    browser = []
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.browser)
            browser.append(item)
    last = set(browser)
    items[:] = [item for item in items if item not in last] + browser


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    report = yield
    if report.when == "call":
        item.stash[_FAILED] = report.failed
        for name in ("app_server", "vl_app_server"):
            server = getattr(item, "funcargs", {}).get(name)
            if report.failed and server is not None:
                report.sections.append((f"{name} log (tail)", server.log_tail()))
    return report


_FAILED = pytest.StashKey[bool]()


def chromium_path() -> str | None:
    """The Chromium binary the tests drive, or None."""
    candidates = [os.environ.get("EXPLAINER_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium")]
    candidates.append(shutil.which("chromium-browser"))
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


def missing_piece() -> str | None:
    """Why the browser tests cannot run here, or None."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install playwright)"
    if chromium_path() is None:
        return "no Chromium binary (apt-get install chromium, or set EXPLAINER_CHROMIUM)"
    from explainer.errors import ModelLoadError
    from explainer.models.loading import embedded_gguf_path

    try:
        embedded_gguf_path()
    except ModelLoadError as e:
        return f"the embedded model is not installed: {e}"
    return None


def _unavailable(reason: str) -> None:
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{REQUIRE_ENV}=1 but the browser tests cannot run: {reason}", pytrace=False)
    pytest.skip(f"browser tests skipped: {reason}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class AppServer:
    """`python app.py` in a subprocess with the embedded model, offline; with `vlm` (a model folder) the image tab has
    that vision-language model."""

    def __init__(self, log_path: Path, vlm: Path | None = None, calibration: Path | None = None) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.log_path = log_path
        env = {
            **os.environ,
            "GRADIO_SERVER_NAME": "127.0.0.1",
            "GRADIO_SERVER_PORT": str(self.port),
            "GRADIO_ANALYTICS_ENABLED": "False",
            "HF_HUB_OFFLINE": "1",
            "EXPLAINER_MODEL": "embedded",  # whatever the default becomes, the tests use the model in the repository
            "EXPLAINER_DTYPE": "float32",  # "auto" is bfloat16 on a CPU with native bf16: the same run everywhere
            "PYTHONUNBUFFERED": "1",
            "EXPLAINER_LOG": "DEBUG",  # the library logs when a request takes and releases the model
        }
        env.pop("EXPLAINER_VLM", None)
        if vlm is not None:
            env["EXPLAINER_VLM"] = str(vlm)
        if calibration is not None:  # macs_calibrated's weights folder (else the tests' own, `tiny_calibration`)
            env["EXPLAINER_CALIBRATION"] = str(calibration)
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [sys.executable, "app.py"], cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT
        )

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def model_free(self) -> bool:
        """Whether every request that took the model has released it (from the library's debug log)."""
        log = self.log_path.read_text(errors="replace")
        return len(re.findall(r"model \w+ acquired at", log)) == len(re.findall(r"model \w+ released at", log))

    def wait_model_free(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not self.model_free():
            if time.monotonic() > deadline:
                raise AssertionError(f"the model was still held {timeout:.0f} s later:\n{self.log_tail()}")
            time.sleep(0.2)

    def wait_ready(self, timeout: float = APP_START_SECONDS) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"app.py exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url, timeout=5) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.5)
        raise RuntimeError(f"app.py did not answer on {self.url} within {timeout:.0f} s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(15)
        self._log.close()


@pytest.fixture(scope="session")
def chromium() -> str:
    reason = missing_piece()
    if reason:
        _unavailable(reason)
    return chromium_path()


@pytest.fixture(scope="session")
def app_server(chromium: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AppServer]:
    server = AppServer(tmp_path_factory.mktemp("app") / "app.log")
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def vl_app_server(chromium: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AppServer]:
    """A second app whose image tab has the tiny random Qwen2.5-VL (no real weights offline), saved as a folder, and
    no calibration weights for it."""
    from ..vl_tiny import build_vl_model, make_vl_tokenizer

    folder = tmp_path_factory.mktemp("tiny-qwen2.5-vl")
    tokenizer = make_vl_tokenizer()
    build_vl_model(tokenizer).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    # no calibration weights for the tiny VLM here: the image tab says how to make them (the text model's ship)
    logs = tmp_path_factory.mktemp("vl-app")
    server = AppServer(logs / "app.log", vlm=folder, calibration=tmp_path_factory.mktemp("no-weights"))
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def browser(chromium: str) -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        instance = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"], headless=True)
        try:
            yield instance
        finally:
            instance.close()


@pytest.fixture(scope="session")
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = os.environ.get("EXPLAINER_SCREENSHOTS")
    path = Path(folder) if folder else tmp_path_factory.mktemp("screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


def _open(browser: object, url: str, screenshots: Path, viewport: dict[str, int]) -> AppPage:
    context = browser.new_context(viewport=viewport)
    page = context.new_page()
    page.set_default_timeout(60_000)
    page.goto(url)
    return AppPage(page, screenshots)


def _close(view: AppPage, screenshots: Path, request: pytest.FixtureRequest) -> None:
    if request.node.stash.get(_FAILED, True):  # failed (or never got to run): keep the evidence
        name = f"FAILED-{request.node.name}"
        view.page.screenshot(path=str(screenshots / f"{name}-{view.page.viewport_size['width']}.png"), full_page=True)
    view.page.context.close()


def _visit(browser: object, server: AppServer, screenshots: Path, request: pytest.FixtureRequest) -> Iterator[AppPage]:
    view = _open(browser, server.url, screenshots, {"width": 1400, "height": 1000})
    try:
        view.wait_loaded()
        yield view
    finally:
        _close(view, screenshots, request)


@pytest.fixture
def app(browser: object, app_server: AppServer, screenshots: Path, request: pytest.FixtureRequest) -> Iterator[AppPage]:
    """A fresh visitor: a new browser context on the app, with the model line loaded."""
    yield from _visit(browser, app_server, screenshots, request)


@pytest.fixture
def visit(
    browser: object, app_server: AppServer, screenshots: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[..., AppPage]]:
    """`visit(width, height, query="")`: a fresh visitor with a window of that size on the app's address plus `query`
    (e.g. "?result=general-question&step=3"), with the model line loaded; as many as the test needs."""
    views: list[AppPage] = []

    def open_window(width: int, height: int, query: str = "") -> AppPage:
        views.append(_open(browser, app_server.url + query, screenshots, {"width": width, "height": height}))
        views[-1].wait_loaded()
        return views[-1]

    try:
        yield open_window
    finally:
        for view in views:
            _close(view, screenshots, request)


@pytest.fixture
def vl_app(
    browser: object, vl_app_server: AppServer, screenshots: Path, request: pytest.FixtureRequest
) -> Iterator[AppPage]:
    """A fresh visitor of the app with the tiny vision-language model, on the image tab."""
    for view in _visit(browser, vl_app_server, screenshots, request):
        view.page.get_by_role("tab", name="Image + question").click()
        yield view
