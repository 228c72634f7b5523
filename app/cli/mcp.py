"""`blendrag mcp`: the server's MCP tools over stdio, for MCP clients that start their servers as commands.

It relays: each `tools/list` and `tools/call` it reads on stdin is sent to the running server's `/mcp`
(streamable HTTP, with the key as a bearer token: `--api-key` / `BLENDRAG_API_KEY`, else `server.api_key`),
and the server's answer is written back on stdout as it came. The server it talks to is found as
`blendrag ask` finds one (`--server` / `BLENDRAG_URL`, the data dir's owner, an announced server), but it
never works on the data dir itself:

- the tools, their arguments and their key rules exist once, in the server (app/api/mcp_tools.py), so stdio
  and HTTP cannot drift apart and a collection key sees the same over both;
- an MCP client keeps its stdio servers running for its whole session: a process that held the data dir would
  keep `blendrag serve` (and every command sent to it) out for as long, and would load a second copy of the
  model and the embedder beside the server's;
- a call costs the round trip to a local server; a server restarted meanwhile is reached again on the next
  call (the endpoint is stateless: each call opens its own connection).

A key the server refuses, or a server that cannot be reached, is a tool error naming the server and its
answer (a `tools/list` error before any call); the process keeps serving, so a restarted server or a fixed key
works without restarting the client.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

from app.cli.common import add_client, add_data_dir, client_key, settings_of, take_data_dir

if TYPE_CHECKING:
    import httpx2
    import mcp.types as types
    from mcp import Client

logger = logging.getLogger(__name__)

MCP_PATH = "/mcp"  # where the server serves its tools (app/api/mcp.py; the CLI never imports app.api)
TIMEOUT_S = 30.0  # to connect and to send; an answer may take as long as the server takes (read: no limit)
CHECK_S = 10.0  # the start-up check of the server and the key


class RemoteRefused(RuntimeError):
    """The server refused the call (a wrong or missing key …) or could not be reached: the message says which."""


def _first_leaf(exc: BaseException) -> BaseException:
    """The first exception inside (nested) exception groups: the SDK's task groups wrap what went wrong."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


class RemoteTools:
    """The MCP tools of the blendrag server at `url`, one connection per request."""

    def __init__(self, url: str, api_key: str | None) -> None:
        self.url = url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    @asynccontextmanager
    async def _client(self) -> AsyncIterator[Client]:
        import httpx2
        from mcp import Client
        from mcp.client.streamable_http import streamable_http_client

        refusals: list[str] = []

        async def note_refusal(response: httpx2.Response) -> None:
            # The SDK reports an HTTP refusal as a bare "error response": keep the server's own reason.
            if response.status_code >= 400:
                await response.aread()
                refusals.append(_refusal(response))

        try:
            async with (
                httpx2.AsyncClient(
                    headers=self._headers,
                    timeout=httpx2.Timeout(TIMEOUT_S, read=None),
                    event_hooks={"response": [note_refusal]},
                ) as http,
                Client(streamable_http_client(self.url + MCP_PATH, http_client=http)) as client,
            ):
                yield client
        except Exception as exc:
            from mcp.shared.exceptions import MCPError

            leaf = _first_leaf(exc)
            if refusals:
                raise RemoteRefused(f"the blendrag server at {self.url} {refusals[-1]}") from exc
            if isinstance(leaf, MCPError):  # it answered, with a protocol error
                raise RemoteRefused(f"the blendrag server at {self.url} answered: {leaf}") from exc
            raise RemoteRefused(f"cannot reach the blendrag server at {self.url}: {leaf}") from exc

    async def list_tools(self) -> types.ListToolsResult:
        async with self._client() as client:
            return await client.list_tools()

    async def call_tool(self, name: str, arguments: dict[str, Any] | None) -> types.CallToolResult:
        async with self._client() as client:
            return await client.call_tool(name, arguments)


def _refusal(response: httpx2.Response) -> str:
    try:
        detail = response.json().get("detail")
    except (ValueError, AttributeError):
        detail = None
    return f"answered {response.status_code}: {detail or response.text[:200]}"


def _version() -> str:
    try:
        return version("blendrag")
    except PackageNotFoundError:
        return "0"


async def serve_stdio(remote: RemoteTools) -> None:
    """Serve the remote tools on stdin/stdout until the client closes stdin."""
    import mcp.types as types
    from mcp.server.context import ServerRequestContext
    from mcp.server.lowlevel import Server
    from mcp.server.stdio import stdio_server
    from mcp.shared.exceptions import MCPError

    async def list_tools(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        try:
            listed = await remote.list_tools()
        except RemoteRefused as exc:
            raise MCPError(types.INTERNAL_ERROR, str(exc)) from exc
        return types.ListToolsResult(tools=listed.tools)

    async def call_tool(
        ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        try:
            return await remote.call_tool(params.name, params.arguments)
        except RemoteRefused as exc:
            return types.CallToolResult(content=[types.TextContent(type="text", text=str(exc))], is_error=True)

    server: Server[Any] = Server("blendrag", version=_version(), on_list_tools=list_tools, on_call_tool=call_tool)
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


async def _check(remote: RemoteTools) -> None:
    """Say on stderr (the client's log of this server) whether the server takes the key, before serving; a
    server slow to answer delays the start by CHECK_S at most."""
    import anyio

    listed = None
    try:
        with anyio.move_on_after(CHECK_S):
            listed = await remote.list_tools()
    except RemoteRefused as exc:
        print(f"warning: {exc}; every tool call will say so until it is fixed", file=sys.stderr)
        return
    if listed is None:
        print(f"warning: the blendrag server at {remote.url} did not list its tools in {CHECK_S:g} s", file=sys.stderr)
        return
    print(
        f"serving the tools of the blendrag server at {remote.url} over stdio: "
        + ", ".join(t.name for t in listed.tools),
        file=sys.stderr,
    )


def cmd_mcp(args: argparse.Namespace) -> int:
    import anyio

    settings = settings_of(args)
    # Only stderr: stdout carries the protocol.
    server, _ = take_data_dir(settings, "mcp", "blendrag mcp", remote=True, args=args, local=False)
    assert server is not None
    url = server.url
    server.close()
    remote = RemoteTools(url, client_key(args, settings))

    async def main() -> None:
        await _check(remote)
        await serve_stdio(remote)

    anyio.run(main)
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "mcp",
        help="serve the running server's MCP tools (search, ask, list_collections, get_document) over stdio",
        description="An MCP server on stdin/stdout for clients that start their servers as commands: each tool "
        "call goes to the running blendrag server's /mcp with the key (--api-key, $BLENDRAG_API_KEY), which "
        "decides what the key may see. HTTP clients can use http://HOST:PORT/mcp directly.",
    )
    add_data_dir(p)
    add_client(p)
    p.set_defaults(func=cmd_mcp)
