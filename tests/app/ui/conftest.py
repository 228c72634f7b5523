"""Browser tests: Debian's chromium (never a downloaded browser) driven by Playwright against a real
uvicorn server on 127.0.0.1 running the tiny-model settings."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from apitools import BYPASS_CSP, LiveServer, server_settings

from app.main import create_app

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SCREENSHOTS = Path(__file__).resolve().parents[3] / "test-output" / "screenshots"


@pytest.fixture(scope="module")
def ui_server(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path) -> Iterator[LiveServer]:
    settings = server_settings(
        tmp_path_factory.mktemp("ui") / "data",
        tiny_llama_dir,
        # Greedy decoding of the random tiny model prints only newlines; sampling
        # gives visible text to look at.
        engine={"max_new_tokens": 16, "temperature": 1.0},
    )
    with LiveServer(create_app(settings, load_in_background=False)) as server:
        yield server


@pytest.fixture(scope="module")
def browser(missing_system_binary) -> Iterator[Any]:
    if not CHROMIUM.exists() or shutil.which(str(CHROMIUM)) is None:
        missing_system_binary(str(CHROMIUM), "chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@dataclass
class Console:
    """Errors the page logged; a test lists the ones it provokes on purpose in `expected`."""

    errors: list[str] = field(default_factory=list)
    expected: list[str] = field(default_factory=list)

    def unexpected(self) -> list[str]:
        return [e for e in self.errors if not any(x in e for x in self.expected)]


@pytest.fixture
def console() -> Console:
    return Console()


@pytest.fixture
def page(browser: Any, console: Console) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 900}, **BYPASS_CSP)
    page = context.new_page()
    page.on("pageerror", lambda exc: console.errors.append(str(exc)))
    page.on("console", lambda msg: console.errors.append(msg.text) if msg.type == "error" else None)
    yield page
    context.close()
    assert console.unexpected() == []  # no uncaught JS error and no failed load on any page


@pytest.fixture
def shot() -> Callable[[Any, str], Path]:
    """shot(page, name): a full-page screenshot in test-output/screenshots/ (gitignored) to look at."""

    def take(page: Any, name: str) -> Path:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        path = SCREENSHOTS / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        return path

    return take
