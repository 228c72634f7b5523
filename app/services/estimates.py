"""How long a full pass over N tokens (full mode: nothing reused) would take here, learned from the full
passes this process really ran.

The rate is kept in the data dir (`prefill_rate.json`, for the model it was measured with; the file keeps
the name data dirs already have), so the first answer after a restart already carries a
`full_prefill_estimate_ms` instead of null.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path

from fsio.atomic import write_text_atomic

logger = logging.getLogger(__name__)

SAVE_INTERVAL_S = 5.0  # an ingest observes a rate per chunk: write the file at most this often


class FullPassRate:
    """Exponential moving average of full-pass throughput (tokens/s), fed by full-mode answers and by
    ingest's chunk precompute (both compute every token, nothing reused). A full pass costs a little more
    than linearly in its length on CPU, so the estimate is a slight under-estimate for long prompts: it
    flatters full mode, never blending."""

    def __init__(self, alpha: float = 0.2) -> None:
        self._alpha = alpha
        self._tokens_per_s: float | None = None
        self._lock = threading.Lock()
        self._path: Path | None = None
        self._key = ""
        self._last_save = float("-inf")

    def attach(self, path: Path, key: str) -> None:
        """Keep the rate in `path` from now on, for the model named by `key` (its fingerprint); a rate
        stored there for the same key is the starting estimate. A file for another model, or one that
        cannot be read, is ignored (the estimate starts empty, as without a file)."""
        with self._lock:
            self._path, self._key = path, key
            try:
                stored = json.loads(path.read_text(encoding="utf-8"))
                rate = float(stored["tokens_per_s"]) if stored.get("model") == key else None
            except FileNotFoundError:
                rate = None
            except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
                logger.warning("ignoring unreadable prefill estimate %s: %s", path, exc)
                rate = None
            if rate is not None and rate > 0 and self._tokens_per_s is None:
                self._tokens_per_s = rate

    def observe(self, num_tokens: int, seconds: float) -> None:
        if num_tokens <= 0 or seconds <= 0:
            return
        rate = num_tokens / seconds
        with self._lock:
            prev = self._tokens_per_s
            self._tokens_per_s = rate if prev is None else (1 - self._alpha) * prev + self._alpha * rate
        if time.monotonic() - self._last_save >= SAVE_INTERVAL_S:
            self.save()

    def save(self) -> None:
        """Write the current rate to the attached file (if any). A failed write (full disk) only logs:
        the estimate is a convenience, never a reason for an answer or an ingest to fail."""
        with self._lock:
            path, rate = self._path, self._tokens_per_s
            self._last_save = time.monotonic()
        if path is None or rate is None:
            return
        body = json.dumps({"model": self._key, "tokens_per_s": rate})
        try:
            write_text_atomic(path, body, fsync=False)
        except OSError as exc:
            logger.warning("could not save the prefill estimate to %s: %s", path, exc)

    @property
    def tokens_per_s(self) -> float | None:
        return self._tokens_per_s

    def estimate_ms(self, num_tokens: int) -> float | None:
        rate = self._tokens_per_s
        return None if rate is None else num_tokens / rate * 1000
