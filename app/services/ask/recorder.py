"""AnswerRecorder: what every answer reports (metrics, the full-pass rate estimate), and an engine finish
measured as the `Usage` and `Timings` its `DoneEvent` carries."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from app.services.ask.types import Timings, Usage
from app.services.estimates import FullPassRate

if TYPE_CHECKING:
    from app.metrics import Metrics
    from engine.types import FinishEvent


@dataclass(frozen=True)
class KVCounts:
    """What opening a prompt's KV cost and found (summed over a re-open after a corrupt entry)."""

    load_ms: float = 0.0
    num_hits: int = 0
    num_misses: int = 0
    num_history_reused_tokens: int = 0  # earlier turns' tokens served from the store


class AnswerRecorder:
    """Counts answers by outcome and measures finished ones. One per AskService; the answers report through it."""

    def __init__(self, metrics: Metrics | None, full_pass_rate: FullPassRate) -> None:
        self._metrics = metrics
        self.full_pass_rate = full_pass_rate

    def count(self, mode: str, outcome: str) -> None:
        if self._metrics is not None:
            self._metrics.asks.labels(mode, outcome).inc()

    def measure(
        self, event: FinishEvent, retrieval_ms: float, kv: KVCounts, num_history_tokens: int
    ) -> tuple[Usage, Timings]:
        """The usage and timings of a finished answer; its metrics (and, in mode full, the full-pass rate)
        recorded."""
        ttft_ms = retrieval_ms + kv.load_ms + event.ttft_s * 1000
        if event.mode == "full":
            self.full_pass_rate.observe(event.num_prompt_tokens, event.ttft_s)
        estimate = self.full_pass_rate.estimate_ms(event.num_prompt_tokens)
        if self._metrics is not None:
            self._metrics.kv_lookups.labels("hit").inc(kv.num_hits)
            self._metrics.kv_lookups.labels("miss").inc(kv.num_misses)
            self._metrics.ttft.labels(event.mode).observe(ttft_ms / 1000)
            self._metrics.total.labels(event.mode).observe(event.total_s)
            self._metrics.recompute_ratio.observe(event.recompute_ratio)
            self._metrics.history_tokens.inc(num_history_tokens)
            self._metrics.history_reused_tokens.inc(kv.num_history_reused_tokens)
        self.count(event.mode, event.finish_reason)
        usage = Usage(
            prompt_tokens=event.num_prompt_tokens,
            completion_tokens=event.num_completion_tokens,
            context_tokens=event.num_context_tokens,
            recomputed_tokens=event.num_recomputed_tokens,
            history_tokens=num_history_tokens,
            history_reused_tokens=kv.num_history_reused_tokens,
        )
        timings = Timings(
            retrieval_ms=round(retrieval_ms, 2),
            kv_load_ms=round(kv.load_ms, 2),
            ttft_ms=round(ttft_ms, 2),
            total_ms=round(retrieval_ms + kv.load_ms + event.total_s * 1000, 2),
            full_prefill_estimate_ms=None if estimate is None else round(estimate, 1),
            decode_tokens_per_s=decode_tokens_per_s(event),
        )
        return usage, timings


def decode_tokens_per_s(event: FinishEvent) -> float | None:
    """The answer's decode rate: the tokens after the first ÷ the time from the first token to the end (the
    engine's clock: total - TTFT, both from the request's arrival at the scheduler). None when nothing was
    decoded after the first token."""
    decode_s = event.total_s - event.ttft_s
    if event.num_completion_tokens < 2 or decode_s <= 0:
        return None
    return round((event.num_completion_tokens - 1) / decode_s, 2)
