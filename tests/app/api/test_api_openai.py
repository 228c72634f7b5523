"""The OpenAI-compatible routes, driven by the official `openai` client over a real socket (uvicorn)."""

from __future__ import annotations

import httpx
import openai
import pytest
from apitools import CORPUS, LiveServer, ingest_corpus

from app.sse_reader import parse_sse

QUESTION = "What is the capital of Zorblat?"


@pytest.fixture(scope="module")
def oai(live_server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{live_server.url}/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def live_corpus(live_server: LiveServer) -> dict[str, str]:
    with httpx.Client(base_url=live_server.url, timeout=60) as http:
        return ingest_corpus(http)


def test_models_lists_the_served_model(oai: openai.OpenAI) -> None:
    models = oai.models.list()
    assert [m.id for m in models.data] == ["blendrag"]
    assert models.data[0].object == "model"
    assert models.data[0].owned_by == "blendrag"
    facts = models.data[0].model_extra["blendrag"]  # which model answers under the id clients send back
    assert (facts["name"], facts["num_layers"], facts["compute_dtype"]) == ("tiny-llama-smollm2-tok", 2, "float32")


def test_non_streaming_completion_with_sources(oai: openai.OpenAI, live_corpus: dict[str, str]) -> None:
    completion = oai.chat.completions.create(
        model="blendrag",
        max_tokens=5,
        temperature=0,
        messages=[
            {"role": "system", "content": "ignored: the server's system prompt is fixed"},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": QUESTION},
        ],
        extra_body={"top_k": 2},
    )
    assert completion.object == "chat.completion"
    assert completion.id.startswith("chatcmpl-")
    assert completion.model == "blendrag"
    assert completion.system_fingerprint.startswith("fp_")
    [choice] = completion.choices
    assert choice.index == 0
    assert choice.message.role == "assistant"
    assert isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")
    usage = completion.usage
    assert 1 <= usage.completion_tokens <= 5
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    sources = completion.model_extra["sources"]
    assert [s["rank"] for s in sources] == [1, 2]
    assert sources[0]["document_id"] == live_corpus["Zorblat facts"]  # retrieval ran on the last user turn
    assert sources[0]["text"].startswith(CORPUS[0]["text"])
    extras = completion.model_extra["blendrag"]
    assert extras["mode"] == "blend" and extras["selector"] == "query"
    assert extras["kv_hits"] == 2
    assert extras["timings"]["ttft_ms"] > 0


def test_streaming_completion_matches_the_non_streaming_one(oai: openai.OpenAI, live_corpus: dict[str, str]) -> None:
    kwargs = {
        "model": "anything-goes",
        "max_tokens": 5,
        "temperature": 0,
        "extra_body": {"top_k": 2},
        "messages": [{"role": "user", "content": [{"type": "text", "text": QUESTION}]}],
    }
    whole = oai.chat.completions.create(**kwargs)
    chunks = list(oai.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
    assert len({c.id for c in chunks}) == 1
    assert all(c.object == "chat.completion.chunk" and c.model == "blendrag" for c in chunks)
    first, last_choice, usage_chunk = chunks[0], chunks[-2], chunks[-1]
    assert first.choices[0].delta.role == "assistant"
    assert first.choices[0].delta.content == ""
    assert [s["document_id"] for s in first.model_extra["sources"]] == [
        s["document_id"] for s in whole.model_extra["sources"]
    ]
    assert last_choice.choices[0].finish_reason == whole.choices[0].finish_reason
    assert last_choice.choices[0].delta.content is None
    assert usage_chunk.choices == []
    assert usage_chunk.usage.completion_tokens == whole.usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content  # greedy: same answer either way


def test_raw_stream_ends_with_done(live_server: LiveServer, live_corpus: dict[str, str]) -> None:
    body = {"model": "blendrag", "stream": True, "max_tokens": 3, "messages": [{"role": "user", "content": QUESTION}]}
    with httpx.Client(base_url=live_server.url, timeout=60) as http:
        response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.text.endswith("data: [DONE]\n\n")
    events = parse_sse(response.text)
    assert all(name is None for name, _ in events)  # OpenAI streams have no event names
    assert events[-1] == (None, "[DONE]")
    assert events[-2][1]["choices"][0]["finish_reason"] in ("stop", "length")
    assert "usage" not in events[0][1]  # only with stream_options.include_usage


def test_errors_come_in_openai_shape(oai: openai.OpenAI, live_server: LiveServer) -> None:
    with pytest.raises(openai.BadRequestError) as no_user:
        oai.chat.completions.create(model="blendrag", messages=[{"role": "system", "content": "hi"}])
    assert no_user.value.status_code == 400
    assert no_user.value.body == {
        "message": "messages must contain a user message with text (the question)",
        "type": "invalid_request_error",
        "param": None,
        "code": None,
    }

    with pytest.raises(openai.BadRequestError) as bad_mode:
        oai.chat.completions.create(
            model="blendrag", messages=[{"role": "user", "content": "q"}], extra_body={"mode": "turbo"}
        )
    assert bad_mode.value.body["message"] == "mode: Input should be 'blend', 'full', 'prefix' or 'reuse'"
    assert bad_mode.value.body["type"] == "invalid_request_error"

    picked = oai.chat.completions.create(
        model="blendrag",
        messages=[{"role": "user", "content": "q"}],
        max_tokens=1,
        extra_body={"selector": "deviation", "top_k": 1},
    )
    assert picked.model_extra["blendrag"]["selector"] == "deviation"
    assert bad_mode.value.body["param"] == "mode"

    with pytest.raises(openai.BadRequestError) as two:
        oai.chat.completions.create(model="blendrag", n=2, messages=[{"role": "user", "content": "q"}])
    assert two.value.body["message"] == "n: Input should be less than or equal to 1"

    with httpx.Client(base_url=live_server.url) as http:
        empty = http.post("/v1/chat/completions", json={"model": "blendrag", "messages": []})
    assert empty.status_code == 400
    assert empty.json() == {
        "error": {
            "message": "messages: List should have at least 1 item after validation, not 0",
            "type": "invalid_request_error",
            "param": "messages",
            "code": None,
        }
    }


def test_finish_reasons_map_to_openai_ones() -> None:
    from app.api.openai_compat import finish_reason

    assert [finish_reason(r) for r in ("stop", "length", "repetition", "cancelled")] == [
        "stop",
        "length",
        "stop",
        "stop",
    ]
