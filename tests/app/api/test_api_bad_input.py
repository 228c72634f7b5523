"""Hand-made bad input that used to answer 500: each is now a 4xx with a message, or handled."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.sse_reader import parse_sse


def _nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = {"k": value}
    return value


def test_huge_offset_is_422(client: TestClient) -> None:
    response = client.get("/documents", params={"offset": 2**63})
    assert response.status_code == 422
    assert response.json()["detail"].startswith("query.offset: Input should be less than or equal to")
    assert client.get("/documents", params={"offset": 2**62}).json()["documents"] == []


def test_deeply_nested_metadata_is_422(client: TestClient) -> None:
    body = '{"documents": [{"title": "t", "text": "x", "metadata": ' + '{"k": ' * 5000 + '"leaf"' + "}" * 5000 + "}]}"
    response = client.post("/ingest", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 422
    assert response.json() == {"detail": "invalid ingest body: JSON nested too deeply"}

    response = client.post("/ingest", json={"documents": [{"title": "t", "text": "x", "metadata": _nested(17)}]})
    assert response.status_code == 422
    assert "metadata is nested deeper than 16 levels" in response.json()["detail"]
    accepted = client.post("/ingest", json={"documents": [{"title": "t", "text": "x", "metadata": _nested(16)}]})
    assert accepted.status_code == 202


def test_lone_surrogate_in_ingest_is_422(client: TestClient) -> None:
    response = client.post(
        "/ingest",
        content=b'{"documents": [{"title": "\\ud800", "text": "x"}]}',
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 422
    assert response.json()["detail"].startswith("invalid ingest body: documents.0.title: ")


@pytest.mark.parametrize("extra", [{"temperature": 1e-40}, {"temperature": 1.0, "top_p": 1e-300}])
def test_extreme_sampling_values_answer(client: TestClient, corpus: dict[str, str], extra: dict[str, float]) -> None:
    response = client.post("/ask", json={"question": "Where is Quintaro?", "max_tokens": 3, "stream": False, **extra})
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] >= 1


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"seed": 1e29}, "seed: Unable to parse input string as an integer, exceeded maximum size"),
        ({"seed": 2**53}, "seed: Input should be less than or equal to 9007199254740991"),
        ({"seed": -1}, "seed: Input should be greater than or equal to 0"),
        ({"temperature": False}, "temperature: expected a number, not true/false"),
        ({"max_tokens": True}, "max_tokens: expected a number, not true/false"),
        ({"stream": 1}, "stream: Input should be a valid boolean"),
        (
            {"question": "\ud800"},
            "question: Input should be a valid string, unable to parse raw data as a unicode string",
        ),
    ],
)
def test_bad_ask_values_are_422(client: TestClient, body: dict[str, Any], message: str) -> None:
    raw = json.dumps({"question": "Where?", **body})  # ensure_ascii: a lone surrogate travels as \ud800
    response = client.post("/ask", content=raw, headers={"content-type": "application/json"})
    assert response.status_code == 422
    assert response.json()["detail"] == message


@pytest.mark.parametrize("stream", [False, True])
def test_lone_surrogate_in_chat_is_400(client: TestClient, stream: bool) -> None:
    raw = json.dumps({"messages": [{"role": "user", "content": "where \ud800?"}], "stream": stream, "max_tokens": 2})
    response = client.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
    assert response.status_code == 400
    assert response.json()["error"]["message"].startswith(
        "messages.0.user.content.constrained-str: Input should be a valid string, unable to parse raw data as a "
        "unicode string"
    )


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("messages", "where"),
    [
        ([{"role": "system", "content": "a\udfffb"}, {"role": "user", "content": "where?"}], "messages[0] (system)"),
        (
            [
                {"role": "developer", "content": [{"type": "text", "text": "a\udfffb"}]},
                {"role": "user", "content": "w?"},
            ],
            "messages[0] (developer)",
        ),
        (
            [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "a\udfffb"},
                {"role": "user", "content": "where?"},
            ],
            "messages[1] (assistant)",
        ),
    ],
)
def test_lone_surrogate_in_any_chat_message_is_400_in_openai_form(
    client: TestClient, stream: bool, messages: list[dict[str, Any]], where: str
) -> None:
    raw = json.dumps({"messages": messages, "stream": stream, "max_tokens": 2})
    response = client.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
    assert response.status_code == 400
    assert response.json()["error"]["message"] == (
        f"{where}: text must be valid Unicode (a lone surrogate such as \\ud800 is not)"
    )
    assert response.json()["error"]["type"] == "invalid_request_error"


def test_lone_surrogate_in_a_stop_sequence_is_400(client: TestClient) -> None:
    raw = json.dumps({"messages": [{"role": "user", "content": "where?"}], "stop": ["a\ud800"], "max_tokens": 2})
    response = client.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
    assert response.status_code == 400
    assert response.json()["error"]["message"].startswith("stop")


def test_boolean_numbers_in_chat_are_400(client: TestClient) -> None:
    response = client.post(
        "/v1/chat/completions", json={"messages": [{"role": "user", "content": "where?"}], "temperature": False}
    )
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "temperature"


def test_chat_question_over_the_ask_cap_is_400(client: TestClient) -> None:
    response = client.post(
        "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x" * 8001}], "max_tokens": 2}
    )
    assert response.status_code == 400
    assert "at most 8000 characters" in response.json()["error"]["message"]


def test_prompt_longer_than_the_context_is_422(client: TestClient, corpus: dict[str, str]) -> None:
    model = client.app.state.blendrag.services.engine.model  # type: ignore[attr-defined]
    saved = model.config
    # The tiny model's 8,192 positions cannot be reached under the question cap: pretend it has 40.
    model.config = dataclasses.replace(saved, max_position_embeddings=40)
    try:
        response = client.post(
            "/ask", json={"question": "Where is Quintaro, and what is in its rivers?", "stream": True}
        )
        chat = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Where?"}]})
    finally:
        model.config = saved
    assert response.status_code == 422
    assert "longer than the model's context of 40 tokens" in response.json()["detail"]
    assert chat.status_code == 400
    assert "longer than the model's context of 40 tokens" in chat.json()["error"]["message"]


def test_streamed_ask_still_works(client: TestClient, corpus: dict[str, str]) -> None:
    response = client.post("/ask", json={"question": "Where is Quintaro?", "max_tokens": 2})
    events = parse_sse(response.text)
    assert [name for name, _ in events][0] == "sources" and events[-1][0] == "done"


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("PATCH", "/documents/some-id", "GET, DELETE"),  # two routes at one path: both named
        ("PUT", "/ask", "POST"),
        ("POST", "/health", "GET"),
        ("DELETE", "/v1/chat/completions", "POST"),
    ],
)
def test_405_names_every_allowed_method(client: TestClient, method: str, path: str, allow: str) -> None:
    response = client.request(method, path)
    assert response.status_code == 405
    assert response.headers["allow"] == allow


def test_spec_describes_event_streams(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    ask = spec["paths"]["/ask"]["post"]["responses"]
    stream = ask["200"]["content"]["text/event-stream"]["schema"]
    names = [v["properties"]["event"]["const"] for v in stream["oneOf"]]
    assert names == ["sources", "token", "done", "error"]
    done = stream["oneOf"][2]["properties"]["data"]
    assert done["contentMediaType"] == "application/json"
    assert "answer" in done["contentSchema"]["properties"]
    assert {"400", "401", "422", "429", "503"} <= set(ask)
    ingest = spec["paths"]["/ingest"]["post"]
    assert {"400", "413", "415"} <= set(ingest["responses"])
    assert (
        "another extension answers 415"
        in (ingest["requestBody"]["content"]["multipart/form-data"]["schema"]["properties"]["files"]["description"])
    )
    job_events = spec["paths"]["/ingest/jobs/{job_id}/events"]["get"]["responses"]["200"]["content"]
    assert [v["properties"]["event"]["const"] for v in job_events["text/event-stream"]["schema"]["oneOf"]] == [
        "progress",
        "done",
        "error",
    ]
