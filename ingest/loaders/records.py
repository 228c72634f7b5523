"""JSON and JSON Lines: each record with a text field becomes its own document."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ingest.errors import EmptyDocument, UnreadableDocument
from ingest.normalize import normalize_text
from ingest.types import MetadataValue

# Longest scalar copied from a record into metadata; long strings belong in the text, not metadata.
_MAX_METADATA_CHARS = 512


@dataclass(frozen=True)
class Record:
    index: int  # position in the file (0-based), counting records without text too
    title: str | None
    text: str
    metadata: dict[str, MetadataValue]


def _lookup(record: Any, dotted: str) -> Any:
    value = record
    for key in dotted.split("."):
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value


def _as_text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and all(isinstance(item, str) for item in value):
        return "\n\n".join(value)
    return None


def _record(index: int, raw: Any, text_field: str, title_field: str) -> Record | None:
    if isinstance(raw, str):
        text = normalize_text(raw)
        return Record(index, None, text, {"record_index": index}) if text else None
    if not isinstance(raw, dict):
        return None
    value = _as_text(_lookup(raw, text_field))
    text = normalize_text(value) if value is not None else ""
    if not text:
        return None
    title_value = _lookup(raw, title_field)
    title = title_value.strip() if isinstance(title_value, str) and title_value.strip() else None
    top_text_key, top_title_key = text_field.split(".")[0], title_field.split(".")[0]
    metadata: dict[str, MetadataValue] = {}
    for key, item in raw.items():
        if key in (top_text_key, top_title_key):
            continue
        short_string = isinstance(item, str) and len(item) <= _MAX_METADATA_CHARS
        if short_string or isinstance(item, bool | int | float):
            metadata[str(key)] = item
    metadata["record_index"] = index
    return Record(index, title, text, metadata)


def _json_values(data: str, path: str | None) -> list[Any]:
    try:
        parsed = json.loads(data)
    except json.JSONDecodeError as exc:
        message = f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        raise UnreadableDocument(message, path) from exc
    return parsed if isinstance(parsed, list) else [parsed]


def _jsonl_values(data: str, path: str | None) -> Iterator[Any]:
    for line_number, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield json.loads(line)
        except json.JSONDecodeError as exc:
            raise UnreadableDocument(f"invalid JSON on line {line_number}: {exc.msg}", path) from exc


def parse_records(
    data: str, path: str | None, *, lines: bool, text_field: str, title_field: str
) -> list[Record]:
    """Records holding non-empty text; EmptyDocument when there are none."""
    values = _jsonl_values(data, path) if lines else _json_values(data, path)
    records = [
        record
        for index, raw in enumerate(values)
        if (record := _record(index, raw, text_field, title_field)) is not None
    ]
    if not records:
        raise EmptyDocument(f"no record has a non-empty {text_field!r} text field", path)
    return records
