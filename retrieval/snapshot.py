"""The retriever's files: snapshot generations under its directory, written atomically.

`write_snapshot` writes a *generation* — `vectors-<gen>.bin`, `chunks-<gen>.jsonl` (metadata and text),
`bm25-<gen>.json` — and only then atomically replaces `MANIFEST.json`, which names the current generation.
A crash at any point leaves the previous snapshot intact and loadable; files of older generations are
deleted after the switch. The chunks file is line-safe: each record is ASCII-only JSON (every other
character escaped), so no line splitter can break a record, and records are read back by splitting at
"\n" only (format 1 wrote raw U+2028 / U+2029 / U+0085, which `str.splitlines` also breaks at; it is
read the same way).
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fsio.atomic import fsync_directory, is_temp_name, write_bytes_atomic
from retrieval.bm25 import BM25Index
from retrieval.index import VectorIndex
from retrieval.types import DEFAULT_COLLECTION, IndexedChunk, IndexMismatchError, RetrievalError

MANIFEST_FILENAME = "MANIFEST.json"
SNAPSHOT_FORMAT = 2
READABLE_FORMATS = (1, 2)  # 1: the same records with raw non-ASCII characters
_GENERATION_FILE = re.compile(r"^(vectors|chunks|bm25)-(\d{6,})\.(bin|jsonl|json)$")
_STALE_TEMP_SECONDS = 3600


@dataclass(frozen=True)
class SnapshotFiles:
    """One generation as bytes, taken under the retriever's lock and written outside it."""

    generation: int
    files: dict[str, tuple[str, bytes]]  # kind (chunks, bm25, vectors) → (file name, contents)
    manifest: dict[str, Any]


@dataclass(frozen=True)
class Snapshot:
    """A generation read back: what the retriever's state is rebuilt from."""

    generation: int
    chunks: list[IndexedChunk]
    bm25: BM25Index
    index: VectorIndex | None


def has_snapshot(directory: Path) -> bool:
    return (directory / MANIFEST_FILENAME).exists()


def encode_snapshot(
    generation: int, chunks: list[IndexedChunk], bm25: BM25Index, index: VectorIndex | None, embedder: str
) -> SnapshotFiles:
    """Generation `generation` of these chunks (in id order), keyword index and vector index."""
    chunk_lines = [
        json.dumps(
            {
                "chunk_id": c.chunk_id,
                "document_id": c.document_id,
                "title": c.title,
                "page": c.page,
                "tags": list(c.tags),
                "collection": c.collection,
                "text": c.text,
            },
            ensure_ascii=True,  # line-safe: no U+2028, U+0085 … a reader could split at
        )
        for c in chunks
    ]
    files = {
        "chunks": (f"chunks-{generation:06d}.jsonl", "\n".join(chunk_lines).encode()),
        "bm25": (f"bm25-{generation:06d}.json", bm25.to_bytes()),
    }
    if index is not None:
        files["vectors"] = (f"vectors-{generation:06d}.bin", index.to_bytes())
    manifest = {
        "format": SNAPSHOT_FORMAT,
        "generation": generation,
        "embedder": embedder,
        "dim": index.dim if index is not None else None,
        "index_type": index.index_type if index is not None else None,
        "count": len(chunks),
        "saved_at": time.time(),
        "files": {kind: name for kind, (name, _) in files.items()},
    }
    return SnapshotFiles(generation, files, manifest)


def write_snapshot(directory: Path, snapshot: SnapshotFiles) -> None:
    """Write the generation's files, then switch the manifest to it (older generations stay until
    `delete_stale_files`)."""
    for name, data in snapshot.files.values():
        write_bytes_atomic(directory / name, data)
    write_bytes_atomic(directory / MANIFEST_FILENAME, json.dumps(snapshot.manifest, indent=1).encode())


def read_snapshot(directory: Path, embedder: str, *, use_gpu: bool) -> Snapshot | None:
    """The current generation (None when there is none).

    Raises IndexMismatchError when it was built with another embedder, RetrievalError when it is of an
    unknown format or its files disagree about which chunks it holds.
    """
    manifest_path = directory / MANIFEST_FILENAME
    if not manifest_path.exists():
        return None
    manifest = json.loads(manifest_path.read_bytes())
    if manifest.get("format") not in READABLE_FORMATS:
        raise RetrievalError(f"unknown retriever snapshot format {manifest.get('format')!r}")
    if manifest["embedder"] != embedder:
        raise IndexMismatchError(
            f"the index in {directory} was built with embedder {manifest['embedder']!r} but the "
            f"settings say {embedder!r}; reindex, or restore the setting"
        )
    files = manifest["files"]
    # Records end at b"\n" only: format 1 files hold raw U+2028 inside strings, which is valid JSON.
    chunks = [chunk_from_json(line) for line in (directory / files["chunks"]).read_bytes().split(b"\n") if line.strip()]
    bm25 = BM25Index.from_bytes((directory / files["bm25"]).read_bytes())
    index: VectorIndex | None = None
    if "vectors" in files:
        index = VectorIndex.from_bytes((directory / files["vectors"]).read_bytes(), use_gpu=use_gpu)
    chunk_ids = {chunk.chunk_id for chunk in chunks}
    index_ids = set(index.ids().tolist()) if index is not None else set()
    if chunk_ids != index_ids or chunk_ids != set(bm25.ids()):
        raise RetrievalError(f"retriever snapshot {manifest['generation']} in {directory} is inconsistent")
    return Snapshot(int(manifest["generation"]), chunks, bm25, index)


def chunk_from_json(line: bytes) -> IndexedChunk:
    record = json.loads(line)
    return IndexedChunk(
        chunk_id=int(record["chunk_id"]),
        document_id=record["document_id"],
        text=record["text"],
        title=record["title"],
        page=record["page"],
        tags=tuple(record["tags"]),
        collection=record.get("collection", DEFAULT_COLLECTION),  # snapshots before collections: default
    )


def delete_stale_files(directory: Path, generation: int) -> None:
    """Files of other generations, and temp files older than an hour (left by a crash mid-write)."""
    now = time.time()
    for path in directory.iterdir():
        match = _GENERATION_FILE.match(path.name)
        stale_generation = match is not None and int(match.group(2)) != generation
        stale_temp = is_temp_name(path.name) and now - path.stat().st_mtime > _STALE_TEMP_SECONDS
        if stale_generation or stale_temp:
            try:
                path.unlink()
            except FileNotFoundError:
                continue
    fsync_directory(directory)
