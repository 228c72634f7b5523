"""The admin page's synced folders: a folder synced with `blendrag sync` shows its path, collection, last sync
and what changed, at desktop width and at 390 px."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from apitools import BYPASS_CSP, LiveServer

from app.cli import main

pytestmark = pytest.mark.browser

TIMEOUT_MS = 60_000


@pytest.mark.parametrize("width", [1280, 390])
def test_a_synced_folder_is_listed(
    ui_server: LiveServer, browser: Any, shot: Any, width: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / f"handbook-{width}"
    folder.mkdir()
    (folder / "a.md").write_text("# A\n\nQuintaro is the capital of Zorblat.\n")
    (folder / "b.md").write_text("# B\n\nSourdough needs a starter.\n")
    assert main(["sync", str(folder), "--server", ui_server.url]) == 0
    (folder / "b.md").unlink()
    assert main(["sync", str(folder), "--server", ui_server.url]) == 0
    context = browser.new_context(viewport={"width": width, "height": 900}, **BYPASS_CSP)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        page.goto(f"{ui_server.url}/admin")
        row = page.wait_for_selector(f"#syncs-body tr[data-collection='handbook-{width}']", timeout=TIMEOUT_MS)
        text = row.inner_text()
        assert str(folder.resolve()) in text and f"handbook-{width}" in text
        assert "-1 removed · 1 unchanged" in text
        assert page.evaluate("document.documentElement.scrollWidth") <= width  # nothing sticks out sideways
        shot(page, f"admin-syncs-{width}")
    finally:
        context.close()
    assert errors == []
