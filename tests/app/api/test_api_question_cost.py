"""One stateless request costs what its answer needs: a question is bounded by tokens before any work, and
turn KV is written only for turns likely to come back (a stored conversation, or a client that resends its
history)."""

from __future__ import annotations

from fastapi.testclient import TestClient


def num_entries(client: TestClient) -> int:
    return len(client.app.state.blendrag.services.store.keys())  # type: ignore[attr-defined]


def test_two_thousand_one_letter_messages_are_refused_before_any_work(
    client: TestClient, corpus: dict[str, str]
) -> None:
    before = num_entries(client)
    messages = [{"role": "user", "content": "q"} for _ in range(2000)]
    response = client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 2})
    assert response.status_code == 400, response.text
    message = response.json()["error"]["message"]
    assert message.startswith("the question is ") and message.endswith(
        " tokens; the limit is 1024 (server.max_question_tokens)"
    )
    asked = client.post("/ask", json={"question": "q\n" * 1500, "stream": False, "max_tokens": 2})
    assert asked.status_code == 422, asked.text
    assert asked.json()["detail"].endswith("the limit is 1024 (server.max_question_tokens)")
    assert num_entries(client) == before


def test_a_long_system_message_counts_toward_the_prompt_cap(client: TestClient, corpus: dict[str, str]) -> None:
    before = num_entries(client)
    messages = [{"role": "system", "content": "s " * 3500}, {"role": "user", "content": "hi"}]
    response = client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 2})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["message"].startswith("the prompt is ") and error["message"].endswith(
        "the limit is 2048 (server.max_prompt_tokens)"
    )
    assert "(system messages " in error["message"] and " + question 1)" in error["message"]
    assert num_entries(client) == before


def test_a_lone_stateless_question_writes_no_turn_kv(client: TestClient, corpus: dict[str, str]) -> None:
    def chat(messages: list[dict[str, str]]) -> None:
        response = client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 2})
        assert response.status_code == 200, response.text

    chat([{"role": "user", "content": "What is the capital of Zorblat?"}])  # the chunks' KV is open after it
    before = num_entries(client)
    chat([{"role": "user", "content": "Which festival is in May?"}])
    assert num_entries(client) == before  # stateless, no history: nothing brings this turn back
    # A one-off /ask stores no conversation, so nothing brings its turn back either.
    once = client.post("/ask", json={"question": "Tell me about kites.", "stream": False, "max_tokens": 2})
    assert once.status_code == 200 and once.json()["conversation_id"] is None
    assert num_entries(client) == before
    # A stored conversation ("new") will be continued: its turn's KV is written.
    body = {"question": "Tell me about kites.", "conversation_id": "new", "stream": False, "max_tokens": 2}
    asked = client.post("/ask", json=body)
    assert asked.status_code == 200 and asked.json()["conversation_id"] is not None
    assert num_entries(client) == before + 1
