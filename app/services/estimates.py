"""How long a full pass over N tokens (full mode: nothing reused) would take here, learned from the full
passes this process really ran.

The rate is kept in the data dir (`prefill_rate.json`, for the model it was measured with; the file keeps
the name data dirs already have), so the first answer after a restart already carries a
`full_prefill_estimate_ms` instead of null. A server that starts with no rate for its model (a new data dir,
another model) measures one at once (`RateProbe`: a short chunk precompute on the engine's worker, after
start-up is done and behind any question), so even the first ingest is announced with a time estimate.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fsio.atomic import write_text_atomic

if TYPE_CHECKING:
    from engine.scheduler import Scheduler

logger = logging.getLogger(__name__)

SAVE_INTERVAL_S = 5.0  # an ingest observes a rate per chunk: write the file at most this often
# The probe's chunk: long enough to be timed (a few hundred ms on a CPU for the default model), short enough to
# hold the engine's worker about a second; ingest's chunks are up to twice as long.
PROBE_TOKENS = 256
PROBE_TEXT = (
    "The parser reads every file and the chunker cuts its text into passages of a few hundred tokens. "
    "The model then computes the keys and values of each passage once, so that a question reuses them. "
)


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


def probe_ids(tokenizer: Any, num_tokens: int = PROBE_TOKENS) -> list[int]:
    """`num_tokens` token ids of plain prose (PROBE_TEXT repeated): what an ingested passage looks like."""
    unit = list(tokenizer.encode(PROBE_TEXT, add_special_tokens=False))
    return (unit * (num_tokens // len(unit) + 1))[:num_tokens]


class RateProbe:
    """Measures the full-pass rate once, in a thread of its own, when `rate` knows none: a chunk precompute on
    the scheduler's worker at ingest priority (a question goes first), run twice so that the first run pays
    what a process's first pass pays (the prompt prefix's KV, allocations, kernel selection) and the second
    is timed. It feeds `rate` as ingest's chunk precompute does (`FullPassRate.observe`) and saves it."""

    def __init__(self, rate: FullPassRate, scheduler: Scheduler, tokenizer: Any) -> None:
        self._rate = rate
        self._scheduler = scheduler
        self._tokenizer = tokenizer
        self._thread = threading.Thread(target=self._run, name="blendrag-rate-probe", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout_s: float) -> None:
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        from engine.scheduler import PrecomputePriority, SchedulerStopped

        ids = probe_ids(self._tokenizer)
        try:
            self._scheduler.precompute_chunks([ids], priority=PrecomputePriority.INGEST)
            if self._rate.tokens_per_s is not None:  # an ingest taught it meanwhile
                return
            self._scheduler.precompute_chunks([ids], priority=PrecomputePriority.INGEST, on_unit=self._rate.observe)
        except SchedulerStopped:  # the server stopped first: the next start measures
            return
        except Exception:  # the estimate is advice: nothing else depends on it
            logger.exception("could not measure the prefill rate at start-up")
            return
        self._rate.save()
        logger.info("prefill rate measured at start-up: %.0f tokens/s", self._rate.tokens_per_s or 0.0)
