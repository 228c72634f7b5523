"""The FastAPI application: `create_app(settings)` wires routers to the services built at start-up."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from app.api import ask, documents, health
from app.settings import Settings
from app.state import AppState

logger = logging.getLogger(__name__)


def create_app(settings: Settings, *, load_in_background: bool = True) -> FastAPI:
    state = AppState(settings=settings)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        task = asyncio.create_task(state.load())
        if not load_in_background:
            await task
        try:
            yield
        finally:
            if not task.done():
                await task
            await state.close()

    app = FastAPI(title="blendrag", version="0.1.0", lifespan=lifespan,
                  description="RAG server that answers from precomputed, blended KV caches (CacheBlend).")
    app.state.blendrag = state
    app.include_router(health.router)
    app.include_router(documents.router)
    app.include_router(ask.router)
    return app
