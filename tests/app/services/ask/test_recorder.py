"""AnswerRecorder: the timings a finished answer reports, from the engine's FinishEvent."""

from __future__ import annotations

from app.services.ask.recorder import AnswerRecorder, KVCounts, decode_tokens_per_s
from app.services.estimates import FullPassRate
from engine.types import FinishEvent


def _finish(num_completion_tokens: int, ttft_s: float, total_s: float) -> FinishEvent:
    return FinishEvent(
        finish_reason="length",
        num_prompt_tokens=900,
        num_completion_tokens=num_completion_tokens,
        num_recomputed_tokens=120,
        recompute_ratio=0.15,
        ttft_s=ttft_s,
        total_s=total_s,
        mode="blend",
    )


def test_decode_rate_counts_the_tokens_after_the_first_over_the_time_after_it() -> None:
    # 65 tokens: the first at 1.5 s, the last at 9.5 s: 64 decoded in 8 s.
    assert decode_tokens_per_s(_finish(65, ttft_s=1.5, total_s=9.5)) == 8.0
    assert decode_tokens_per_s(_finish(4, ttft_s=0.5, total_s=1.4)) == 3.33  # 3 / 0.9, two decimals
    assert decode_tokens_per_s(_finish(1, ttft_s=0.5, total_s=0.5)) is None  # the first token alone
    assert decode_tokens_per_s(_finish(0, ttft_s=0.5, total_s=0.5)) is None


def test_the_timings_of_a_finished_answer() -> None:
    recorder = AnswerRecorder(None, FullPassRate())
    usage, timings = recorder.measure(
        _finish(33, ttft_s=2.0, total_s=6.0), retrieval_ms=40.0, kv=KVCounts(load_ms=10.0), num_history_tokens=0
    )
    assert (usage.prompt_tokens, usage.completion_tokens) == (900, 33)
    # TTFT and total add retrieval and KV load to the engine's times; the decode rate is the engine's alone.
    assert (timings.ttft_ms, timings.total_ms, timings.decode_tokens_per_s) == (2050.0, 6050.0, 8.0)
    assert timings.full_prefill_estimate_ms is None  # nothing learned yet
