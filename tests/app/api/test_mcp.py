"""The MCP tools end to end with the SDK's own client, over streamable HTTP (/mcp on a uvicorn server on
127.0.0.1) and over stdio (`blendrag mcp` spawned as a client spawns it, relaying to that server): the four
tools, the keys' rules (the admin sees every collection, a collection key its own, no key nothing once keys
exist; a wrong key is a 401), and bad arguments answered as tool errors with a message.

On the fast stand-ins (tiny random Llama, hash embedder): answers are gibberish, their shape is what counts;
what search returns is checked against /ask's own retrieval (`AskService.plan`)."""

from __future__ import annotations

import dataclasses
import subprocess
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack, asynccontextmanager
from pathlib import Path
from typing import Any, TextIO

import httpx
import pytest
from apitools import LiveServer, ingest_corpus
from fastapi import FastAPI
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import MCPError
from mcptools import (
    ADMIN_KEY,
    IN_CORPUS,
    LIBRARY,
    OUT_OF_CORPUS,
    TOOL_NAMES,
    Served,
    blendrag_command,
    error_text,
    fast_mcp_settings,
    http_client,
    serve_mcp,
    stdio_parameters,
    structured,
)

from app.api.deps import KEY_REQUIRED
from app.api.mcp import mount_mcp
from app.api.schemas.answers import SourceOut
from app.services.ask.types import NOT_COVERED, AskRequest
from app.settings import Settings
from app.state import AppState

WRONG_KEY = "brk_not-a-key"
BREAD_QUESTION = "What does sourdough need?"
REFUSED_401 = f"{KEY_REQUIRED} (401 Unauthorized)"


@pytest.fixture
def served(make_fast_settings, make_fast_services) -> Iterator[Served]:
    """api_key set, collections `planets` and `food`, a key for `planets`."""
    settings = fast_mcp_settings(make_fast_settings)
    with serve_mcp(settings, make_fast_services(settings)) as s:
        yield s


async def _sources(
    served: Served, question: str, collections: set[str] | None = None, top_k: int | None = None
) -> list:
    """The `sources` /ask gives the model for this question (`AskService.plan`), as the wire writes them."""
    assert served.services.ask is not None
    request = AskRequest(question=question, top_k=top_k)
    scoped = frozenset(collections) if collections is not None else None
    request = dataclasses.replace(request, filters=dataclasses.replace(request.filters, collections=scoped))
    plan = await served.services.ask.plan(request)
    return [SourceOut.model_validate(source).model_dump(mode="json") for source in plan.sources]


# ---- over streamable HTTP ---------------------------------------------------------------------------------


async def test_the_tools_are_listed_with_their_arguments(served: Served) -> None:
    async with http_client(served.url, ADMIN_KEY) as client:
        tools = (await client.list_tools()).tools
    assert [t.name for t in tools] == TOOL_NAMES
    schemas = {t.name: t.input_schema for t in tools}
    assert {name: sorted(s["properties"]) for name, s in schemas.items()} == {
        "search": ["collection", "question", "top_k"],
        "ask": ["collection", "max_tokens", "mode", "question"],
        "list_collections": [],
        "get_document": ["document_id"],
    }
    assert {name: s.get("required", []) for name, s in schemas.items()} == {
        "search": ["question"],
        "ask": ["question"],
        "list_collections": [],
        "get_document": ["document_id"],
    }
    assert schemas["search"]["properties"]["top_k"]["anyOf"][0] == {"maximum": 64, "minimum": 1, "type": "integer"}
    assert schemas["ask"]["properties"]["mode"]["anyOf"][0]["enum"] == ["blend", "full", "prefix", "reuse"]
    assert all(t.annotations is not None and t.annotations.read_only_hint for t in tools)
    assert all(t.output_schema is not None and t.output_schema["type"] == "object" for t in tools)


async def test_the_admin_key_sees_every_collection(served: Served) -> None:
    planets, food = served.documents["planets"], served.documents["food"]
    async with http_client(served.url, ADMIN_KEY) as client:
        listed = structured(await client.call_tool("list_collections", {}))
        found = structured(await client.call_tool("search", {"question": IN_CORPUS, "top_k": 2}))
        in_food = structured(await client.call_tool("search", {"question": BREAD_QUESTION, "collection": "food"}))
        not_in_food = structured(await client.call_tool("search", {"question": IN_CORPUS, "collection": "food"}))
        document = structured(await client.call_tool("get_document", {"document_id": planets}))
    assert [
        (c["name"], c["num_documents"], c["num_ready_documents"], c["num_chunks"]) for c in listed["collections"]
    ] == [
        ("food", 1, 1, 1),
        ("planets", 1, 1, 1),
    ]
    # The passages /ask would give the model, best first: document, section, score, chunk id and text.
    assert found["sources"] == await _sources(served, IN_CORPUS, top_k=2)
    assert found["notice"] is None and found["retrieval_ms"] >= 0
    planets_chunk, food_chunk = (served.services.catalog.chunks_of(d)[0] for d in (planets, food))
    assert [(s["rank"], s["document_id"], s["chunk_id"], s["title"], s["section"]) for s in found["sources"]] == [
        (1, planets, planets_chunk.id, "Zorblat facts", "Zorblat"),
        (2, food, food_chunk.id, "Baking notes", None),
    ]
    assert found["sources"][0]["text"] == LIBRARY["planets"][1]
    assert in_food["sources"] == await _sources(served, BREAD_QUESTION, {"food"})
    assert ([s["document_id"] for s in in_food["sources"]], in_food["notice"]) == ([food], None)
    assert (not_in_food["sources"], not_in_food["notice"]) == ([], NOT_COVERED)
    assert (document["id"], document["title"], document["collection"], document["status"]) == (
        planets,
        "Zorblat facts",
        "planets",
        "ready",
    )
    assert [(c["id"], c["index"], c["text"]) for c in document["chunks"]] == [
        (planets_chunk.id, 0, LIBRARY["planets"][1])
    ]


async def test_a_collection_key_sees_its_own_collection_only(served: Served) -> None:
    food = served.documents["food"]
    async with http_client(served.url, served.planets_key) as client:
        listed = structured(await client.call_tool("list_collections", {}))
        found = structured(await client.call_tool("search", {"question": IN_CORPUS, "top_k": 2}))
        refused = error_text(await client.call_tool("search", {"question": IN_CORPUS, "collection": "food"}))
        asked = error_text(await client.call_tool("ask", {"question": IN_CORPUS, "collection": "food"}))
        hidden = error_text(await client.call_tool("get_document", {"document_id": food}))
    assert [c["name"] for c in listed["collections"]] == ["planets"]
    # Filtered before top-k: the one passage of its collection, not one of two.
    assert [s["document_id"] for s in found["sources"]] == [served.documents["planets"]]
    assert found["sources"] == await _sources(served, IN_CORPUS, {"planets"}, top_k=2)
    assert refused == asked == "this key may not read collection 'food' (403 Forbidden)"
    assert hidden == f"no document '{food}' in the collections this key may read"


async def test_without_a_key_or_with_a_wrong_one_nothing_is_served(served: Served) -> None:
    for headers in ({}, {"Authorization": f"Bearer {WRONG_KEY}"}, {"X-API-Key": "admin-secrets"}):
        response = httpx.post(
            f"{served.url}/mcp",
            json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
            headers={"Accept": "application/json, text/event-stream", **headers},
        )
        assert (response.status_code, response.json()) == (401, {"detail": KEY_REQUIRED})
        assert response.headers["www-authenticate"] == "Bearer"
    for key in (None, WRONG_KEY):  # the SDK's client fails to connect
        with pytest.raises(BaseExceptionGroup) as refused:
            async with http_client(served.url, key) as client:
                await client.list_tools()
        assert isinstance(_first_leaf(refused.value), MCPError), refused.value


async def test_with_asking_open_a_client_without_a_key_may_search_but_not_read_the_library(
    make_fast_settings, make_fast_services
) -> None:
    """With `server.api_key` set and no collection key, /ask is open and /collections is not: so are the tools."""
    settings = fast_mcp_settings(make_fast_settings)
    with serve_mcp(settings, make_fast_services(settings), with_key=False) as served:
        async with http_client(served.url, None) as client:
            found = structured(await client.call_tool("search", {"question": IN_CORPUS, "top_k": 1}))
            listed = error_text(await client.call_tool("list_collections", {}))
            document = error_text(await client.call_tool("get_document", {"document_id": served.documents["food"]}))
    assert [s["document_id"] for s in found["sources"]] == [served.documents["planets"]]
    assert listed == document == REFUSED_401


async def test_protect_ask_closes_the_question_tools_too(make_fast_settings, make_fast_services) -> None:
    settings = fast_mcp_settings(make_fast_settings, protect_ask=True)
    with serve_mcp(settings, make_fast_services(settings), with_key=False) as served:
        response = httpx.post(f"{served.url}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
        assert (response.status_code, response.json()) == (401, {"detail": KEY_REQUIRED})


# (tool, arguments, what the tool error says after "invalid arguments: ")
BAD_ARGUMENTS = [
    ("search", {"question": IN_CORPUS, "top_k": 0}, "top_k: Input should be greater than or equal to 1"),
    ("search", {"question": IN_CORPUS, "top_k": 65}, "top_k: Input should be less than or equal to 64"),
    ("search", {"question": IN_CORPUS, "top_k": "3"}, "top_k: expected a number, not a string"),
    ("search", {"question": IN_CORPUS, "top_k": True}, "top_k: expected a number, not true/false"),
    ("search", {"question": "   "}, "question: question must not be empty"),
    ("search", {"question": "x" * 8001}, "question: String should have at most 8000 characters"),
    ("search", {}, "question: Field required"),
    ("search", {"question": IN_CORPUS, "colour": "red"}, "colour: Extra inputs are not permitted"),
    (
        "search",
        {"question": IN_CORPUS, "collection": "../etc"},
        "collection: String should match pattern '^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$'",
    ),
    ("ask", {"question": IN_CORPUS, "mode": "fast"}, "mode: Input should be 'blend', 'full', 'prefix' or 'reuse'"),
    ("ask", {"question": 42}, "question: Input should be a valid string"),
    ("ask", {"question": IN_CORPUS, "max_tokens": 0}, "max_tokens: Input should be greater than or equal to 1"),
    ("list_collections", {"all": True}, "all: Extra inputs are not permitted"),
    ("get_document", {"document_id": ""}, "document_id: String should have at least 1 character"),
    ("get_document", {}, "document_id: Field required"),
]


async def test_a_bad_argument_is_a_tool_error_with_its_reason(served: Served) -> None:
    async with http_client(served.url, ADMIN_KEY) as client:
        errors = [error_text(await client.call_tool(name, args)) for name, args, _ in BAD_ARGUMENTS]
        unknown = error_text(await client.call_tool("delete_everything", {}))
        missing = error_text(await client.call_tool("get_document", {"document_id": "no-such-id"}))
        # Valid arguments, a question over the server's token limit: refused as /ask refuses it (422 there).
        too_long = error_text(await client.call_tool("ask", {"question": "x" * 4001, "max_tokens": 1}))
    assert errors == [f"invalid arguments: {message}" for _, _, message in BAD_ARGUMENTS]
    assert unknown == "unknown tool 'delete_everything'; the tools are: search, ask, list_collections, get_document"
    assert missing == "no document 'no-such-id' in the collections this key may read"
    assert too_long == "the question is 4001 tokens; the limit is 1024 (server.max_question_tokens)"


async def test_ask_answers_with_its_sources_and_timings_or_says_the_documents_do_not_cover_it(served: Served) -> None:
    async with http_client(served.url, served.planets_key) as client:
        covered = structured(await client.call_tool("ask", {"question": IN_CORPUS, "max_tokens": 4}))
        full = structured(await client.call_tool("ask", {"question": IN_CORPUS, "mode": "full", "max_tokens": 4}))
        uncovered = structured(await client.call_tool("ask", {"question": OUT_OF_CORPUS, "max_tokens": 4}))
    for answer in (covered, full, uncovered):
        assert isinstance(answer["answer"], str) and answer["usage"]["completion_tokens"] == 4
        assert set(answer["timings"]) >= {"retrieval_ms", "kv_load_ms", "ttft_ms", "total_ms"}
        assert answer["conversation_id"] is None  # a tool call stores no conversation
    assert (covered["mode"], covered["notice"]) == ("blend", None)
    assert [(s["rank"], s["document_id"]) for s in covered["sources"]] == [(1, served.documents["planets"])]
    assert all(1 <= c["rank"] <= len(covered["sources"]) for c in covered["citations"])
    assert full["mode"] == "full"
    assert (uncovered["notice"], uncovered["sources"], uncovered["citations"]) == (NOT_COVERED, [], [])
    assert (uncovered["usage"]["context_tokens"]) == 0


async def test_the_question_tools_share_the_question_routes_rate_limit(make_fast_settings, make_fast_services) -> None:
    settings = fast_mcp_settings(make_fast_settings, ask_rate_per_minute=1, ask_burst=2)
    with serve_mcp(settings, make_fast_services(settings)) as served:
        async with http_client(served.url, served.planets_key) as client:
            first = await client.call_tool("search", {"question": IN_CORPUS})
            second = await client.call_tool("ask", {"question": IN_CORPUS, "max_tokens": 1})
            third = error_text(await client.call_tool("search", {"question": IN_CORPUS}))
            listed = await client.call_tool("list_collections", {})  # not a question: not limited
    assert (first.is_error, second.is_error, listed.is_error) == (False, False, False)
    refusal, _, wait = third.partition("; retry after ")
    assert refusal == (
        "too many questions: at most 1 per minute, 2 at once, per API key (or IP address); retry later "
        "(429 Too Many Requests)"
    )
    # The 429's Retry-After: seconds until the bucket refills one question (at most a minute at 1 a minute).
    assert wait.endswith(" s") and 1 <= int(wait.removesuffix(" s")) <= 60


async def test_before_start_up_has_built_the_services_a_call_says_so(tmp_path: Path) -> None:
    app = FastAPI()
    app.state.blendrag = AppState(settings=Settings(data_dir=tmp_path / "data", server={"api_key": ADMIN_KEY}))
    endpoint = mount_mcp(app, "test")

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        async with endpoint.run():
            yield

    app.router.lifespan_context = lifespan
    with LiveServer(app) as server:
        async with http_client(server.url, ADMIN_KEY) as client:
            assert [t.name for t in (await client.list_tools()).tools] == TOOL_NAMES
            loading = [error_text(await client.call_tool(name, args)) for name, args in TOOL_CALLS]
    assert loading == ["models are still loading (503 Service Unavailable); retry after 5 s"] * len(TOOL_CALLS)


TOOL_CALLS = [
    ("search", {"question": IN_CORPUS}),
    ("ask", {"question": IN_CORPUS}),
    ("list_collections", {}),
    ("get_document", {"document_id": "x"}),
]


@pytest.mark.slow  # the real MiniLM embedder (the app as `blendrag serve` builds it)
async def test_the_server_app_serves_the_tools_at_mcp(live_server: LiveServer) -> None:
    with httpx.Client(base_url=live_server.url, timeout=60) as http:
        corpus = ingest_corpus(http)
    async with http_client(live_server.url, None) as client:
        found = structured(
            await client.call_tool("search", {"question": "What is the capital of Zorblat?", "top_k": 1})
        )
        answer = structured(
            await client.call_tool("ask", {"question": "What is the capital of Zorblat?", "max_tokens": 2})
        )
        listed = structured(await client.call_tool("list_collections", {}))
    assert [s["document_id"] for s in found["sources"]] == [corpus["Zorblat facts"]]
    assert answer["sources"][0]["document_id"] == corpus["Zorblat facts"] and answer["notice"] is None
    assert [c["name"] for c in listed["collections"]] == ["default"]
    # The app's own guards stand in front of it: a cross-site browser request is refused.
    refused = httpx.post(
        f"{live_server.url}/mcp",
        json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
        headers={"Origin": "https://evil.example", "Accept": "application/json, text/event-stream"},
    )
    assert refused.status_code == 403


# ---- over stdio: `blendrag mcp` relaying to the server ------------------------------------------------------


async def test_stdio_relays_the_tools_with_the_key_of_its_environment(served: Served, tmp_path: Path) -> None:
    log = tmp_path / "stderr.log"
    with log.open("w") as errlog:
        params = stdio_parameters(tmp_path, "--server", served.url, key=served.planets_key)
        async with Client(_stdio(params, errlog)) as client:
            tools = (await client.list_tools()).tools
            listed = structured(await client.call_tool("list_collections", {}))
            found = structured(await client.call_tool("search", {"question": IN_CORPUS, "top_k": 1}))
            refused = error_text(await client.call_tool("search", {"question": IN_CORPUS, "collection": "food"}))
            bad = error_text(await client.call_tool("search", {"question": IN_CORPUS, "top_k": 0}))
            asked = structured(await client.call_tool("ask", {"question": IN_CORPUS, "max_tokens": 2}))
    assert [t.name for t in tools] == TOOL_NAMES
    assert [c["name"] for c in listed["collections"]] == ["planets"]
    assert [s["document_id"] for s in found["sources"]] == [served.documents["planets"]]
    assert refused == "this key may not read collection 'food' (403 Forbidden)"
    assert bad == "invalid arguments: top_k: Input should be greater than or equal to 1"
    assert asked["notice"] is None and asked["sources"][0]["document_id"] == served.documents["planets"]
    assert (
        f"serving the tools of the blendrag server at {served.url} over stdio: "
        "search, ask, list_collections, get_document"
    ) in log.read_text()


async def test_stdio_with_a_refused_key_says_so_on_every_call(served: Served, tmp_path: Path) -> None:
    refusal = f"the blendrag server at {served.url} answered 401: {KEY_REQUIRED}"
    for key in (WRONG_KEY, None):
        log = tmp_path / f"stderr-{key}.log"
        with log.open("w") as errlog:
            async with Client(_stdio(stdio_parameters(tmp_path, "--server", served.url, key=key), errlog)) as client:
                with pytest.raises(MCPError) as listing:
                    await client.list_tools()
                called = error_text(await client.call_tool("search", {"question": IN_CORPUS}))
        assert str(listing.value) == refusal
        assert called == refusal
        assert f"warning: {refusal}; every tool call will say so until it is fixed" in log.read_text()


async def test_stdio_reports_a_server_gone_away_and_refuses_to_start_without_one(
    make_fast_settings, make_fast_services, tmp_path: Path
) -> None:
    settings: Settings = fast_mcp_settings(make_fast_settings)
    with (tmp_path / "stderr.log").open("w") as errlog, ExitStack() as server:
        served = server.enter_context(serve_mcp(settings, make_fast_services(settings)))
        async with Client(_stdio(stdio_parameters(tmp_path, "--server", served.url, key=ADMIN_KEY), errlog)) as client:
            assert [t.name for t in (await client.list_tools()).tools] == TOOL_NAMES
            server.close()  # the server stops; the relay goes on, and says so
            gone = error_text(await client.call_tool("list_collections", {}))
    assert gone == f"cannot reach the blendrag server at {served.url}: All connection attempts failed"
    started = subprocess.run(
        [*blendrag_command(), "mcp", "--server", served.url],
        cwd=tmp_path,
        env=stdio_parameters(tmp_path).env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (started.returncode, started.stdout) == (3, "")
    assert started.stderr == f"error: no blendrag server answers at {served.url} (check --server / BLENDRAG_URL)\n"


def _first_leaf(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc


def _stdio(params: StdioServerParameters, errlog: TextIO) -> Any:
    """The SDK's stdio transport, the server's stderr kept in `errlog`."""
    return stdio_client(params, errlog=errlog)


async def test_bench_capacity_gives_llama_cpp_the_passages_ask_gives(served: Served) -> None:
    """`bench capacity` reads each question's sources through the `search` tool to lay out llama.cpp's prompt."""
    from bench.capacity import search_sources

    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    async with httpx.AsyncClient(base_url=served.url, headers=headers) as http:
        got = await search_sources(http, IN_CORPUS)
    expected = [source["text"] for source in await _sources(served, IN_CORPUS)]
    assert got.texts == expected and len(expected) == 2
