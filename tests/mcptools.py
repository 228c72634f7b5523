"""Helpers of the MCP tests: the /mcp endpoint served on 127.0.0.1 around the fast services (tiny random Llama,
hash embedder) with two collections and a collection key, and the SDK's own clients over HTTP and stdio."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
from apitools import LiveServer
from fastapi import FastAPI
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from app.api import health
from app.api.errors import install_error_handlers
from app.api.mcp import McpEndpoint, mount_mcp
from app.build import Services, new_ingest
from app.services.ingest import IngestSource
from app.settings import Settings
from app.state import AppState

ADMIN_KEY = "admin-secret"
ZORBLAT = "# Zorblat\n\nQuintaro is the capital of the planet Zorblat. It has purple rivers and a kite festival."
BREAD = "Sourdough needs flour, water, salt and a starter. Bake it at 250 degrees for forty minutes."
# collection -> (title, text)
LIBRARY = {"planets": ("Zorblat facts", ZORBLAT), "food": ("Baking notes", BREAD)}
IN_CORPUS = "What is the capital of Zorblat?"
OUT_OF_CORPUS = "How do I set a connect timeout on an httpx AsyncClient?"
TOOL_NAMES = ["search", "ask", "list_collections", "get_document"]


@dataclass
class Served:
    """A running /mcp endpoint: its URL, the services behind it, the documents by collection and a key that
    reads the `planets` collection only (None on a server without collection keys)."""

    url: str
    services: Services
    documents: dict[str, str]
    planets_key: str | None


def mcp_app(settings: Settings, services: Services) -> FastAPI:
    """An app serving /mcp (app/api/mcp.py, as create_app mounts it) and /health, /ready (what `blendrag mcp`
    probes) around already built services; its lifespan starts the scheduler, as the server's start-up does."""
    endpoint: McpEndpoint

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        assert services.scheduler is not None
        services.scheduler.start()
        state.ready.set()
        try:
            async with endpoint.run():
                yield
        finally:
            await asyncio.to_thread(services.scheduler.stop)

    app = FastAPI(lifespan=lifespan)
    state = AppState(settings=settings, services=services)
    app.state.blendrag = state
    install_error_handlers(app)
    app.include_router(health.router)
    endpoint = mount_mcp(app, "test")
    return app


def library(services: Services) -> dict[str, str]:
    """Ingest LIBRARY, one document per collection; {collection: document id}."""
    ingest = new_ingest(services)
    ids = {}
    for collection, (title, text) in LIBRARY.items():
        submitted = ingest.submit(
            [IngestSource(kind="text", title=title, text=text)], enqueue=False, collection=collection
        )
        assert ingest.run_job(submitted.job_id).status.value == "succeeded"
        ids[collection] = submitted.document_ids[0]
    return ids


def fast_mcp_settings(make_fast_settings: Callable[..., Settings], **server: Any) -> Settings:
    return make_fast_settings(
        server={"api_key": ADMIN_KEY, "ask_rate_per_minute": None, "key_cache_s": 0.0} | server,
        retrieval={"relevance_floor": 0.2},  # OUT_OF_CORPUS is below it, IN_CORPUS above (hash embedder)
    )


@contextmanager
def serve_mcp(settings: Settings, services: Services, *, with_key: bool = True) -> Iterator[Served]:
    documents = library(services)
    key = None
    if with_key:
        assert services.keys is not None
        key = services.keys.create("agent", ["planets"], can_ingest=False).secret
    with LiveServer(mcp_app(settings, services)) as server:
        yield Served(server.url, services, documents, key)


@asynccontextmanager
async def http_client(url: str, key: str | None) -> AsyncIterator[Client]:
    """The SDK's client over streamable HTTP at `url`/mcp, sending `key` as a bearer token."""
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=120)) as http,
        Client(streamable_http_client(f"{url}/mcp", http_client=http)) as client,
    ):
        yield client


def blendrag_command() -> list[str]:
    """`blendrag` as installed beside this interpreter (the console script), else `python -m app.cli`."""
    script = Path(sys.executable).parent / "blendrag"
    return [str(script)] if script.exists() else [sys.executable, "-m", "app.cli"]


def stdio_parameters(cwd: Path, *args: str, key: str | None = None) -> StdioServerParameters:
    """`blendrag mcp ARGS` as an MCP client starts it: the key in BLENDRAG_API_KEY (none: no key at all)."""
    env = {k: v for k, v in os.environ.items() if k not in ("BLENDRAG_API_KEY", "BLENDRAG_URL")}
    env = {k: v for k, v in env.items() if k != "BLENDRAG_SERVER__API_KEY"}
    if key is not None:
        env["BLENDRAG_API_KEY"] = key
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    command, *first = blendrag_command()
    return StdioServerParameters(command=command, args=[*first, "mcp", *args], env=env, cwd=cwd)


def structured(result: Any) -> dict[str, Any]:
    assert not result.is_error, result.content
    assert isinstance(result.structured_content, dict)
    return result.structured_content


def error_text(result: Any) -> str:
    assert result.is_error, result.structured_content
    assert result.structured_content is None and len(result.content) == 1
    return result.content[0].text
