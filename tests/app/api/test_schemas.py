"""Request bodies: one definition of modes, filters and limits, shared by /ask, /v1 and the CLI."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.api.openai_compat import ChatCompletionIn
from app.api.schemas import AskIn
from engine.types import MODES
from retrieval.types import SearchFilters


@pytest.mark.parametrize(
    ("fields", "where", "message"),
    [
        ({"question": "  "}, "question", "question must not be empty"),
        ({"mode": "turbo"}, "mode", "Input should be 'blend', 'full', 'prefix' or 'reuse'"),
        ({"recompute_ratio": 1.5}, "recompute_ratio", "less than or equal to 1"),
        ({"top_k": 0}, "top_k", "greater than or equal to 1"),
        ({"top_k": 65}, "top_k", "less than or equal to 64"),
        ({"max_tokens": 4097}, "max_tokens", "less than or equal to 4096"),
        ({"temperature": -0.1}, "temperature", "greater than or equal to 0"),
        ({"top_p": 0.0}, "top_p", "greater than 0"),
    ],
)
def test_ask_and_chat_bodies_reject_the_same_values(fields: dict, where: str, message: str) -> None:
    with pytest.raises(ValidationError) as info:
        AskIn(**({"question": "q"} | fields))
    [error] = info.value.errors()
    assert error["loc"] == (where,) and message in error["msg"]
    if where != "question":  # the chat body takes its question from the messages
        with pytest.raises(ValidationError) as chat_info:
            ChatCompletionIn(messages=[{"role": "user", "content": "q"}], **fields)
        [chat_error] = chat_info.value.errors()
        assert chat_error["loc"] == (where,) and chat_error["msg"] == error["msg"]


def test_modes_come_from_the_engine() -> None:
    for mode in MODES:
        assert AskIn(question="q", mode=mode).mode == mode


def test_both_bodies_build_the_same_service_request() -> None:
    params = {
        "top_k": 3,
        "mode": "reuse",
        "recompute_ratio": 0.5,
        "temperature": 0.7,
        "top_p": 0.9,
        "seed": 4,
        "filters": {"document_ids": ["d1"], "tags": ["t"]},
    }
    ask = AskIn(question="Why?", max_tokens=12, **params).to_request("Why?")
    chat = ChatCompletionIn(
        messages=[{"role": "user", "content": "Why?"}], max_completion_tokens=12, **params
    ).to_request("Why?", max_tokens=12)
    assert ask == chat
    assert ask.filters == SearchFilters(document_ids=frozenset({"d1"}), tags=frozenset({"t"}))
    assert (ask.top_k, ask.mode, ask.recompute_ratio, ask.max_tokens, ask.seed) == (3, "reuse", 0.5, 12, 4)
