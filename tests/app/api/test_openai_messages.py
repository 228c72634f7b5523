"""How /v1/chat/completions reads a `messages` array: question, history, client system prompt."""

from __future__ import annotations

import pytest
from fastapi import HTTPException

from app.api.openai_compat import ChatCompletionIn, read_messages
from engine.prompt import Turn


def _read(messages: list[dict]) -> object:
    return read_messages(ChatCompletionIn.model_validate({"messages": messages}).messages)


def test_pairs_become_turns_and_the_last_user_message_is_the_question() -> None:
    chat = _read(
        [
            {"role": "system", "content": "Start every answer with Arr!"},
            {"role": "user", "content": "How do I set a timeout in httpx?"},
            {"role": "assistant", "content": " Pass timeout=10. "},
            {"role": "user", "content": [{"type": "text", "text": "And for the connect phase only?"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "Use Timeout(connect=2)."}]},
            {"role": "user", "content": "Show that with an AsyncClient."},
        ]
    )
    assert chat.question == "Show that with an AsyncClient."
    assert chat.history == (
        Turn("How do I set a timeout in httpx?", "Pass timeout=10."),
        Turn("And for the connect phase only?", "Use Timeout(connect=2)."),
    )
    assert chat.system_prompt == "Start every answer with Arr!"


def test_irregular_arrays() -> None:
    chat = _read(
        [
            {"role": "developer", "content": "Be terse."},
            {"role": "assistant", "content": "Hello! Ask me anything."},  # greeting before any question: dropped
            {"role": "user", "content": "first"},
            {"role": "user", "content": "second"},
            {"role": "assistant", "content": None, "tool_calls": []},
            {"role": "tool", "content": "42", "tool_call_id": "x"},
            {"role": "assistant", "content": "one"},
            {"role": "assistant", "content": "two"},
            {"role": "system", "content": "Cite sources."},
            {"role": "user", "content": "third"},
            {"role": "user", "content": "fourth"},
            {"role": "assistant", "content": "a prefill after the question is not read"},
        ]
    )
    assert chat.history == (Turn("first\nsecond", "one\ntwo"),)
    assert chat.question == "third\nfourth"
    assert chat.system_prompt == "Be terse.\n\nCite sources."
    assert _read([{"role": "user", "content": "q"}]).system_prompt is None
    # An empty answer is still an answer (the model said nothing), as /ask records it.
    empty = _read(
        [{"role": "user", "content": "a"}, {"role": "assistant", "content": " "}, {"role": "user", "content": "b"}]
    )
    assert (empty.history, empty.question) == ((Turn("a", ""),), "b")


def test_no_user_message_is_a_400() -> None:
    with pytest.raises(HTTPException) as info:
        _read([{"role": "system", "content": "hi"}])
    assert info.value.status_code == 400
