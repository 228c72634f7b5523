"""Give memory back to the system after load: the process's RSS is bounded by settings, not by its peak.

What a server holds, and what bounds it:

- model weights, the embedder, PyTorch's runtime: fixed at start-up;
- the KV memory tier: `kvcache.memory_bytes` (an LRU; it stays full once filled, by design);
- the in-memory index: the corpus (≈ 1.6 KB per chunk);
- each running request's working KV cache (the blended context, ≈ 45 KiB per token for SmolLM2 in
  float32) and its activations: `engine.max_running` requests decode at once, `engine.max_queue` wait.

The last item should go when a request ends, but two things kept it after a burst of clients:

- reference cycles: a finished request's objects (its KV layers as loaded from the store, in float16)
  stay reachable from cycles until Python's cyclic collector runs, and an idle server allocates nothing
  that would trigger it; measured after 12 concurrent asks on SmolLM2, ~580 MiB of KV tensors were
  garbage that only `gc.collect()` freed;
- glibc's allocator: freed heap memory stays in the process (its mmap threshold grows with every large
  block freed, up to 32 MiB, so later tensors come from the heap, which is returned to the system only
  from its top).

So `server.memory_trim_idle_s` runs a full garbage collection and then `malloc_trim` once the engine has
been idle that long after work, and `server.malloc_mmap_threshold_bytes` fixes the mmap threshold, so
large tensors are mapped and unmapped on their own. The allocator parts are no-ops where the C library
is not glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import os
import threading
import time
from collections.abc import Callable

from app.background import BackgroundThread

logger = logging.getLogger(__name__)

_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter numbers (malloc.h)
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None


def glibc_available() -> bool:
    """Whether the allocator controls here (glibc mallopt / malloc_trim) do anything."""
    return _libc() is not None


def rss_bytes() -> int | None:
    """Resident set size of this process (Linux), or None where /proc is not there."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * _PAGE_BYTES
    except (OSError, ValueError, IndexError):
        return None


def set_mmap_threshold(num_bytes: int) -> bool:
    """Serve allocations of at least `num_bytes` with their own mapping (returned to the system when freed)."""
    libc = _libc()
    if libc is None:
        return False
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, ctypes.c_int(num_bytes)))


def trim() -> bool:
    """Return free heap memory to the system (glibc `malloc_trim(0)`). True if any was released."""
    libc = _libc()
    return bool(libc.malloc_trim(ctypes.c_size_t(0))) if libc is not None else False


class IdleTrimmer:
    """A thread that trims the heap once the engine has been idle `idle_s` seconds after some work."""

    def __init__(
        self,
        is_busy: Callable[[], bool],
        idle_s: float,
        *,
        poll_s: float = 0.5,
        on_rss: Callable[[int], None] | None = None,
    ) -> None:
        self._is_busy = is_busy
        self._idle_s = idle_s
        self._poll_s = poll_s
        self._on_rss = on_rss
        self._loop = BackgroundThread(self._run, "memory-trim", join_timeout_s=5)
        self._trimmed = threading.Condition()
        self.num_trims = 0

    def start(self) -> None:
        self._loop.start()

    def wait_for_trims(self, num_trims: int, timeout_s: float) -> bool:
        """Block until at least `num_trims` trims have run (True), or `timeout_s` passed (False)."""
        with self._trimmed:
            return self._trimmed.wait_for(lambda: self.num_trims >= num_trims, timeout=timeout_s)

    def stop(self) -> None:
        self._loop.stop()

    def _run(self) -> None:
        worked_since_trim = False
        last_busy = time.monotonic()
        while not self._loop.stopping.wait(self._poll_s):
            now = time.monotonic()
            if self._is_busy():
                worked_since_trim, last_busy = True, now
            elif worked_since_trim and now - last_busy >= self._idle_s:
                before = rss_bytes()
                num_collected = gc.collect()  # cycles holding finished requests' tensors
                trim()
                with self._trimmed:
                    self.num_trims += 1
                    self._trimmed.notify_all()
                worked_since_trim = False
                after = rss_bytes()
                if before is not None and after is not None:
                    logger.info(
                        "idle: %d unreachable objects collected and the heap trimmed, RSS %.0f → %.0f MiB",
                        num_collected,
                        before / 2**20,
                        after / 2**20,
                    )
            if self._on_rss is not None:
                rss = rss_bytes()
                if rss is not None:
                    self._on_rss(rss)
