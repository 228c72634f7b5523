"""Parsing lanes: where a queued job is parsed, so that no slow file holds the small jobs behind it.

Parsing a file is the one step of a job whose time the server cannot bound by its size: a pathological PDF
runs to `ingest.max_parse_seconds` (30 s), and when parses ran one after another inside the one ingest
thread, three such files held a one-paragraph JSON ingest posted after them for 95 s. So a job is parsed in a
lane before it takes its turn on the index thread (chunk, embed, KV, commit: one job at a time, in the order
their parses finish; worker.py):

- inline: a job without files (JSON documents; only duplicates) needs no parse child: its text is only
  normalized, and its tokens were counted at submit. It goes straight to the index thread.
- quick: a job whose files are small (`ingest.quick_parse_bytes` together) has a parse child of its own, so
  small uploads never wait for a large file's parse.
- files: every other job is parsed by one of `ingest.parse_workers` parse children at once (none set: half
  the cores, at most MAX_DEFAULT_WORKERS, and no more children than a quarter of the machine's memory holds at
  `ingest.max_parse_memory_bytes` each).

Every lane's child keeps the limits of parse_process.py (time limit, address-space cap, killed on a cancel or
a shutdown). A lane thread that finds the worker stopping leaves its jobs queued: the next start's recovery
runs them.
"""

from __future__ import annotations

import enum
import logging
import os
import queue
import stat
import threading
from collections.abc import Callable, Sequence

from app.services.ingest.parse_process import ParseServer
from app.services.ingest.types import IngestSource
from ingest.config import IngestSettings

logger = logging.getLogger(__name__)

MAX_DEFAULT_WORKERS = 4  # parse children of the files lane when ingest.parse_workers is not set
MEMORY_SHARE = 4  # ... and the lane's children may together address at most 1/MEMORY_SHARE of the memory

RunParse = Callable[[str, ParseServer], None]


class Lane(enum.StrEnum):
    INLINE = "inline"
    QUICK = "quick"
    FILES = "files"


def lane_of(sources: Sequence[IngestSource], quick_bytes: int) -> Lane:
    """The lane a job of these sources is parsed in (see the module docstring)."""
    files = [s for s in sources if s.kind == "file"]
    if not files:
        return Lane.INLINE
    total = 0
    for source in files:
        try:
            info = os.stat(source.path or "")
        except OSError:  # missing: its parse fails at once
            continue
        if not stat.S_ISREG(info.st_mode):  # a pipe or a device: its size says nothing about its parse
            return Lane.FILES
        total += info.st_size
    return Lane.QUICK if quick_bytes > 0 and total <= quick_bytes else Lane.FILES


def num_parse_workers(settings: IngestSettings) -> int:
    """The parse children of the files lane: `settings.parse_workers`, else from the cores and the memory."""
    if settings.parse_workers is not None:
        return settings.parse_workers
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):  # not reported: the cores decide
        memory = MEMORY_SHARE * MAX_DEFAULT_WORKERS * settings.max_parse_memory_bytes
    by_memory = memory // (MEMORY_SHARE * settings.max_parse_memory_bytes)
    return max(1, min(cores // 2, by_memory, MAX_DEFAULT_WORKERS))


class ParseLanes:
    """The quick and files lanes: a queue each and their threads, each thread with a parse server (child
    process) of its own. `run(job_id, server)` parses one job and hands it on; it must not raise."""

    def __init__(self, run: RunParse, num_workers: int, quick: bool) -> None:
        self._run = run
        self._sizes = {Lane.FILES: num_workers, Lane.QUICK: 1 if quick else 0}
        self._queues: dict[Lane, queue.Queue[str | None]] = {lane: queue.Queue() for lane in self._sizes}
        self._threads: list[threading.Thread] = []

    @property
    def sizes(self) -> dict[Lane, int]:
        """Threads (and parse children) per lane."""
        return dict(self._sizes)

    def put(self, lane: Lane, job_id: str) -> None:
        if lane == Lane.QUICK and not self._sizes[Lane.QUICK]:
            lane = Lane.FILES
        if lane == Lane.INLINE:
            raise ValueError("an inline job is not parsed in a lane")
        self._queues[lane].put(job_id)

    def start(self) -> None:
        if self._threads:
            return
        for lane, size in self._sizes.items():
            for n in range(size):
                thread = threading.Thread(
                    target=self._serve, args=(lane,), name=f"ingest-parse-{lane}-{n}", daemon=True
                )
                thread.start()
                self._threads.append(thread)

    def stop(self, timeout_s: float) -> None:
        """Let each thread finish its job (a stopping worker makes that quick) and end; their children go."""
        for lane, size in self._sizes.items():
            for _ in range(size):
                self._queues[lane].put(None)
        for thread in self._threads:
            thread.join(timeout=timeout_s)
        self._threads = []

    def _serve(self, lane: Lane) -> None:
        server = ParseServer()
        try:
            while (job_id := self._queues[lane].get()) is not None:
                self._run(job_id, server)
        finally:
            server.close()
