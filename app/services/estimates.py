"""How long a plain prefill of N tokens would take here, learned from prefills this process really ran."""

from __future__ import annotations

import threading


class PrefillRate:
    """Exponential moving average of prefill throughput (tokens/s), fed by full-mode answers and by
    ingest's chunk precompute (both are plain prefills). Prefill cost grows a little faster than linearly
    with length on CPU, so the estimate is a slight under-estimate for long prompts: it flatters full
    prefill, never blending."""

    def __init__(self, alpha: float = 0.2) -> None:
        self._alpha = alpha
        self._tokens_per_s: float | None = None
        self._lock = threading.Lock()

    def observe(self, num_tokens: int, seconds: float) -> None:
        if num_tokens <= 0 or seconds <= 0:
            return
        rate = num_tokens / seconds
        with self._lock:
            prev = self._tokens_per_s
            self._tokens_per_s = rate if prev is None else (1 - self._alpha) * prev + self._alpha * rate

    @property
    def tokens_per_s(self) -> float | None:
        return self._tokens_per_s

    def estimate_ms(self, num_tokens: int) -> float | None:
        rate = self._tokens_per_s
        return None if rate is None else num_tokens / rate * 1000
