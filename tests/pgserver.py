"""Real PostgreSQL and Redis servers for tests (Debian's `postgresql` and `redis-server` packages).

PostgreSQL: one server per test session (initdb in a temp dir on 127.0.0.1, run as the `postgres` user
when the tests run as root, see bench/cluster.py), a fresh database per test. Import the fixtures in a
conftest.py or test module: `from pgserver import pg_server, pg_url, redis_url  # noqa: F401`.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.cluster import REDIS_BIN, PostgresServer, postgres_unavailable, start_redis


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PostgresServer]:
    reason = postgres_unavailable()
    if reason:
        pytest.skip(f"{reason}; the Makefile installs it")
    # Not under pytest's tmp dir: that is private to root, and the server runs as `postgres`.
    server = PostgresServer(Path(tempfile.mkdtemp(prefix="blendrag-pg-")))
    try:
        server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(server.root, ignore_errors=True)


@pytest.fixture
def pg_url(pg_server: PostgresServer) -> str:
    """The SQLAlchemy URL of a fresh database on the session's PostgreSQL server."""
    return pg_server.create_database()


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    """A redis-server of its own (the shared KV tier of a scale-out deployment)."""
    if REDIS_BIN is None:
        pytest.skip("redis-server not found (Debian package redis-server; the Makefile installs it)")
    proc, url = start_redis(tmp_path)
    try:
        yield url
    finally:
        proc.kill()
        proc.wait(10)
