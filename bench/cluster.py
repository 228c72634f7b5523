"""A scale-out blendrag on one machine, as real processes on 127.0.0.1: PostgreSQL, Redis, `blendrag serve`
replicas and `blendrag worker`s. Used by the cluster test and by `python -m bench scaleout`.

PostgreSQL comes from Debian's `postgresql` package (initdb in a temp dir; run as the `postgres` user
when we are root, since PostgreSQL refuses root) and Redis from `redis-server`. The tests use the same
`PostgresServer` (tests/pgserver.py).
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
PG_BIN = next(
    (
        d
        for d in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
        if os.path.exists(os.path.join(d, "initdb"))
    ),
    None,
)
REDIS_BIN = shutil.which("redis-server") or (
    "/usr/bin/redis-server" if os.path.exists("/usr/bin/redis-server") else None
)
PG_RUN_AS = "postgres"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(
    predicate: Any, timeout: float, what: str, proc: subprocess.Popen[bytes] | None = None, log: Path | None = None
) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc is not None and proc.poll() is not None:
            tail = log.read_text(errors="replace")[-3000:] if log is not None and log.exists() else ""
            raise RuntimeError(f"{what}: process exited with {proc.returncode}\n{tail}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout} s")
        time.sleep(0.1)


RUNUSER = shutil.which("runuser") or ("/usr/sbin/runuser" if os.path.exists("/usr/sbin/runuser") else None)


def postgres_unavailable() -> str | None:
    """Why a PostgreSQL server cannot be started here, or None."""
    if PG_BIN is None:
        return "PostgreSQL server binaries not found (Debian package postgresql)"
    if os.geteuid() == 0 and RUNUSER is None:
        return "running as root without runuser: cannot start PostgreSQL as a non-root user"
    return None


@dataclass
class PostgresServer:
    """initdb + postgres on 127.0.0.1 in `root` (a directory the `postgres` user can reach when we are root)."""

    root: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    user: str = "blendrag"

    def _as_pg_user(self, cmd: list[str]) -> list[str]:
        return [RUNUSER or "runuser", "-u", PG_RUN_AS, "--", *cmd] if os.geteuid() == 0 else cmd

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://{self.user}@127.0.0.1:{self.port}/{database}"

    def start(self) -> None:
        reason = postgres_unavailable()
        if reason:
            raise RuntimeError(reason)
        self.root.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.root, PG_RUN_AS, PG_RUN_AS)
        data = self.root / "pgdata"
        subprocess.run(
            self._as_pg_user(
                [f"{PG_BIN}/initdb", "-D", str(data), "-U", self.user, "--auth=trust", "-E", "UTF8", "--no-sync"]
            ),
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        log = self.root / "postgres.log"
        # fsync off: nothing here must survive a power cut, and it keeps a 2-core machine responsive.
        self.proc = subprocess.Popen(
            self._as_pg_user(
                [
                    f"{PG_BIN}/postgres",
                    "-D",
                    str(data),
                    "-h",
                    "127.0.0.1",
                    "-p",
                    str(self.port),
                    "-k",
                    str(self.root),
                    "-c",
                    "fsync=off",
                    "-c",
                    "synchronous_commit=off",
                    "-c",
                    "full_page_writes=off",
                    "-c",
                    "max_connections=200",
                ]
            ),
            stdout=subprocess.DEVNULL,
            stderr=log.open("wb"),
        )
        _wait(
            lambda: (
                subprocess.run(
                    [f"{PG_BIN}/pg_isready", "-h", "127.0.0.1", "-p", str(self.port), "-q"], check=False
                ).returncode
                == 0
            ),
            30,
            "postgres",
            self.proc,
            log,
        )

    def create_database(self, name: str | None = None) -> str:
        """A fresh, empty database; returns its SQLAlchemy URL."""
        import psycopg

        name = name or f"blendrag_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(
            host="127.0.0.1", port=self.port, user=self.user, dbname="postgres", autocommit=True
        ) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM is PostgreSQL's "fast" shutdown
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None


def start_redis(root: Path) -> tuple[subprocess.Popen[bytes], str]:
    if REDIS_BIN is None:
        raise RuntimeError("redis-server not found: apt-get install redis-server")
    port = free_port()
    proc = subprocess.Popen(
        [REDIS_BIN, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(root)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def pong() -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    _wait(pong, 10, "redis", proc)
    return proc, f"redis://127.0.0.1:{port}/0"


@dataclass
class Process:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    port: int | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


@dataclass
class Cluster:
    """PostgreSQL + Redis + replicas + workers; `env` holds the settings every blendrag process shares."""

    root: Path
    env: dict[str, str] = field(default_factory=dict)
    services: list[subprocess.Popen[bytes]] = field(default_factory=list)
    replicas: list[Process] = field(default_factory=list)
    workers: list[Process] = field(default_factory=list)
    postgres: PostgresServer | None = None

    @classmethod
    def start(cls, root: Path, *, settings_env: dict[str, str] | None = None) -> Cluster:
        cluster = cls(root=root)
        try:
            # Not under `root`: PostgreSQL runs as another user, who must be able to reach its directory.
            cluster.postgres = PostgresServer(Path(tempfile.mkdtemp(prefix="blendrag-pg-")))
            cluster.postgres.start()
            catalog_url = cluster.postgres.create_database()
            redis, redis_url = start_redis(root)
            cluster.services.append(redis)
            cluster.env = {
                **os.environ,
                "PYTHONPATH": str(REPO),
                "HF_HUB_OFFLINE": "1",
                "TRANSFORMERS_OFFLINE": "1",
                "TOKENIZERS_PARALLELISM": "false",
                "BLENDRAG_CATALOG__URL": catalog_url,
                "BLENDRAG_KVCACHE__REDIS_URL": redis_url,
                **(settings_env or {}),
            }
            # Migrate once up front, as docker/compose.yaml's `migrate` service does.
            migrated = cluster.run("db", "upgrade")
            if migrated.returncode != 0:
                raise RuntimeError(f"blendrag db upgrade failed: {migrated.stderr}")
        except BaseException:
            cluster.stop()
            raise
        return cluster

    @property
    def catalog_url(self) -> str:
        return self.env["BLENDRAG_CATALOG__URL"]

    def blendrag(self, *args: str, log: Path) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "app.cli", *args],
            cwd=REPO,
            env=self.env,
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
        )

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "app.cli", *args],
            cwd=REPO,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )

    def add_replica(self, wait: bool = True) -> Process:
        name = f"replica-{len(self.replicas) + 1}"
        port = free_port()
        log = self.root / f"{name}.log"
        process = Process(
            name,
            self.blendrag(
                "serve", "--host", "127.0.0.1", "--port", str(port), "--data-dir", str(self.root / name), log=log
            ),
            log,
            port,
        )
        self.replicas.append(process)
        if wait:
            self.wait_ready(process)
        return process

    def wait_ready(self, replica: Process, timeout: float = 900) -> None:
        def ready() -> bool:
            try:
                return httpx.get(f"{replica.url}/ready", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        _wait(ready, timeout, f"{replica.name} ready", replica.proc, replica.log)

    def add_worker(self) -> Process:
        name = f"worker-{len(self.workers) + 1}"
        log = self.root / f"{name}.log"
        process = Process(name, self.blendrag("worker", "--data-dir", str(self.root / name), log=log), log)
        self.workers.append(process)
        return process

    def stop(self) -> None:
        for p in [*self.workers, *self.replicas]:
            p.stop(signal.SIGTERM, timeout=30)
        for proc in reversed(self.services):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)
        if self.postgres is not None:
            self.postgres.stop()
            shutil.rmtree(self.postgres.root, ignore_errors=True)


def ingest(replica: Process, documents: list[dict[str, Any]]) -> dict[str, Any]:
    response = httpx.post(f"{replica.url}/ingest", json={"documents": documents}, timeout=60)
    response.raise_for_status()
    return response.json()


def job(replica: Process, job_id: str) -> dict[str, Any]:
    response = httpx.get(f"{replica.url}/ingest/jobs/{job_id}", timeout=30)
    response.raise_for_status()
    return response.json()


def wait_job(replica: Process, job_id: str, timeout: float = 600) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        got = job(replica, job_id)
        if got["status"] in ("succeeded", "failed", "cancelled"):
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {job_id} still {got['status']} after {timeout} s")
        time.sleep(0.1)


def sse_events(response: httpx.Response) -> Iterator[tuple[str, Any]]:
    from app.sse_reader import iter_sse, sse_lines

    # Not iter_lines: it also splits at U+2028, which a quoted passage may hold.
    for message in iter_sse(sse_lines(response.iter_text())):
        yield message.event or "message", message.data


def ask(replica: Process, question: str, **options: Any) -> dict[str, Any]:
    """POST /ask as a stream; returns {"sources": [...], "done": {...}} (or "error")."""
    result: dict[str, Any] = {}
    with httpx.stream("POST", f"{replica.url}/ask", json={"question": question, **options}, timeout=300) as r:
        r.raise_for_status()
        for name, data in sse_events(r):
            if name == "sources":
                result["sources"] = data["sources"]
            elif name in ("done", "error"):
                result[name] = data
    return result
