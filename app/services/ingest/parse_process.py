"""Parsing a file in a child process that can be killed, so that no file holds the ingest queue.

A loader that does not stop (a pathological PDF in pypdf, markup built to be slow) would hold its thread, and
a thread cannot be stopped from outside. So each file is parsed in a child process, and the thread that
parses the job only waits for its documents:

- it looks for a cancel or a shutdown (`check`) every POLL_S while it waits, and kills the child at once;
- it kills the child once `ingest.max_parse_seconds` (plus a grace for the child's own, clean stop) has
  passed: the document fails with `parse_time_limit`, and the next job starts;
- the child's address space is capped (`ingest.max_parse_memory_bytes`): a parse that needs more fails
  `document_too_large` instead of pushing the server toward an out-of-memory kill.

So one file holds its parse lane for at most `max_parse_seconds` (and fails sooner on the character cap, which
a DOCX counts while it streams); other jobs are parsed in other lanes meanwhile (lanes.py), and the index
thread takes them as they are parsed.

The child is a parse server (`python -m ingest.parse_child`, started once and kept, so a file
costs no interpreter start), reached over a pipe, one file at a time; a killed one is started again for the
next file. Each parse lane has its own (`ParseServer`); a caller that names none (`blendrag ingest`, a
PostgreSQL worker, bench) shares the module's one. It imports only the loaders, never the server's modules,
threads or torch state. With `ingest.parse_in_subprocess` off, files are parsed in the calling thread.

A child keeps the memory a big file made it grow to (Python gives little back: a 5 MB HTML page left one at
318 MB, idle), so it is replaced after a file that left it over `ingest.parse_recycle_bytes` resident, and
stopped once it has parsed nothing for `ingest.parse_idle_s`; the next file starts a fresh one either way.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from pathlib import Path

from ingest import errors
from ingest.config import IngestSettings
from ingest.errors import LoaderError, ParseTimeLimit, UnreadableDocument
from ingest.types import LoadedDocument

logger = logging.getLogger(__name__)

POLL_S = 0.1  # how often the waiting thread looks for a cancel and the clock
GRACE_S = 2.0  # past max_parse_seconds, what the child has to stop by itself (a DOCX does) before it is killed

Check = Callable[[], None]


def iter_file_documents(
    path: Path,
    settings: IngestSettings,
    check: Check | None = None,
    *,
    grace_s: float = GRACE_S,
    server: ParseServer | None = None,
) -> Iterator[LoadedDocument]:
    """`ingest.loaders.iter_documents` of one file, in a child process when `settings.parse_in_subprocess`
    (see the module docstring): `server`'s (a parse lane's own, used by its thread only), else the module's
    shared one. Raises what it raises (LoaderError subclasses), ParseTimeLimit when the child had to be
    killed (`grace_s` after the time limit), and passes through what `check` raises (the child is killed
    first)."""
    if not settings.parse_in_subprocess:
        from ingest.loaders import iter_documents

        yield from iter_documents(path, settings, check)
        return
    if server is not None:
        yield from server.parse(path, settings, check, grace_s)
        return
    with _SERVER_LOCK:  # one file at a time per server
        yield from _SERVER.parse(path, settings, check, grace_s)


class ParseServer:
    """The child process and the two pipes to it; started when first needed and after a kill, replaced after
    a file that left it large, stopped when idle (module docstring)."""

    def __init__(self) -> None:
        self._process: subprocess.Popen[bytes] | None = None
        self._requests: Connection | None = None
        self._replies: Connection | None = None
        self._memory_bytes = 0
        # The child is shared by its user's thread and the idle timer's: the timer stops it only between files.
        self._lock = threading.RLock()
        self._busy = False
        self._idle_timer: threading.Timer | None = None

    @property
    def pid(self) -> int | None:
        """The running child's process id (None: none running)."""
        with self._lock:
            process = self._process
            return process.pid if process is not None and process.poll() is None else None

    def rss_bytes(self) -> int | None:
        """The running child's resident memory (None: none running, or a system without /proc)."""
        pid = self.pid
        if pid is None:
            return None
        try:
            with open(f"/proc/{pid}/status", encoding="ascii") as status:
                for line in status:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) * 1024  # reported in kB
        except (OSError, ValueError, IndexError):
            return None
        return None

    def _ensure(self, memory_bytes: int) -> tuple[Connection, Connection]:
        alive = self._process is not None and self._process.poll() is None
        if not alive or memory_bytes != self._memory_bytes:
            self.close()
            request_read, request_write = os.pipe()
            reply_read, reply_write = os.pipe()
            self._process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "ingest.parse_child",
                    str(request_read),
                    str(reply_write),
                    str(memory_bytes),
                ],
                pass_fds=(request_read, reply_write),
                stdin=subprocess.DEVNULL,
                close_fds=True,
            )
            os.close(request_read)
            os.close(reply_write)
            self._requests, self._replies = (
                Connection(request_write, readable=False),
                Connection(reply_read, writable=False),
            )
            self._memory_bytes = memory_bytes
        assert self._requests is not None and self._replies is not None
        return self._requests, self._replies

    def close(self) -> None:
        """Kill the child (if any) and forget it: the next file starts a fresh one."""
        with self._lock:
            if self._idle_timer is not None:
                self._idle_timer.cancel()
                self._idle_timer = None
            for connection in (self._requests, self._replies):
                if connection is not None:
                    connection.close()
            self._requests = self._replies = None
            if self._process is not None:
                if self._process.poll() is None:
                    self._process.kill()
                self._process.wait(timeout=5)
                self._process = None

    def _after_file(self, settings: IngestSettings) -> None:
        """A file is parsed and the child is idle: replace it if the file left it large, else stop it once it
        has been idle for `settings.parse_idle_s`."""
        with self._lock:
            self._busy = False
            threshold = settings.parse_recycle_bytes
            rss = self.rss_bytes() if threshold is not None else None
            if threshold is not None and rss is not None and rss > threshold:
                logger.info(
                    "parse process %s holds %d MiB after a file (over ingest.parse_recycle_bytes, %d MiB): "
                    "replaced for the next file",
                    self.pid,
                    rss // 2**20,
                    threshold // 2**20,
                )
                self.close()
                return
            if settings.parse_idle_s is not None and self._process is not None:
                self._idle_timer = threading.Timer(settings.parse_idle_s, self._stop_idle)
                self._idle_timer.daemon = True
                self._idle_timer.start()

    def _stop_idle(self) -> None:
        with self._lock:
            if not self._busy and self._process is not None:
                logger.debug("parse process %s idle: stopped", self.pid)
                self.close()

    def parse(
        self, path: Path, settings: IngestSettings, check: Check | None, grace_s: float
    ) -> Iterator[LoadedDocument]:
        with self._lock:
            self._busy = True
            if self._idle_timer is not None:
                self._idle_timer.cancel()
                self._idle_timer = None
            requests, replies = self._ensure(settings.max_parse_memory_bytes)
        requests.send((str(path), settings.model_dump()))
        deadline = time.monotonic() + settings.max_parse_seconds + grace_s
        finished = False
        try:
            while True:
                if check is not None:
                    check()
                if time.monotonic() > deadline:
                    raise ParseTimeLimit.after(settings.max_parse_seconds, str(path))
                if not replies.poll(POLL_S):
                    continue
                try:
                    kind, payload = replies.recv()
                except EOFError:  # the child died without a word: killed by the system, or a crash in C code
                    code = self._process.wait(timeout=5) if self._process is not None else None
                    raise UnreadableDocument(
                        f"the parser stopped without a result (exit code {code})", str(path)
                    ) from None
                if kind == "document":
                    yield payload
                elif kind == "error":
                    finished = True
                    raise _loader_error(payload, str(path))
                else:  # "end"
                    finished = True
                    return
        finally:
            if not finished:  # cancelled, out of time, or the reader stopped early: the child may still parse
                self.close()
            self._after_file(settings)


_SERVER = ParseServer()
_SERVER_LOCK = threading.Lock()


def _loader_error(payload: dict[str, str | None], path: str) -> LoaderError:
    """The child's LoaderError rebuilt (exceptions with their own constructors do not pickle whole)."""
    cls = getattr(errors, str(payload["type"]), None)
    if not (isinstance(cls, type) and issubclass(cls, LoaderError)):
        cls = UnreadableDocument
    return cls(str(payload["message"]), payload["path"] or path)
