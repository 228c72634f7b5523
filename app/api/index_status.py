"""GET /api/index: what this replica's in-memory index holds and how far it has followed the catalog.

On a scale-out deployment every replica should report the same `chunks` within a second or so; a
replica whose `change_log_position` stays behind the others is not receiving the catalog's changes.
"""

from __future__ import annotations

from typing import Literal

from fastapi import Depends
from pydantic import BaseModel, Field

from app.api.deps import _loaded, guarded_router, require_admin
from app.api.schemas.common import API_KEY_REQUIRED, MODELS_LOADING
from app.build import Services

get_services = _loaded(lambda s: s)  # 503 until start-up has built them

router = guarded_router("admin", require_admin, {401: API_KEY_REQUIRED, 503: MODELS_LOADING})


class IndexStatusOut(BaseModel):
    chunks: int = Field(description="Chunks in this replica's vector index")
    source: Literal["snapshot", "catalog"] = Field(
        description="snapshot: the index file under the data dir (SQLite); catalog: built from and kept "
        "current with the PostgreSQL catalog"
    )
    change_log_position: int | None = Field(description="Last catalog index event applied (catalog only)")


@router.get("/api/index", response_model=IndexStatusOut)
def index_status(services: Services = Depends(get_services)) -> IndexStatusOut:
    retriever = services.retriever
    assert retriever is not None  # the server builds every part
    sync = getattr(retriever, "sync", None)
    return IndexStatusOut(
        chunks=retriever.count,
        source="catalog" if sync is not None else "snapshot",
        change_log_position=sync.cursor if sync is not None else None,
    )
