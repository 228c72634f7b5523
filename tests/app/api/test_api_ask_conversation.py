"""Conversations on a real server (tiny Llama with SmolLM2's chat template, MiniLM): the exact prompt of a
3-turn /ask and /v1 conversation, turn KV reused by content, a missing or corrupt turn entry recomputed,
the history budget, a client system prompt, and the 404s."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from engine.prompt import LEAD_IN, Turn

QUESTIONS = ["What is the capital of Zorblat?", "What colour are its rivers?", "When is its kite festival?"]
SAMPLING = {"temperature": 1.0, "seed": 7, "max_tokens": 6}  # the random model's greedy text is only newlines


@pytest.fixture
def submitted(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every GenerationRequest the routes hand the scheduler, in order."""
    state = client.app.state.blendrag
    seen: list[Any] = []
    real = state.scheduler.submit

    def spy(request, *args, **kwargs):
        seen.append(request)
        return real(request, *args, **kwargs)

    monkeypatch.setattr(state.scheduler, "submit", spy)
    return seen


def _ask(client: TestClient, question: str, **body: Any) -> dict[str, Any]:
    response = client.post("/ask", json={"question": question, "stream": False, "top_k": 2, **SAMPLING, **body})
    assert response.status_code == 200, response.text
    return response.json()


def _expected_ids(client: TestClient, system: str | None, layout: Any, turns: list[Turn], question: str) -> list[int]:
    """prefix (the template's opening, then the lead-in if the engine opens the context with one) + the prompt's
    chunk ids + the chat template's rendering of everything after them (a client's system prompt restated after
    the question)."""
    engine = client.app.state.blendrag.services.engine
    tok = engine.tokenizer
    if system is not None:
        question = f"{question}\n\n{system}"
    system = system or engine.settings.system_prompt
    messages = [{"role": "system", "content": system}]
    for turn in turns:
        messages += [{"role": "user", "content": f"Question: {turn.question}"}]
        messages += [{"role": "assistant", "content": turn.answer.strip()}]
    messages.append({"role": "user", "content": f"Question: {question}"})
    rendered = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    opening = tok.apply_chat_template(messages[:1] + [{"role": "user", "content": "\u2063"}], tokenize=False)
    head = opening.split("\u2063")[0]
    assert rendered.startswith(head)
    tail = tok.encode(rendered[len(head) :], add_special_tokens=False)
    lead_in = tok.encode(LEAD_IN, add_special_tokens=False) if engine.settings.chunk_lead_in else []
    chunk_ids = [t for c in layout.retrieved_chunk_ids for t in c]
    return tok.encode(head, add_special_tokens=False) + lead_in + chunk_ids + tail


def test_three_turn_ask_and_v1_prompts_are_the_chat_template(
    client: TestClient, corpus: dict[str, str], submitted: list[Any]
) -> None:
    state = client.app.state.blendrag
    turns: list[Turn] = []
    conversation_id = None
    dones = []
    for question in QUESTIONS:
        done = _ask(client, question, conversation_id=conversation_id or "new")
        conversation_id = conversation_id or done["conversation_id"]
        assert done["conversation_id"] == conversation_id
        layout = submitted[-1].layout
        assert layout.all_ids() == _expected_ids(client, None, layout, turns, question)
        assert layout.num_history_segments == len(turns) == done["history_turns"]
        assert done["usage"]["history_tokens"] == layout.num_history_tokens
        # Each earlier turn's KV was stored when it finished: all of it reused.
        assert done["usage"]["history_reused_tokens"] == done["usage"]["history_tokens"]
        # The sources come first in the prompt, in the same chunks as the catalog's.
        chunks = state.services.catalog.chunks_by_ids([s["chunk_id"] for s in done["sources"]])
        assert layout.retrieved_chunk_ids == [chunks[s["chunk_id"]].token_ids for s in reversed(done["sources"])]
        dones.append(done)
        turns.append(Turn(question, done["answer"]))
    assert dones[0]["usage"]["history_tokens"] == 0 and dones[2]["usage"]["history_tokens"] > 0
    assert dones[2]["retrieval_query"].startswith(QUESTIONS[2])  # concat: the recent questions, newest first

    stored = client.get(f"/conversations/{conversation_id}").json()
    assert [(t["question"], t["answer"]) for t in stored["turns"]] == [(t.question, t.answer) for t in turns]
    assert stored["turns"][2]["usage"]["history_tokens"] == dones[2]["usage"]["history_tokens"]
    assert [s["chunk_id"] for s in stored["turns"][0]["sources"]] == [s["chunk_id"] for s in dones[0]["sources"]]

    # /v1, stateless: the same history resent as messages gives the same prompt and finds the same entries.
    messages = []
    for turn in turns[:2]:
        messages += [{"role": "user", "content": turn.question}, {"role": "assistant", "content": turn.answer}]
    messages.append({"role": "user", "content": QUESTIONS[2]})
    response = client.post("/v1/chat/completions", json={"messages": messages, "top_k": 2, **SAMPLING})
    assert response.status_code == 200, response.text
    body = response.json()
    v1_layout = submitted[-1].layout
    assert v1_layout.all_ids() == _expected_ids(client, None, v1_layout, turns[:2], QUESTIONS[2])
    assert v1_layout.history_ids == [state.services.engine.prompt.turn_ids(t) for t in turns[:2]]
    assert body["usage"]["history_tokens"] == v1_layout.num_history_tokens > 0
    assert body["usage"]["history_reused_tokens"] == body["usage"]["history_tokens"]
    assert body["blendrag"]["conversation_id"] is None  # nothing stored
    assert client.get(f"/conversations/{conversation_id}").json()["num_turns"] == 3

    # Prometheus counts both, over every answer so far (these four at least).
    metrics = dict(
        line.rsplit(" ", 1) for line in client.get("/metrics").text.splitlines() if line.startswith("blendrag_history")
    )
    at_least = dones[1]["usage"]["history_tokens"] + dones[2]["usage"]["history_tokens"] + v1_layout.num_history_tokens
    assert float(metrics["blendrag_history_tokens_total"]) >= at_least
    assert float(metrics["blendrag_history_reused_tokens_total"]) >= at_least


def test_client_system_prompt_is_its_own_prefix(
    client: TestClient, corpus: dict[str, str], submitted: list[Any]
) -> None:
    system = "Start every answer with Arr!"
    messages = [
        {"role": "system", "content": system},
        {"role": "user", "content": QUESTIONS[0]},
        {"role": "assistant", "content": "Quintaro."},
        {"role": "user", "content": QUESTIONS[1]},
    ]
    response = client.post("/v1/chat/completions", json={"messages": messages, "top_k": 2, **SAMPLING})
    assert response.status_code == 200, response.text
    layout = submitted[-1].layout
    engine = client.app.state.blendrag.services.engine
    assert layout.prefix_ids == engine.prompt.for_system_prompt(system).prefix_ids != engine.prompt.prefix_ids
    assert layout.all_ids() == _expected_ids(client, system, layout, [Turn(QUESTIONS[0], "Quintaro.")], QUESTIONS[1])
    assert submitted[-1].mode == "blend" and submitted[-1].kv_reader is not None  # blended, not refused
    plain = client.post("/v1/chat/completions", json={"messages": messages[1:], "top_k": 2, **SAMPLING}).json()
    # The client's prompt replaced the server's, and is restated after the question: the prompt differs by
    # the two prefixes' lengths and the restatement only.
    client_builder = engine.prompt.for_system_prompt(system)
    restated = len(client_builder.suffix_ids(QUESTIONS[1])) - len(engine.prompt.suffix_ids(QUESTIONS[1]))
    difference = len(client_builder.prefix_ids) - len(engine.prompt.prefix_ids) + restated
    assert response.json()["usage"]["prompt_tokens"] - plain["usage"]["prompt_tokens"] == difference


def test_missing_or_corrupt_turn_entry_is_recomputed(client: TestClient, corpus: dict[str, str]) -> None:
    state = client.app.state.blendrag
    store, services = state.services.store, state.services
    first = _ask(client, QUESTIONS[0], conversation_id="new")
    turn = Turn(QUESTIONS[0], first["answer"])
    key = services.kv_space.key(services.engine.prompt.turn_ids(turn))
    assert store.contains(key) == "history_memory"

    store.delete(key)  # missing everywhere
    second = _ask(client, QUESTIONS[1], conversation_id=first["conversation_id"])
    assert second["usage"]["history_tokens"] > 0 and second["usage"]["history_reused_tokens"] == 0
    assert store.contains(key) == "history_memory"  # computed at question time and stored again

    # Corrupt on disk, gone from memory: found corrupt while its layers stream in, recomputed once.
    store.history_memory.delete(key)
    path = store.disk.path_for(key)
    data = bytearray(path.read_bytes())
    data[-8:] = bytes(b ^ 0xFF for b in data[-8:])
    path.write_bytes(bytes(data))
    third = _ask(client, QUESTIONS[1], conversation_id=first["conversation_id"])
    assert third["finish_reason"] in ("stop", "length")
    # The corrupt first turn was computed again; the second turn's entry was reused.
    num_first = len(services.engine.prompt.turn_ids(turn))
    assert third["history_turns"] == 2
    assert third["usage"]["history_reused_tokens"] == third["usage"]["history_tokens"] - num_first > 0
    got = store.get(key)
    assert got is not None and got.num_tokens == len(services.engine.prompt.turn_ids(turn))


@pytest.fixture(scope="module")
def tight(tmp_path_factory: pytest.TempPathFactory, settings: Settings) -> Iterator[TestClient]:
    """A server whose history budget holds about one short turn."""
    from pathlib import Path

    from apitools import server_settings

    budget = server_settings(
        tmp_path_factory.mktemp("tight") / "data", Path(settings.engine.model), engine={"history_max_tokens": 30}
    )
    with TestClient(create_app(budget, load_in_background=False)) as c:
        yield c


def test_history_budget_drops_the_oldest_turns(tight: TestClient) -> None:
    from apitools import ingest_corpus

    ingest_corpus(tight)
    engine = tight.app.state.blendrag.services.engine
    turns = [Turn("Where is Quintaro?", "On Zorblat."), Turn("Rivers?", "Purple."), Turn("Kites?", "In May.")]
    sizes = [len(engine.prompt.turn_ids(t)) for t in turns]
    assert sizes[2] <= 30 < sizes[1] + sizes[2]  # the budget holds the newest turn only
    messages = []
    for t in turns:
        messages += [{"role": "user", "content": t.question}, {"role": "assistant", "content": t.answer}]
    messages.append({"role": "user", "content": "And the moon?"})
    body = tight.post("/v1/chat/completions", json={"messages": messages, "top_k": 1, **SAMPLING}).json()
    assert (body["blendrag"]["history_turns"], body["blendrag"]["history_dropped_turns"]) == (1, 2)
    assert body["usage"]["history_tokens"] == sizes[2]


def test_unknown_conversation_is_a_404(client: TestClient) -> None:
    response = client.post("/ask", json={"question": "q", "conversation_id": "no-such-id"})
    assert response.status_code == 404 and "no conversation" in response.json()["detail"]
    response = client.post(
        "/v1/chat/completions", json={"messages": [{"role": "user", "content": "q"}], "conversation_id": "nope"}
    )
    assert response.status_code == 404 and response.json()["error"]["code"] == "conversation_not_found"
    assert client.post("/ask", json={"question": "q", "conversation_id": "bad id!"}).status_code == 422
    done = _ask(client, QUESTIONS[0], conversation_id="new")
    assert client.delete(f"/conversations/{done['conversation_id']}").status_code == 204
    gone = client.post("/ask", json={"question": "q", "conversation_id": done["conversation_id"]})
    assert gone.status_code == 404


def test_v1_conversation_new_then_continued_from_the_store(client: TestClient, corpus: dict[str, str]) -> None:
    first = client.post(
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": QUESTIONS[0]}], "conversation_id": "new", **SAMPLING},
    ).json()
    conversation_id = first["blendrag"]["conversation_id"]
    assert conversation_id and conversation_id != "new"
    # Only the new question, with the id: the stored turns are the history.
    second = client.post(
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": QUESTIONS[1]}], "conversation_id": conversation_id, **SAMPLING},
    ).json()
    assert second["blendrag"]["history_turns"] == 1 and second["usage"]["history_reused_tokens"] > 0
    stored = client.get(f"/conversations/{conversation_id}").json()
    assert [t["question"] for t in stored["turns"]] == QUESTIONS[:2]
