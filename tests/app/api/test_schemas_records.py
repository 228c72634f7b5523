"""Out models read from the catalog's records (`Model.model_validate(record)`): the wire body is what the
hand-written mappers produced, field for field."""

from __future__ import annotations

from datetime import UTC, datetime

from app.api.schemas import ChunkOut, ConversationOut, DocumentOut, JobOut, KeyOut, StatsOut, TurnOut
from app.catalog.conversations import ConversationRecord, TurnRecord
from app.catalog.keys import KeyRecord
from app.catalog.models import DocumentStatus, JobStatus
from app.catalog.records import ChunkRecord, DocumentRecord, JobRecord
from app.metrics import RecentAsk
from app.services.conversation_service import TurnSource, TurnView
from app.services.document_service import ChunkView

AT = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
NAIVE = datetime(2026, 1, 2, 3, 4, 5)  # SQLite hands datetimes back without a zone


def test_document_out_renames_source_and_writes_isoformat_times() -> None:
    record = DocumentRecord(
        id="d1",
        title="T",
        source_path="notes/a.md",
        content_hash="h",
        status=DocumentStatus.READY,
        error=None,
        tags=["x"],
        metadata={"k": [1, 2]},
        num_chunks=3,
        num_tokens=40,
        job_id="j1",
        created_at=AT,
        updated_at=NAIVE,
        collection="docs",
    )
    assert DocumentOut.model_validate(record).model_dump() == {
        "id": "d1",
        "title": "T",
        "status": "ready",
        "error": None,
        "source": "notes/a.md",
        "tags": ["x"],
        "metadata": {"k": [1, 2]},
        "num_chunks": 3,
        "num_tokens": 40,
        "job_id": "j1",
        "collection": "docs",
        "created_at": "2026-01-02T03:04:05.678901+00:00",
        "updated_at": "2026-01-02T03:04:05",
    }


def test_job_out_names_its_id_job_id() -> None:
    record = JobRecord(
        id="j1",
        status=JobStatus.RUNNING,
        stage="kv",
        progress={"kv": {"done": 1, "total": 2, "bytes": 10}},
        errors=[{"source": "a", "error": "e", "code": "c"}],
        spec={"sources": []},
        document_ids=["d1"],
        duplicate_ids=[],
        cancel_requested=True,
        created_at=AT,
        updated_at=AT,
        collection="docs",
    )
    body = JobOut.model_validate(record).model_dump()
    assert body["job_id"] == "j1" and "id" not in body and "spec" not in body
    assert (body["status"], body["stage"], body["cancel_requested"]) == ("running", "kv", True)
    assert body["progress"] == {"kv": {"done": 1, "total": 2, "bytes": 10}}  # extra progress fields stay


def test_chunk_out_reads_the_record_and_the_kv_state() -> None:
    record = ChunkRecord(
        id=7, document_id="d1", index=2, text="abc", token_ids=[5, 6, 7], page=4, kv_key="k", char_start=1, char_end=4
    )
    assert ChunkOut.model_validate(ChunkView(record, "stale")).model_dump() == {
        "id": 7,
        "index": 2,
        "page": 4,
        "num_tokens": 3,
        "char_start": 1,
        "char_end": 4,
        "text": "abc",
        "kv_state": "stale",
    }


def test_key_out_never_carries_the_hash() -> None:
    record = KeyRecord("k1", "ci", "deadbeef", ("a", "b"), True, AT, None)
    assert KeyOut.model_validate(record).model_dump() == {
        "key_id": "k1",
        "name": "ci",
        "collections": ["a", "b"],
        "can_ingest": True,
        "created_at": "2026-01-02T03:04:05.678901+00:00",
        "last_used_at": None,
    }


def test_conversation_and_turn_out() -> None:
    conversation = ConversationRecord("c1", "owner", "Why?", 1, frozenset({"a"}), AT, AT)
    assert ConversationOut.model_validate(conversation).model_dump() == {
        "id": "c1",
        "title": "Why?",
        "num_turns": 1,
        "created_at": "2026-01-02T03:04:05.678901+00:00",
        "updated_at": "2026-01-02T03:04:05.678901+00:00",
    }
    turn = TurnRecord(
        question="Why?",
        answer="Because.",
        source_chunk_ids=[7],
        mode="blend",
        selector="query",
        recompute_ratio=0.15,
        timings={"ttft_ms": 1.5},
        usage={"prompt_tokens": 9},
        index=0,
        created_at=NAIVE,
    )
    view = TurnView(turn, [TurnSource(rank=1, chunk_id=7, document_id="d1", title="T", page=None)])
    assert TurnOut.model_validate(view).model_dump() == {
        "index": 0,
        "question": "Why?",
        "answer": "Because.",
        "sources": [{"rank": 1, "chunk_id": 7, "document_id": "d1", "title": "T", "page": None}],
        "mode": "blend",
        "selector": "query",
        "recompute_ratio": 0.15,
        "timings": {"ttft_ms": 1.5},
        "usage": {"prompt_tokens": 9},
        "created_at": "2026-01-02T03:04:05",
    }


def test_stats_lists_the_metrics_record_itself() -> None:
    field = StatsOut.model_fields["recent"]
    assert field.annotation == list[RecentAsk]  # one type: no copy of RecentAsk in the API
    schema = StatsOut.model_json_schema(mode="serialization")["$defs"]["RecentAsk"]
    assert "num_context_tokens" in schema["required"]
    assert schema["properties"]["num_context_tokens"]["description"].startswith("Context tokens in the prompt")
