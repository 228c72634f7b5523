"""Fuzz cases of the MCP endpoint, as Schemathesis hunts the HTTP routes (test_api_schemathesis.py; /mcp is not in
the OpenAPI document): generated arguments for every tool, schema-valid and not, called with the SDK's client over
streamable HTTP, and generated JSON-RPC bodies posted to /mcp.

No call may end in a protocol error or an internal error and no HTTP answer may be a 5xx: a result is a tool error
with a message, or structured content, which the SDK's client checks against the tool's output schema itself. On
the fast stand-ins; the same cases every run (`fuzz_settings`; BLENDRAG_FUZZ_RANDOM=1 explores new ones)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from apitools import fuzz_settings
from hypothesis import given
from hypothesis import strategies as st
from mcptools import ADMIN_KEY, IN_CORPUS, Served, fast_mcp_settings, http_client, serve_mcp

_SCALE = float(os.environ.get("BLENDRAG_SCHEMATHESIS_SCALE", "1"))
EXAMPLES = max(1, int(50 * _SCALE))
MAX_TOKENS = 2  # a valid max_tokens above it is lowered to it: the fuzz wants seconds, not long answers

JSON_SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=30)
JSON = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)


def _field(plausible: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """A value for an argument: mostly what a client would send (valid or near it), sometimes any JSON."""
    return st.one_of(plausible, plausible, plausible, JSON)


QUESTION = _field(st.sampled_from([IN_CORPUS, "", "   ", "What does sourdough need?"]) | st.text(max_size=120))
COLLECTION = _field(st.sampled_from(["planets", "food", "nope", "../x", "a" * 65]) | st.text(max_size=70))
ARGUMENTS = {
    "search": {"question": QUESTION, "collection": COLLECTION, "top_k": _field(st.integers(-2, 70))},
    "ask": {
        "question": QUESTION,
        "collection": COLLECTION,
        "mode": _field(st.sampled_from(["blend", "full", "prefix", "reuse", "fast", ""])),
        "max_tokens": _field(st.integers(-2, 5000)),
    },
    "list_collections": {},
    "get_document": {"document_id": _field(st.text(max_size=140))},
}


def _arguments(tool: str) -> st.SearchStrategy[dict[str, Any]]:
    """The tool's arguments: its required one with the others maybe, any subset of them, or either with an
    argument it does not take."""
    fields = ARGUMENTS[tool]
    required = [name for name in ("question", "document_id") if name in fields]
    with_required = st.fixed_dictionaries(
        {name: fields[name] for name in required}, optional={k: v for k, v in fields.items() if k not in required}
    )
    known = with_required | st.fixed_dictionaries({}, optional=fields)
    extra = st.dictionaries(st.sampled_from(["colour", "top_k", "question", "document_id"]), JSON, max_size=1)
    return st.one_of(known, known, known, st.tuples(known, extra).map(lambda pair: {**pair[1], **pair[0]}))


def _bounded(tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """Short answers: a valid (or absent) max_tokens above MAX_TOKENS becomes MAX_TOKENS; an invalid one is left
    alone (it is what the case is about, and must be refused)."""
    if tool != "ask":
        return arguments
    value = arguments.get("max_tokens")
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and MAX_TOKENS < value <= 4096):
        return {**arguments, "max_tokens": MAX_TOKENS}
    return arguments


@pytest.fixture
def served(make_fast_settings, make_fast_services) -> Iterator[Served]:
    settings = fast_mcp_settings(make_fast_settings)
    with serve_mcp(settings, make_fast_services(settings)) as s:
        yield s


@pytest.mark.parametrize("tool", list(ARGUMENTS))
def test_generated_arguments_get_a_result_or_a_tool_error_never_a_failure(served: Served, tool: str) -> None:
    from anyio.from_thread import start_blocking_portal

    outcomes: dict[str, int] = {"result": 0, "tool error": 0}
    with (
        start_blocking_portal() as portal,
        portal.wrap_async_context_manager(http_client(served.url, served.planets_key)) as client,
    ):

        @given(arguments=_arguments(tool))
        @fuzz_settings(EXAMPLES)
        def call(arguments: dict[str, Any]) -> None:
            result = portal.call(client.call_tool, tool, _bounded(tool, arguments))  # a protocol error raises
            if result.is_error:
                text = result.content[0].text if result.content else ""
                assert text and not text.startswith("internal error"), (arguments, text)
                outcomes["tool error"] += 1
            else:
                assert isinstance(result.structured_content, dict), (arguments, result)
                outcomes["result"] += 1

        call()
    # Both kinds were generated: the hunt reached the tools themselves, not only their argument checks.
    assert outcomes["tool error"] > 0
    assert outcomes["result"] > 0 or tool == "get_document"


METHODS = ["tools/call", "tools/list", "initialize", "server/discover", "ping", "notifications/initialized", "nope"]
ENVELOPE = st.fixed_dictionaries(
    {"jsonrpc": st.sampled_from(["2.0", "1.0"]), "method": st.sampled_from(METHODS) | st.text(max_size=20)},
    optional={"id": st.integers() | st.text(max_size=5) | st.none(), "params": JSON},
)
BODY = st.one_of(ENVELOPE.map(json.dumps), JSON.map(json.dumps), st.binary(max_size=60).map(repr))
PROTOCOL_VERSION = st.sampled_from([None, "2025-06-18", "2025-11-25", "2026-07-28", "1999-01-01", "x"])


def test_generated_json_rpc_bodies_never_get_a_server_error(served: Served) -> None:
    statuses: set[int] = set()
    with httpx.Client(base_url=served.url, timeout=60) as http:

        @given(body=BODY, version=PROTOCOL_VERSION)
        @fuzz_settings(EXAMPLES * 3)
        def post(body: str, version: str | None) -> None:
            headers = {
                "Authorization": f"Bearer {ADMIN_KEY}",
                "Accept": "application/json, text/event-stream",
                "Content-Type": "application/json",
            }
            if version is not None:
                headers["MCP-Protocol-Version"] = version
            response = http.post("/mcp", content=body.encode(), headers=headers)
            assert response.status_code < 500, (body, version, response.status_code, response.text[:300])
            statuses.add(response.status_code)

        post()
    assert 200 in statuses and any(400 <= s < 500 for s in statuses), statuses
