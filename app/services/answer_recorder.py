"""AnswerRecorder: an engine finish as the `DoneEvent` a client gets, and what every answer reports
(metrics, the prefill-rate estimate)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.services.ask_types import DoneEvent, SourcesEvent, Timings, Usage
from app.services.attribution import SourceText, attribute
from app.services.estimates import PrefillRate

if TYPE_CHECKING:
    from app.metrics import Metrics
    from engine.types import FinishEvent


class AnswerRecorder:
    """Turns an engine finish into the DoneEvent and records what every answer reports (metrics, the
    prefill-rate estimate). One per AskService; AdmittedAnswer reports through it."""

    def __init__(self, metrics: Metrics | None, prefill_rate: PrefillRate) -> None:
        self._metrics = metrics
        self.prefill_rate = prefill_rate

    def count(self, mode: str, outcome: str) -> None:
        if self._metrics is not None:
            self._metrics.asks.labels(mode, outcome).inc()

    def done(
        self,
        event: FinishEvent,
        pieces: list[str],
        retrieval_ms: float,
        kv_load_ms: float,
        kv_hits: int,
        kv_misses: int,
        sources: SourcesEvent,
    ) -> DoneEvent:
        ttft_ms = retrieval_ms + kv_load_ms + event.ttft_s * 1000
        if event.mode == "full":
            self.prefill_rate.observe(event.num_prompt_tokens, event.ttft_s)
        estimate = self.prefill_rate.estimate_ms(event.num_prompt_tokens)
        if self._metrics is not None:
            self._metrics.kv_lookups.labels("hit").inc(kv_hits)
            self._metrics.kv_lookups.labels("miss").inc(kv_misses)
            self._metrics.ttft.labels(event.mode).observe(ttft_ms / 1000)
            self._metrics.total.labels(event.mode).observe(event.total_s)
            self._metrics.recompute_ratio.observe(event.recompute_ratio)
        self.count(event.mode, event.finish_reason)
        answer = event.text or "".join(pieces)
        return DoneEvent(
            answer=answer,
            mode=event.mode,
            selector=event.selector,
            recompute_ratio=round(event.recompute_ratio, 4),
            finish_reason=event.finish_reason,
            usage=Usage(
                prompt_tokens=event.num_prompt_tokens,
                completion_tokens=event.num_completion_tokens,
                context_tokens=event.num_context_tokens,
                recomputed_tokens=event.num_recomputed_tokens,
            ),
            timings=Timings(
                retrieval_ms=round(retrieval_ms, 2),
                kv_load_ms=round(kv_load_ms, 2),
                ttft_ms=round(ttft_ms, 2),
                total_ms=round(retrieval_ms + kv_load_ms + event.total_s * 1000, 2),
                full_prefill_estimate_ms=None if estimate is None else round(estimate, 1),
            ),
            kv_hits=kv_hits,
            kv_misses=kv_misses,
            notice=sources.notice,
            citations=attribute(answer, [SourceText(s.rank, s.text) for s in sources.sources]),
        )
