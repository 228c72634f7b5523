"""/v1's `usage` and `blendrag` fields from a DoneEvent: every field the OpenAI body does not carry itself,
derived from the dataclass (a field added to DoneEvent reaches /v1 without a hand-kept list), and blendrag's
own finish reason, which OpenAI's finish_reason cannot say."""

from __future__ import annotations

import dataclasses

from app.api.ask import done_payload
from app.api.openai_compat import _extras, _usage, finish_reason
from app.services.ask import DoneEvent
from app.services.ask.types import Timings, Usage
from app.services.attribution import Citation, UnsupportedIdentifier
from engine.types import RepeatedLine

DONE = DoneEvent(
    answer="Quintaro.",
    mode="blend",
    selector="query",
    recompute_ratio=0.15,
    finish_reason="stop",
    usage=Usage(
        prompt_tokens=120,
        completion_tokens=3,
        context_tokens=90,
        recomputed_tokens=14,
        history_tokens=20,
        history_reused_tokens=18,
    ),
    timings=Timings(
        retrieval_ms=1.5,
        kv_load_ms=2.0,
        ttft_ms=30.0,
        total_ms=41.0,
        full_prefill_estimate_ms=None,
        decode_tokens_per_s=181.82,  # 2 tokens after the first in 11 ms
    ),
    kv_hits=2,
    kv_misses=1,
    notice=None,
    citations=[Citation(0, 9, 1, 0.5)],
    unsupported_identifiers=[UnsupportedIdentifier(0, 8, "Quintaro")],
    conversation_id="c-1",
    history_turns=1,
    history_dropped_turns=0,
    retrieval_query="And its capital? Zorblat",
)


def test_usage_is_openais_with_the_history_counts() -> None:
    assert _usage(DONE) == {
        "prompt_tokens": 120,
        "completion_tokens": 3,
        "total_tokens": 123,
        "history_tokens": 20,
        "history_reused_tokens": 18,
    }


def test_the_blendrag_field_carries_every_other_done_field() -> None:
    assert _extras(DONE) == {
        "mode": "blend",
        "selector": "query",
        "recompute_ratio": 0.15,
        "kv_hits": 2,
        "kv_misses": 1,
        "timings": {
            "retrieval_ms": 1.5,
            "kv_load_ms": 2.0,
            "ttft_ms": 30.0,
            "total_ms": 41.0,
            "full_prefill_estimate_ms": None,
            "decode_tokens_per_s": 181.82,
        },
        "context_tokens": 90,
        "recomputed_tokens": 14,
        "history_tokens": 20,
        "history_reused_tokens": 18,
        "history_turns": 1,
        "history_dropped_turns": 0,
        "retrieval_query": "And its capital? Zorblat",
        "conversation_id": "c-1",
        "notice": None,
        "unsupported_identifiers": [{"start": 0, "end": 8, "identifier": "Quintaro"}],
        "finish_reason": "stop",
        "repeated_line": None,
    }


def test_a_repetition_stop_is_stop_to_openai_and_repetition_with_its_withheld_line_in_the_extension() -> None:
    answer = "Quintaro is the capital. Its rivers are purple."
    done = dataclasses.replace(
        DONE,
        answer=answer,
        finish_reason="repetition",
        repeated_line=RepeatedLine("Quintaro is the capital.", 0),
        citations=[],
        unsupported_identifiers=[],
    )
    assert finish_reason(done.finish_reason) == "stop"
    extras = _extras(done)
    assert (extras["finish_reason"], extras["repeated_line"]) == (
        "repetition",
        {"text": "Quintaro is the capital.", "earlier_start": 0},
    )
    # /ask's done event carries the same, validated by its schema.
    payload = done_payload(done)
    assert (payload["finish_reason"], payload["repeated_line"]) == (
        "repetition",
        {"text": "Quintaro is the capital.", "earlier_start": 0},
    )
    assert done_payload(DONE)["repeated_line"] is None
