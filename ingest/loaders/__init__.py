"""Turn files (or bytes, or plain text) into `LoadedDocument`s; one failing file never stops a batch.

`load_bytes` is the core (uploads arrive as bytes); `load_path` reads a file; `iter_load` walks files and
folders and yields one `LoadResult` per file, success or typed `LoaderError`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePath

from ingest.config import KNOWN_EXTENSIONS, IngestSettings
from ingest.errors import (
    DocumentTooLarge,
    EmptyDocument,
    Interrupted,
    LoaderError,
    UnreadableDocument,
    UnsupportedFormat,
)
from ingest.loaders.html import parse_html
from ingest.loaders.pdf import parse_pdf
from ingest.loaders.records import Record, iter_records
from ingest.loaders.text import decode_text, parse_markdown, parse_text
from ingest.loaders.word import parse_docx
from ingest.normalize import normalize_text
from ingest.types import LoadedDocument, MetadataValue, Section

__all__ = [
    "LoadResult",
    "MIME_TYPES",
    "detect_format",
    "iter_documents",
    "iter_load",
    "iter_paths",
    "load_bytes",
    "load_path",
    "load_text",
]

logger = logging.getLogger(__name__)

MIME_TYPES: dict[str, str] = {
    "txt": "text/plain",
    "md": "text/markdown",
    "html": "text/html",
    "pdf": "application/pdf",
    "docx": "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
    "json": "application/json",
    "jsonl": "application/x-ndjson",
}
_HINTS = {
    "doc": "legacy Word files are not supported; save as .docx",
    "rtf": "save it as .docx or .txt",
    "odt": "save it as .docx",
}
_MAX_DERIVED_TITLE_CHARS = 80
TABLE_BLOCK_MARGIN = 16  # tokens of a chunk a table block leaves free (the separator the chunker appends)

Check = Callable[[], None]  # called between steps of a parse; raises (e.g. Interrupted) to stop it


@dataclass(frozen=True)
class LoadResult:
    """Outcome for one input file: its documents (JSON files may hold many), or the error."""

    path: Path
    documents: list[LoadedDocument] = field(default_factory=list)
    error: LoaderError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def detect_format(filename: str | PurePath, settings: IngestSettings | None = None) -> str:
    """Loader format for a file name, checked against the allowed extensions; raises UnsupportedFormat."""
    settings = settings or IngestSettings()
    name = PurePath(filename).name
    extension = PurePath(name).suffix.lower().lstrip(".")
    if not extension:
        raise UnsupportedFormat(
            f"file has no extension; supported: {', '.join(settings.allowed_extensions)}", str(filename)
        )
    if extension not in KNOWN_EXTENSIONS:
        hint = _HINTS.get(extension, f"supported: {', '.join(settings.allowed_extensions)}")
        raise UnsupportedFormat(f"unsupported file type .{extension} ({hint})", str(filename))
    if extension not in settings.allowed_extensions:
        raise UnsupportedFormat(f"file type .{extension} is disabled by configuration", str(filename))
    return KNOWN_EXTENSIONS[extension]


def _derived_title(text: str) -> str:
    first_line = text.strip().split("\n", 1)[0].strip()
    if len(first_line) <= _MAX_DERIVED_TITLE_CHARS:
        return first_line
    return first_line[: _MAX_DERIVED_TITLE_CHARS - 1].rstrip() + "…"


def load_text(
    text: str,
    title: str | None = None,
    *,
    source_path: str | None = None,
    metadata: dict[str, MetadataValue] | None = None,
) -> LoadedDocument:
    """A document from text given directly (API / UI paste). Without a title, its first line is used."""
    normalized = normalize_text(text)
    if not normalized:
        raise EmptyDocument("text is empty", source_path)
    return LoadedDocument(
        title=(title or "").strip() or _derived_title(normalized),
        source_path=source_path,
        format="txt",
        mime_type=MIME_TYPES["txt"],
        sections=[Section(normalized)],
        metadata=dict(metadata or {}),
    )


def _single(
    fmt: str,
    title: str | None,
    fallback_title: str,
    sections: list[Section],
    source: str | None,
    metadata: dict[str, MetadataValue],
    max_chars: int,
) -> list[LoadedDocument]:
    sections = [section for section in sections if section.text]
    if not sections:
        raise EmptyDocument("document contains no text", source)
    if sum(len(section.text) for section in sections) > max_chars:
        raise DocumentTooLarge.text_over_cap(max_chars, source)
    return [
        LoadedDocument(
            title=title or fallback_title,
            source_path=source,
            format=fmt,
            mime_type=MIME_TYPES[fmt],
            sections=sections,
            metadata=metadata,
        )
    ]


def _parse(
    data: bytes, fmt: str, filename: str, source: str | None, settings: IngestSettings, check: Check | None
) -> list[LoadedDocument]:
    # A file without a title of its own (no H1, no <title>, no front matter) is titled by its file name,
    # extension included: "nav.html" says what it is, "nav" looks like a heading it does not have.
    name = PurePath(filename).name
    stem = PurePath(filename).stem or name
    max_chars = settings.max_document_chars
    if fmt == "txt":
        return _single(fmt, None, name, [Section(parse_text(data, source))], source, {}, max_chars)
    if fmt == "md":
        title, text, metadata = parse_markdown(data, source, settings.md_strip_front_matter)
        return _single(fmt, title, name, [Section(text)], source, metadata, max_chars)
    if fmt == "html":
        title, text, metadata = parse_html(data)
        return _single(fmt, title, name, [Section(text)], source, metadata, max_chars)
    if fmt == "pdf":
        # A table block's characters (header included), no more than a chunk's tokens past its overlap: a block
        # fits one chunk even when every character is a token, so every chunk of a table holds its header row.
        block_chars = max(settings.chunk_tokens - settings.chunk_overlap - TABLE_BLOCK_MARGIN, 64)
        title, sections, metadata = parse_pdf(
            data, source, tables=settings.pdf_tables, ocr=settings.pdf_ocr, table_block_chars=block_chars
        )
        return _single(fmt, title, name, sections, source, metadata, max_chars)
    if fmt == "docx":
        title, text, metadata = parse_docx(
            data,
            source,
            max_unpacked_bytes=settings.max_unpacked_bytes,
            max_chars=max_chars,
            check=check,
            max_seconds=settings.max_parse_seconds,
        )
        return _single(fmt, title, name, [Section(text)], source, metadata, max_chars)
    if fmt in ("json", "jsonl"):
        return list(_iter_record_documents(data, fmt, stem, source, settings))
    raise UnsupportedFormat(f"no loader for format {fmt!r}", source)


def _iter_record_documents(
    data: bytes, fmt: str, stem: str, source: str | None, settings: IngestSettings
) -> Iterator[LoadedDocument]:
    records = iter_records(
        decode_text(data, source),
        source,
        lines=fmt == "jsonl",
        text_field=settings.json_text_field,
        title_field=settings.json_title_field,
        max_records=settings.max_records_per_file,
    )
    for record in records:
        if len(record.text) > settings.max_document_chars:
            raise DocumentTooLarge.text_over_cap(settings.max_document_chars, source)
        yield _record_document(record, fmt, stem, source)


def _record_document(record: Record, fmt: str, stem: str, source: str | None) -> LoadedDocument:
    return LoadedDocument(
        title=record.title or f"{stem} #{record.index + 1}",
        source_path=source,
        format=fmt,
        mime_type=MIME_TYPES[fmt],
        sections=[Section(record.text)],
        metadata=record.metadata,
    )


def load_bytes(
    data: bytes,
    filename: str,
    settings: IngestSettings | None = None,
    *,
    source_path: str | None = None,
    check: Check | None = None,
) -> list[LoadedDocument]:
    """Parse an uploaded file's bytes; the format comes from `filename`'s extension.

    Returns one document, or one per record for JSON/JSONL. Raises a `LoaderError` subclass; any
    unexpected parser crash is reported as `UnreadableDocument` (and logged with its traceback).
    `check` is called between steps of parsers that have many (DOCX blocks); what it raises passes through.
    """
    settings = settings or IngestSettings()
    source = source_path if source_path is not None else filename
    fmt = detect_format(filename, settings)
    if len(data) > settings.max_file_bytes:
        raise DocumentTooLarge(f"file is {len(data)} bytes; the limit is {settings.max_file_bytes}", source)
    if not data.strip():
        raise EmptyDocument("file is empty", source)
    try:
        return _parse(data, fmt, filename, source, settings, check)
    except (LoaderError, Interrupted):
        raise
    except (MemoryError, KeyboardInterrupt):
        raise
    except Exception as exc:
        # Third-party parsers fail in many undocumented ways on malformed input; one bad file must
        # surface as a per-file error, never abort an ingest job.
        logger.exception("unexpected %s while parsing %s", type(exc).__name__, source)
        raise UnreadableDocument(f"parser failed: {type(exc).__name__}: {exc}", source) from exc


def load_path(
    path: str | Path, settings: IngestSettings | None = None, check: Check | None = None
) -> list[LoadedDocument]:
    """Parse one file. Raises a `LoaderError` subclass with `path` set."""
    settings = settings or IngestSettings()
    path = Path(path)
    detect_format(path.name, settings)  # refuse unsupported types before touching the disk
    return load_bytes(_read_file(path, settings), path.name, settings, source_path=str(path), check=check)


def _read_file(path: Path, settings: IngestSettings) -> bytes:
    source = str(path)
    try:
        size = path.stat().st_size
        if not path.is_file():
            raise UnreadableDocument("not a regular file", source)
        if size > settings.max_file_bytes:
            raise DocumentTooLarge(f"file is {size} bytes; the limit is {settings.max_file_bytes}", source)
        return path.read_bytes()
    except FileNotFoundError as exc:
        raise UnreadableDocument("no such file", source) from exc
    except PermissionError as exc:
        raise UnreadableDocument("permission denied", source) from exc
    except OSError as exc:
        raise UnreadableDocument(f"cannot read file: {exc.strerror or exc}", source) from exc


def iter_documents(
    path: str | Path, settings: IngestSettings | None = None, check: Check | None = None
) -> Iterator[LoadedDocument]:
    """Like `load_path`, but a JSON / JSONL file's records come one at a time as they are parsed (a
    caller can report progress per record and stop early). Raises `LoaderError` subclasses, possibly
    after some documents were yielded (a bad record, or more than `max_records_per_file`)."""
    settings = settings or IngestSettings()
    path = Path(path)
    fmt = detect_format(path.name, settings)
    if fmt not in ("json", "jsonl"):
        yield from load_path(path, settings, check)
        return
    source = str(path)
    data = _read_file(path, settings)
    if not data.strip():
        raise EmptyDocument("file is empty", source)
    stem = PurePath(path.name).stem or path.name
    try:
        yield from _iter_record_documents(data, fmt, stem, source, settings)
    except (LoaderError, Interrupted):
        raise
    except (MemoryError, KeyboardInterrupt, GeneratorExit):
        raise
    except Exception as exc:
        logger.exception("unexpected %s while parsing %s", type(exc).__name__, source)
        raise UnreadableDocument(f"parser failed: {type(exc).__name__}: {exc}", source) from exc


def _is_hidden(name: str) -> bool:
    return name.startswith(".")


@dataclass(frozen=True)
class FoundFiles:
    """What `find_files` found under the paths a user named."""

    paths: list[Path]  # the files to ingest, in order
    names: list[str]  # each file's name as shown: its path relative to the folder named (POSIX), or its name
    skipped: list[str]  # files inside named folders left out because their type is not ingestible


def find_files(paths: Iterable[str | Path], extensions: Collection[str] | None) -> FoundFiles:
    """The files of `iter_paths` with each one's relative name, and the files of named folders that were
    skipped for their type (so the CLI can say "skipped 12 files: unsupported type …" instead of nothing).
    `extensions` None keeps every file."""
    found = FoundFiles(paths=[], names=[], skipped=[])
    seen: set[Path] = set()
    for raw in paths:
        root = Path(raw)
        if not root.is_dir():
            candidates = [(root, root.name)]
        else:
            candidates = []
            for file_path in _walk(root):
                name = file_path.relative_to(root).as_posix()
                if extensions is None or file_path.suffix.lower().lstrip(".") in extensions:
                    candidates.append((file_path, name))
                else:
                    found.skipped.append(name)
        for file_path, name in candidates:
            key = file_path.resolve()
            if key not in seen:
                seen.add(key)
                found.paths.append(file_path)
                found.names.append(name)
    return found


def _walk(root: Path) -> list[Path]:
    """Every non-hidden file under `root` (hidden folders skipped, symlinked folders not followed), sorted."""
    found: list[Path] = []
    for directory, subdirectories, filenames in os.walk(root):
        subdirectories[:] = [name for name in subdirectories if not _is_hidden(name)]
        found.extend(Path(directory, name) for name in filenames if not _is_hidden(name))
    return sorted(found, key=lambda item: item.relative_to(root).parts)


def iter_paths(paths: Iterable[str | Path], extensions: Collection[str] | None = None) -> Iterator[Path]:
    """Files named directly, plus the files under named folders (recursive, sorted, hidden skipped).

    `extensions` (lower case, no dot) filters only what folder expansion finds: a file the user named
    explicitly is always yielded so that an unsupported type is reported rather than ignored.
    Each file is yielded once even if reachable twice; symlinked folders are not followed.
    """
    yield from find_files(paths, extensions).paths


def iter_load(paths: Iterable[str | Path], settings: IngestSettings | None = None) -> Iterator[LoadResult]:
    """Load every file of `iter_paths(paths)`; folder expansion keeps only allowed extensions."""
    settings = settings or IngestSettings()
    for path in iter_paths(paths, extensions=settings.allowed_extensions):
        try:
            yield LoadResult(path=path, documents=load_path(path, settings))
        except LoaderError as exc:
            logger.info("skipping %s: %s", path, exc.message)
            yield LoadResult(path=path, error=exc)
