"""A real PostgreSQL server for tests: Debian's `postgresql` binaries, initdb in a temp dir, 127.0.0.1.

PostgreSQL refuses to run as root, so when the tests run as root (CI) the cluster is created and run as
the `postgres` system user that Debian's package creates (through `runuser`). Import the fixtures in a
conftest.py: `from pgserver import pg_server, pg_url  # noqa: F401`.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

PG_BIN_DIRS = sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
PG_BIN = next((d for d in PG_BIN_DIRS if os.path.exists(os.path.join(d, "initdb"))), None)
RUN_AS = "postgres"  # Debian's package creates this user


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _as_pg_user(cmd: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return cmd
    return ["runuser", "-u", RUN_AS, "--", *cmd]


@dataclass
class PostgresServer:
    root: Path
    port: int
    proc: subprocess.Popen[bytes] | None = None
    user: str = "blendrag"

    @property
    def data_dir(self) -> Path:
        return self.root / "pgdata"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://{self.user}@127.0.0.1:{self.port}/{database}"

    def start(self) -> None:
        assert PG_BIN is not None
        if os.geteuid() == 0:
            shutil.chown(self.root, RUN_AS, RUN_AS)
        subprocess.run(_as_pg_user([f"{PG_BIN}/initdb", "-D", str(self.data_dir), "-U", self.user, "--auth=trust",
                                    "-E", "UTF8", "--no-sync"]),
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        # fsync off: test data need not survive a power cut, and it keeps a 2-core machine responsive.
        self.proc = subprocess.Popen(
            _as_pg_user([f"{PG_BIN}/postgres", "-D", str(self.data_dir), "-h", "127.0.0.1", "-p", str(self.port),
                         "-k", str(self.root), "-c", "fsync=off", "-c", "synchronous_commit=off",
                         "-c", "full_page_writes=off", "-c", "max_connections=200"]),
            stdout=subprocess.DEVNULL, stderr=open(self.root / "postgres.log", "wb"),  # noqa: SIM115
        )
        deadline = time.monotonic() + 30
        while True:
            ready = subprocess.run([f"{PG_BIN}/pg_isready", "-h", "127.0.0.1", "-p", str(self.port), "-q"],
                                   check=False).returncode == 0
            if ready:
                return
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"postgres did not start: {(self.root / 'postgres.log').read_text()[-2000:]}")
            time.sleep(0.1)

    def create_database(self, name: str | None = None) -> str:
        """A fresh, empty database; returns its SQLAlchemy URL."""
        import psycopg

        name = name or f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(host="127.0.0.1", port=self.port, user=self.user, dbname="postgres",
                             autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()  # smart shutdown would wait for clients: SIGTERM is "fast" for postgres
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None


def _skip_reason() -> str | None:
    if PG_BIN is None:
        return "PostgreSQL server binaries not found (Debian package postgresql; the Makefile installs it)"
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "running as root without runuser: cannot start PostgreSQL as a non-root user"
    return None


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PostgresServer]:
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    root = Path(tempfile.mkdtemp(prefix="blendrag-pg-"))
    server = PostgresServer(root=root, port=_free_port())
    try:
        server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def pg_url(pg_server: PostgresServer) -> str:
    """The SQLAlchemy URL of a fresh database on the session's PostgreSQL server."""
    return pg_server.create_database()


# -- a real redis-server (the shared KV tier of a scale-out deployment) -------------------------------

REDIS_BIN = shutil.which("redis-server") or ("/usr/bin/redis-server" if os.path.exists("/usr/bin/redis-server")
                                              else None)


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    if REDIS_BIN is None:
        pytest.skip("redis-server binary not found (Debian package redis-server; the Makefile installs it)")
    port = _free_port()
    proc = subprocess.Popen([REDIS_BIN, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(tmp_path), "--loglevel", "warning"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    break
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("redis-server did not start")
        time.sleep(0.05)
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.kill()
        proc.wait(10)
