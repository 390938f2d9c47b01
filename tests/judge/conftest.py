"""Judging sessions with known replies (no model needed), a server on a free port, and headless
Chromium (Debian's chromium + chromedriver) through selenium."""

from __future__ import annotations

import json
import shutil
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from llmkit.judge.server import make_server
from llmkit.judge.session import pair_items, write_items
from llmkit.core.workspace import Workspace

CHROMIUM, CHROMEDRIVER = shutil.which("chromium") or shutil.which("chromium-browser"), shutil.which("chromedriver")
needs_browser = pytest.mark.skipif(
    not (CHROMIUM and CHROMEDRIVER),
    reason="headless browser tests need Debian's chromium and chromedriver (apt install chromium "
           "chromium-driver); not found on PATH")
MODELS = ("modelalpha", "modelbeta", "modelgamma")  # names no reply or prompt contains


def arithmetic_prompts(n: int) -> list[tuple[str, str]]:
    """(id, prompt) pairs; the answer to prompt i is 30 + 3i."""
    return [(f"q{i}", f"What is {10 + i}+{20 + 2 * i}?") for i in range(n)]


def known_replies(n: int, models=MODELS) -> dict[str, list[str]]:
    """Each model's replies to `arithmetic_prompts(n)`: the first right, the k-th off by 10·k."""
    return {m: [str(30 + 3 * i + 10 * k) for i in range(n)] for k, m in enumerate(models)}


def write_session(ws_root: Path, name: str, prompts, replies: dict[str, list[str]], seed: int = 0) -> Path:
    """A session artifact as `llmkit judge --prepare` leaves it, from replies given here."""
    b = Workspace(ws_root).builder(name, stage="judge", quiet=True, config={
        "models": list(replies), "prompts": "test", "seed": seed})
    with b:
        write_items(b.dir, pair_items(prompts, replies, seed))
    return b.final


class Server:
    """`make_server` serving in a thread, for as long as the `with` block."""

    def __init__(self, session: Path, token: str | None = None):
        self.httpd = make_server(session, "127.0.0.1", 0, token)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.session = self.httpd.RequestHandlerClass.session

    def __enter__(self):
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.session.journal.close()


def call(url: str, body: dict | bytes | None = None, headers: dict | None = None) -> tuple[int, dict]:
    """(status, JSON answer) of a GET, or of a POST of `body` (a dict is sent as JSON)."""
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    request = urllib.request.Request(url, data=data, headers={
        **({"Content-Type": "application/json"} if data is not None else {}), **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


@pytest.fixture
def browser():
    """`browser()` opens a headless Chromium; all are closed after the test."""
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    opened = []

    def open_browser():
        options = Options()
        for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--window-size=1200,900"):
            options.add_argument(arg)
        options.binary_location = CHROMIUM
        driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
        opened.append(driver)
        return driver

    yield open_browser
    for driver in opened:
        driver.quit()
