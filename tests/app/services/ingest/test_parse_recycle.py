"""A parse process that a file left large is replaced, and an idle one is stopped (issue 62, item 5: a 5 MB HTML
page left the parse child at 318 MB, idle)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from app.services.ingest.parse_process import GRACE_S, ParseServer
from ingest import IngestSettings

MIB = 1024 * 1024
# 5,000 small elements (0.4 MB of HTML): the parse leaves a fresh child about 25 MiB larger than it was.
ITEMS = "".join(f"<div><p>Item {i} with <b>bold</b> text.</p></div>" for i in range(5000))
MANY_ELEMENTS = f"<html><body>{ITEMS}</body></html>"


def _parse(server: ParseServer, path: Path, settings: IngestSettings) -> list[str]:
    return [d.text[:12] for d in server.parse(path, settings, None, GRACE_S)]


def test_a_child_a_file_left_over_the_threshold_is_replaced(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    small = tmp_path / "small.txt"
    small.write_text("Quintaro is the capital of Zorblat.")
    large = tmp_path / "large.html"
    large.write_text(MANY_ELEMENTS)
    server = ParseServer()
    try:
        assert _parse(server, small, IngestSettings(parse_recycle_bytes=None)) == ["Quintaro is "]
        first, fresh_rss = server.pid, server.rss_bytes()
        assert first is not None and fresh_rss is not None
        # The threshold 10 MiB over what a fresh child holds: a small file leaves it under, the HTML over.
        settings = IngestSettings(parse_recycle_bytes=fresh_rss + 10 * MIB)
        assert _parse(server, small, settings) == ["Quintaro is "]
        assert server.pid == first  # kept for the next file
        with caplog.at_level(logging.INFO, logger="app.services.ingest.parse_process"):
            assert _parse(server, large, settings) == ["Item 0 with "]
        assert server.pid is None  # replaced: the next file starts a fresh child
        assert "over ingest.parse_recycle_bytes" in caplog.text
        assert _parse(server, small, settings) == ["Quintaro is "]
        assert server.pid not in (None, first)
        assert server.rss_bytes() < fresh_rss + 10 * MIB
    finally:
        server.close()


def test_an_idle_child_is_stopped(tmp_path: Path) -> None:
    small = tmp_path / "small.txt"
    small.write_text("Quintaro is the capital of Zorblat.")
    server = ParseServer()
    try:
        _parse(server, small, IngestSettings(parse_idle_s=0.2))
        assert server.pid is not None
        deadline = time.monotonic() + 30
        while server.pid is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.pid is None
        # Kept while files keep coming: no timer runs with parse_idle_s null.
        _parse(server, small, IngestSettings(parse_idle_s=None))
        kept = server.pid
        time.sleep(0.5)
        assert kept is not None and server.pid == kept
    finally:
        server.close()
