"""The FastAPI application: `create_app(settings)` wires routers to the services built at start-up."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from app.api import (
    admin,
    ask,
    collections,
    conversations,
    documents,
    health,
    index_status,
    keys,
    openai_compat,
    render,
    syncs,
)
from app.api.body_limit import BodySizeLimitMiddleware
from app.api.cross_site import CrossSiteGuardMiddleware
from app.api.errors import install_error_handlers
from app.api.mcp import mount_mcp
from app.api.security_headers import SecurityHeadersMiddleware
from app.datadir_lock import DataDirBusy, DataDirLock, server_url
from app.metrics import RequestMetricsMiddleware
from app.server_registry import announce, default_runtime_dir, withdraw
from app.settings import Settings
from app.state import AppState
from app.ui import docs_assets_dir, mount_docs, mount_ui

logger = logging.getLogger(__name__)

DESCRIPTION = """\
RAG server that answers from precomputed, blended KV caches (CacheBlend).

* **documents**: ingest text or files as background jobs, follow their progress, list and delete documents.
* **ask**: question → retrieval → blended KV → streamed answer (Server-Sent Events) with sources; send
  the answer's `conversation_id` back to ask a follow-up (earlier turns are reused KV in the prompt).
* **conversations**: your stored conversations, their turns and sources; delete one.
* **openai**: `/v1/chat/completions` and `/v1/models` for OpenAI clients (the whole `messages` history
  counts; sources in an extra field).
* **admin**: KV cache coverage, serving stats and Prometheus `/metrics`.
* **MCP**: the tools `search`, `ask`, `list_collections` and `get_document` for agents, over streamable HTTP at
  `/mcp` (not in this schema; the same keys and collections as these routes).

* **collections**: every document belongs to a collection; the admin key (`server.api_key`) makes collection
  keys (`/admin/keys`) that see only their collections on every route.

When `server.api_key` is set, the documents and admin routes need `Authorization: Bearer <key>`
(or `X-API-Key: <key>`); asking stays open until the first collection key exists (then it needs a key,
or `server.public_collections`). The web UI lives at `/` (chat) and `/admin`.
"""


def create_app(settings: Settings, *, load_in_background: bool = True) -> FastAPI:
    state = AppState(settings=settings)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        # One process owns the data dir; the lock records this server's address for the CLI.
        lock = DataDirLock(settings.data_dir)
        url = server_url(settings.server.host, settings.server.port)
        try:
            lock.acquire("serve", url=url)
        except DataDirBusy as exc:
            logger.error("%s: stop it first or use another data dir", exc)
            raise
        # Listed for `blendrag ask` in another folder, on another port or data dir (app/server_registry.py).
        runtime_dir = settings.runtime_dir or default_runtime_dir()
        announced = announce(runtime_dir, url, settings.data_dir)
        task = asyncio.create_task(state.load())
        if not load_in_background:
            await task
        try:
            async with mcp_endpoint.run():
                yield
        finally:
            try:
                if not task.done():
                    await task
                await state.close()
            finally:
                withdraw(runtime_dir, announced)
                lock.release()  # even when closing failed: the next start must not find the dir taken

    docs_assets = docs_assets_dir()
    # Without local Swagger UI assets, FastAPI's default /docs (CDN-hosted assets) is better than none.
    docs_url, redoc_url = (None, None) if docs_assets is not None else ("/docs", "/redoc")
    app = FastAPI(
        title="blendrag",
        version="0.1.0",
        lifespan=lifespan,
        description=DESCRIPTION,
        docs_url=docs_url,
        redoc_url=redoc_url,
    )
    app.state.blendrag = state
    install_error_handlers(app)
    for router in (
        health.router,
        documents.router,
        ask.router,
        openai_compat.router,
        conversations.router,
        admin.router,
        keys.router,
        collections.router,
        index_status.router,
        render.router,
        syncs.router,
    ):
        app.include_router(router)
    mcp_endpoint = mount_mcp(app, app.version)
    mount_ui(app)
    if docs_assets is not None:
        mount_docs(app, docs_assets)
    if settings.server.cors_origins:
        app.add_middleware(
            CORSMiddleware, allow_origins=settings.server.cors_origins, allow_methods=["*"], allow_headers=["*"]
        )
    # Outside CORS: a cross-site POST/DELETE from an origin not in cors_origins never reaches a route.
    app.add_middleware(CrossSiteGuardMiddleware, allowed_origins=settings.server.cors_origins)
    app.add_middleware(
        BodySizeLimitMiddleware,
        max_body_bytes=settings.server.max_body_bytes,
        max_upload_bytes=settings.server.max_upload_bytes,
    )
    app.add_middleware(RequestMetricsMiddleware, metrics=state.metrics)
    app.add_middleware(SecurityHeadersMiddleware)  # on every answer, a refusal by the layers inside included
    # Outermost: every layer (metrics, cross-site guard, rate limits) sees the client's own address. A
    # peer listed in server.forwarded_allow_ips (a reverse proxy) names the client in X-Forwarded-For;
    # anyone else's X-Forwarded-For is ignored. `blendrag serve` turns uvicorn's own copy of this off.
    # Without a proxy configured no forwarded header is trusted: a default that trusted 127.0.0.1 made every
    # local client "the proxy", free to name any address and so beat the per-address limits.
    if settings.server.forwarded_allow_ips.strip():
        app.add_middleware(ProxyHeadersMiddleware, trusted_hosts=settings.server.forwarded_allow_ips)
    return app
