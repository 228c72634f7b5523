"""Parsing documents into text and cutting it into token-exact chunks. Pure functions: no DB, no app."""

from ingest.chunker import (
    CHUNK_SEPARATOR,
    Chunk,
    Chunker,
    TokenizerLike,
    chunk_document,
    encode_chunk_text,
    encode_text,
)
from ingest.config import KNOWN_EXTENSIONS, IngestSettings
from ingest.errors import (
    DocumentTooLarge,
    EmptyDocument,
    EncryptedDocument,
    LoaderError,
    UnreadableDocument,
    UnsupportedFormat,
)
from ingest.loaders import LoadResult, detect_format, iter_load, iter_paths, load_bytes, load_path, load_text
from ingest.normalize import content_hash, normalize_text
from ingest.types import LoadedDocument, Section

__all__ = [
    "CHUNK_SEPARATOR",
    "KNOWN_EXTENSIONS",
    "Chunk",
    "Chunker",
    "DocumentTooLarge",
    "EmptyDocument",
    "EncryptedDocument",
    "IngestSettings",
    "LoadResult",
    "LoadedDocument",
    "LoaderError",
    "Section",
    "TokenizerLike",
    "UnreadableDocument",
    "UnsupportedFormat",
    "chunk_document",
    "content_hash",
    "detect_format",
    "encode_chunk_text",
    "encode_text",
    "iter_load",
    "iter_paths",
    "load_bytes",
    "load_path",
    "load_text",
    "normalize_text",
]
