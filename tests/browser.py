"""A real browser for the page tests: Debian's Chromium driven by Playwright for Python.

Playwright's own browser download does not work on these machines, so the system Chromium is
launched through ``executable_path``. Each page records console errors and uncaught page
errors; a test fails when any appeared.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest

CHROMIUM = os.environ.get("RAGCHAINS_CHROMIUM", "/usr/bin/chromium")
# Headless and quiet: no sandbox as root, no calls home (this machine has no network).
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@dataclass
class WatchedPage:
    page: Any
    errors: list[str] = field(default_factory=list)

    def assert_clean(self) -> None:
        assert not self.errors, f"browser errors: {self.errors}"


@contextmanager
def chromium() -> Iterator[Any]:
    if not shutil.which(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: `make setup` installs Debian's chromium package")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            yield browser
        finally:
            browser.close()


def open_page(browser: Any, url: str, *, width: int = 1280, height: int = 1000) -> WatchedPage:
    """A new page of ``browser`` (or of a browser context) at ``url``, watched for errors."""
    page = browser.new_page()
    page.set_viewport_size({"width": width, "height": height})
    watched = WatchedPage(page)
    page.on(
        "console",
        lambda message: (
            watched.errors.append(f"console: {message.text}") if message.type == "error" else None
        ),
    )
    page.on("pageerror", lambda error: watched.errors.append(f"pageerror: {error}"))
    page.goto(url)
    return watched
