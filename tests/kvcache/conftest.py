"""Fixtures for the kvcache tests; helpers live in tests/kvtest_helpers.py (tests/ is on pytest's pythonpath)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kvtest_helpers import REDIS_BIN, RedisServer, free_port


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    if REDIS_BIN is None:
        pytest.skip("redis-server binary not found (Debian package redis-server; .ci/run installs it)")
    workdir = tmp_path / "redis"
    workdir.mkdir()
    server = RedisServer(port=free_port(), workdir=workdir)
    server.start()
    try:
        yield server
    finally:
        server.kill()
