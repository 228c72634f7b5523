"""The MCP endpoint: the tools of app/api/mcp_tools.py over streamable HTTP at `/mcp`, in the same app.

Stateless (no `Mcp-Session-Id`): every POST carries its own key and is served on its own, so any replica
behind a load balancer can answer it and nothing per client is kept between calls. The key is checked twice,
with the HTTP routes' own dependencies (app/api/deps.py): once per HTTP request, where a wrong key (or no key
where no tool would serve the caller) is a 401 before the MCP layer reads the body, as on every route; then
per tool call, with the rules of the HTTP route the tool mirrors (app/api/mcp_tools.py).

The app's own middleware guards the endpoint like any route (cross-site requests, body size, metrics,
security headers), so the SDK's DNS-rebinding check, which accepts only localhost's names, is left off: it
would refuse a server reached by its host name or through a proxy.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import mcp.types as types
from fastapi import FastAPI, HTTPException
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from app.api.deps import NOT_READY_RETRY_S, presented_key, question_access, require_reader
from app.api.errors import retry_after
from app.api.mcp_tools import TOOLS, call_tool, tool_error

logger = logging.getLogger(__name__)

MCP_PATH = "/mcp"
SERVER_NAME = "blendrag"
INSTRUCTIONS = (
    "blendrag answers questions from a library of documents. `search` finds the passages that match a question "
    "(cheap: no generation); `ask` answers it from them with citations; `list_collections` shows what the key "
    "may read; `get_document` reads one document whole. Only the collections of the caller's key are searched."
)


def build_server(version: str) -> Server[Any]:
    """The MCP server of the tools: their list, and each call answered for the caller of its HTTP request."""

    async def list_tools(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[spec.tool() for spec in TOOLS.values()])

    async def call(ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams) -> types.CallToolResult:
        request = ctx.request
        if not isinstance(request, Request):  # only this module's HTTP endpoint serves the tools
            return tool_error("the tools are served over HTTP only")
        return await call_tool(request, params.name, params.arguments)

    def input_schema(name: str) -> dict[str, Any] | None:
        spec = TOOLS.get(name)
        return spec.args.model_json_schema() if spec is not None else None

    return Server(
        SERVER_NAME,
        version=version,
        instructions=INSTRUCTIONS,
        get_tool_input_schema=input_schema,
        on_list_tools=list_tools,
        on_call_tool=call,
    )


def _check_caller(request: Request) -> None:
    """401 (429 past the wrong-key budget, 503 before the catalog is open) for a caller no tool would serve:
    a wrong key, or no key where neither the question tools (`question_access`) nor the library tools
    (`require_reader`) take a caller without one."""
    try:
        question_access(request)
    except HTTPException as exc:
        if exc.status_code != 401 or presented_key(request) is not None:
            raise
        require_reader(request)


class McpEndpoint:
    """The ASGI app at /mcp: the caller checked, then the SDK's streamable HTTP transport. `run()` (in the
    app's lifespan) starts a fresh session manager each time, so an app may be started more than once."""

    def __init__(self, version: str) -> None:
        self._server = build_server(version)
        self._manager: StreamableHTTPSessionManager | None = None

    @asynccontextmanager
    async def run(self) -> AsyncIterator[None]:
        manager = StreamableHTTPSessionManager(
            app=self._server,
            stateless=True,
            security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        )
        async with manager.run():
            self._manager = manager
            try:
                yield
            finally:
                self._manager = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        manager = self._manager
        try:
            if manager is None:
                raise HTTPException(
                    503,
                    "the MCP endpoint is not running (the server is starting or stopping)",
                    headers=retry_after(NOT_READY_RETRY_S),
                )
            _check_caller(request)
        except HTTPException as exc:
            response = JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)
            await response(scope, receive, send)
            return
        await manager.handle_request(scope, receive, send)


def mount_mcp(app: FastAPI, version: str) -> McpEndpoint:
    """Serve the MCP tools at /mcp of `app` (the exact path: no redirect to /mcp/). Enter the returned
    endpoint's `run()` in the app's lifespan."""
    endpoint = McpEndpoint(version)
    app.router.routes.append(Route(MCP_PATH, endpoint=endpoint, methods=["GET", "POST", "DELETE"]))
    return endpoint
