"""Fixtures for the kvcache tests; helpers live in kvtest_helpers.py (a name no other test dir uses)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# importable in pytest's prepend and importlib import modes alike
sys.path.insert(0, str(Path(__file__).parent))

from kvtest_helpers import REDIS_BIN, RedisServer, free_port  # noqa: E402


@pytest.fixture
def redis_server(tmp_path: Path, missing_system_binary) -> Iterator[RedisServer]:
    if REDIS_BIN is None:
        missing_system_binary("redis-server", "redis-server")
    workdir = tmp_path / "redis"
    workdir.mkdir()
    server = RedisServer(port=free_port(), workdir=workdir)
    server.start()
    try:
        yield server
    finally:
        server.kill()
