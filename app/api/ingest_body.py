"""The body of POST /ingest read into ingest sources: a JSON body of documents, or a multipart form of
files (stored under the uploads dir as they stream in), inline documents, tags and a collection. Every
problem is an HTTP error with a message, before anything is queued; the key's right to ingest into the
collection is checked before any file is stored."""

from __future__ import annotations

import json
import re
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any

from fastapi import HTTPException, Request
from pydantic import ValidationError
from starlette.datastructures import UploadFile

from app.api.deps import Access
from app.api.schemas import DocumentIn, IngestIn
from app.api.uploads import UploadNameError, check_upload_name, save_upload, upload_source_path
from app.services.ingest import IngestSource
from app.services.key_service import COLLECTION_PATTERN
from app.settings import Settings
from ingest.config import KNOWN_EXTENSIONS

UPLOAD_BLOCK = 1 << 20

# The file names the default `ingest.allowed_extensions` accepts, as the spec's Content-Disposition pattern.
_FILENAME_PATTERN = r'filename="[^"]*\.(' + "|".join(sorted(KNOWN_EXTENSIONS)) + ')"'
_COLLECTION_SCHEMA = {
    "type": ["string", "null"],  # null (in a form: no part) is the default, as IngestIn reads it
    "pattern": COLLECTION_PATTERN,
    "description": "The collection the documents join (null or absent: the key's collection when it has exactly "
    "one, else `default`); the key must be allowed to ingest there",
}


def _without_nullable_any_of(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` with each property pydantic writes `anyOf: [{type: X}, {type: null}]` (an optional field) as
    `type: [X, null]`: the same values, without a disjunction a generator breaks one branch of while the
    other still holds (Schemathesis sent a null `source`, valid, and called it invalid)."""
    properties = {}
    for name, prop in schema.get("properties", {}).items():
        branches = prop.get("anyOf", [])
        others = [b for b in branches if b != {"type": "null"}]
        if len(branches) == 2 and len(others) == 1 and isinstance(others[0].get("type"), str):
            prop = {**{k: v for k, v in prop.items() if k != "anyOf"}, **others[0], "type": [others[0]["type"], "null"]}
        properties[name] = prop
    return {**schema, "properties": properties}


_DOCUMENT_SCHEMA = _without_nullable_any_of(DocumentIn.model_json_schema())
INGEST_OPENAPI = {
    "requestBody": {
        "content": {
            # Inline (DocumentIn has no nested models) so the schema needs no components entry.
            "application/json": {
                "schema": {
                    "type": "object",
                    "required": ["documents"],
                    "additionalProperties": False,
                    "properties": {
                        "documents": {"type": "array", "minItems": 1, "items": _DOCUMENT_SCHEMA},
                        "collection": _COLLECTION_SCHEMA,
                    },
                }
            },
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "minProperties": 1,
                    "properties": {
                        "files": {
                            "type": "array",
                            "minItems": 1,
                            "items": {"type": "string", "format": "binary"},
                            "description": "Files whose names end in .txt, .md, .html, .pdf, .docx, .json or .jsonl "
                            "(by default: `ingest.allowed_extensions`; the part's Content-Disposition `filename`); "
                            "another extension answers 415. The name picks the loader and the job reads the bytes: "
                            "a file that is not what its name says (a PNG named .txt) is accepted (202) and fails "
                            "in its job (`unreadable_document`, GET /ingest/jobs/{id})",
                        },
                        "tags": {
                            "type": ["string", "null"],  # null: no part, no tags
                            "pattern": r"^$|^[^\[{]",
                            "description": "comma-separated tags for every file (plain text: a value starting "
                            "with [ or { is refused; inline documents carry their own `tags` list)",
                        },
                        "collection": _COLLECTION_SCHEMA,
                        "documents": {
                            "type": "array",
                            "minItems": 1,
                            "items": _DOCUMENT_SCHEMA,
                            "description": "inline documents, as in the JSON body: one part holding the JSON "
                            "list (or one part per document, each a JSON object)",
                        },
                    },
                    # At least one of files and documents: not (no files and no documents). A disjunction
                    # (anyOf of the two `required`) reads the same, but a generator that breaks one branch of it
                    # sends a body the other branch still accepts and calls it invalid.
                    "not": {"properties": {"files": False, "documents": False}},
                },
                "encoding": {
                    "files": {
                        "headers": {
                            "Content-Disposition": {
                                "description": "each file part names its file; the extension picks the loader",
                                "schema": {
                                    "type": "string",
                                    "pattern": _FILENAME_PATTERN,
                                    "example": 'form-data; name="files"; filename="notes.txt"',
                                },
                            }
                        }
                    },
                    "documents": {"contentType": "application/json"},
                },
            },
        },
        "required": True,
    },
}


async def ingest_sources(
    request: Request, settings: Settings, access: Access
) -> tuple[list[IngestSource], Path | None, str]:
    """The sources of an ingest request, the directory its files were stored in (None without files) and the
    collection they join."""
    content_type = request.headers.get("content-type", "")
    if content_type.startswith("multipart/form-data"):
        return await _multipart_sources(request, settings, access)
    if content_type.startswith("application/json") or not content_type:
        body = _ingest_body(await request.body())
        collection = body.collection or access.default_collection
        access.check_ingest(collection)
        return [_text_source(d) for d in body.documents], None, collection
    raise HTTPException(415, f"send application/json or multipart/form-data, not {content_type!r}")


def _ingest_body(raw: bytes) -> IngestIn:
    try:
        return IngestIn.model_validate(json.loads(raw or b"null"))
    except ValueError as exc:  # json.JSONDecodeError, UnicodeDecodeError and pydantic's ValidationError all are
        raise HTTPException(422, f"invalid ingest body: {_brief(exc)}") from exc
    except RecursionError as exc:  # json.loads of arrays/objects nested thousands deep
        raise HTTPException(422, "invalid ingest body: JSON nested too deeply") from exc


def _text_source(d: DocumentIn) -> IngestSource:
    return IngestSource(kind="text", title=d.title, text=d.text, tags=d.tags, metadata=d.metadata, source_path=d.source)


def _brief(exc: ValueError) -> str:
    if isinstance(exc, ValidationError):
        return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in exc.errors())
    return str(exc)


async def _multipart_sources(
    request: Request, settings: Settings, access: Access
) -> tuple[list[IngestSource], Path | None, str]:
    """The sources of a multipart form, the directory its files were stored in (None without files) and the
    collection they join (checked against the key before any file is stored)."""
    from ingest.errors import UnsupportedFormat
    from ingest.loaders import detect_format

    form = await request.form()
    try:
        tag_parts = form.getlist("tags")
        if len(tag_parts) > 1 or any(not isinstance(t, str) or t.startswith(("[", "{")) for t in tag_parts):
            raise HTTPException(422, "'tags' is one text field of comma-separated tags (not JSON)")
        tags = [t.strip() for t in str(tag_parts[0] if tag_parts else "").split(",") if t.strip()]
        collection = _form_collection(form.getlist("collection"), access.default_collection)
        access.check_ingest(collection)
        sources: list[IngestSource] = []
        for part in form.getlist("documents"):
            sources.extend(_text_source(d) for d in await _inline_documents(part, settings.server.max_body_bytes))
        uploads = form.getlist("files")
        if any(not isinstance(u, UploadFile) or not u.filename for u in uploads):
            raise HTTPException(422, "each 'files' part must be a file (with a filename)")
        names = []
        for upload in uploads:  # check every name before storing any file
            try:
                names.append(check_upload_name(upload.filename or ""))
                detect_format(names[-1], settings.ingest)
            except UploadNameError as exc:
                raise HTTPException(422, str(exc)) from exc
            except UnsupportedFormat as exc:
                raise HTTPException(415, f"{upload.filename}: {exc.message}") from exc
        batch_dir = settings.uploads_dir / uuid.uuid4().hex if uploads else None
        try:
            seen: dict[str, int] = {}
            for index, (upload, name) in enumerate(zip(uploads, names, strict=True)):
                spooled = await _spool(upload, settings.uploads_dir, settings.ingest.max_file_bytes)
                stored = save_upload(settings.uploads_dir, batch_dir.name, index, name, spooled)  # type: ignore[union-attr]
                # The source is the path the client sent (relative to the folder it ingests: `advanced/x.md`).
                # The second `same.txt` of one request is its own source (re-uploading it replaces it alone).
                relative = upload_source_path(upload.filename or name)
                seen[relative] = seen.get(relative, 0) + 1
                source = relative if seen[relative] == 1 else f"{relative} ({seen[relative]})"
                sources.append(IngestSource(kind="file", title=name, path=str(stored), source_path=source, tags=tags))
        except BaseException:
            if batch_dir is not None:
                shutil.rmtree(batch_dir, ignore_errors=True)
            raise
    finally:
        await form.close()
    if not sources:
        raise HTTPException(
            422, "multipart ingest needs at least one file in the 'files' field (or inline 'documents')"
        )
    return sources, batch_dir, collection


def _form_collection(parts: list[Any], default: str) -> str:
    if not parts:
        return default
    if len(parts) > 1 or not isinstance(parts[0], str) or not re.match(COLLECTION_PATTERN, parts[0]):
        raise HTTPException(
            422,
            "'collection' is one text field: 1-64 letters, digits, '_', '.' or '-', starting with a letter or digit",
        )
    return parts[0]


async def _inline_documents(part: str | UploadFile, max_bytes: int) -> list[DocumentIn]:
    """The documents of one `documents` part: a JSON list of documents, {"documents": [...]}, or one document.
    A part sent as a file is read up to `max_bytes` (`server.max_body_bytes`, as for a JSON body)."""
    if isinstance(part, UploadFile):
        data = await part.read(max_bytes + 1)
        if len(data) > max_bytes:
            raise HTTPException(413, f"a 'documents' part is larger than {max_bytes} bytes (server.max_body_bytes)")
    try:
        raw = json.loads(part if isinstance(part, str) else data.decode("utf-8"))
        if isinstance(raw, dict) and "documents" not in raw:
            raw = [raw]  # one document per part
        return IngestIn.model_validate(raw if isinstance(raw, dict) else {"documents": raw}).documents
    except ValueError as exc:  # not JSON (an empty part included), not UTF-8, or not documents
        raise HTTPException(422, f"invalid 'documents' field: {_brief(exc)}") from exc
    except RecursionError as exc:
        raise HTTPException(422, "invalid 'documents' field: JSON nested too deeply") from exc


async def _spool(upload: UploadFile, directory: Path, max_bytes: int) -> Path:
    """Copy an upload to a temp file next to its final place; 413 past `max_bytes`."""
    directory.mkdir(parents=True, exist_ok=True)
    num_bytes = 0
    tmp = tempfile.NamedTemporaryFile(dir=directory, prefix=".upload-", delete=False)  # noqa: SIM115 - closed below
    path = Path(tmp.name)
    try:
        # The close is inside: on a full disk the buffered tail fails there (that left a 0-byte temp file).
        with tmp:
            while block := await upload.read(UPLOAD_BLOCK):
                num_bytes += len(block)
                if num_bytes > max_bytes:
                    raise HTTPException(
                        413, f"{upload.filename}: larger than the {max_bytes}-byte limit (ingest.max_file_bytes)"
                    )
                tmp.write(block)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return path
