"""JSON and JSON Lines: each record with a text field becomes its own document.

Records are read one at a time (`iter_records`): a JSON array is walked element by element with
`raw_decode`, JSON Lines line by line, so a caller sees progress per record and can stop early (cancel,
or a file over `max_records`) without first parsing the whole file.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ingest.errors import EmptyDocument, TooManyRecords, UnreadableDocument
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


_WHITESPACE = re.compile(r"[ \t\n\r]*")


def _position(data: str, index: int) -> str:
    line = data.count("\n", 0, index) + 1
    return f"line {line} column {index - data.rfind(chr(10), 0, index)}"


def _json_values(data: str, path: str | None) -> Iterator[Any]:
    """The elements of a top-level JSON array one by one (any other top-level value: itself)."""
    decoder = json.JSONDecoder()
    i = _WHITESPACE.match(data, 0).end()  # type: ignore[union-attr]
    if not data.startswith("[", i):
        try:
            yield json.loads(data)
        except json.JSONDecodeError as exc:
            raise UnreadableDocument(f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}", path) from exc
        return
    i = _WHITESPACE.match(data, i + 1).end()  # type: ignore[union-attr]
    if data.startswith("]", i):
        i += 1
    else:
        while True:
            try:
                value, i = decoder.raw_decode(data, i)
            except json.JSONDecodeError as exc:
                raise UnreadableDocument(
                    f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}", path
                ) from exc
            yield value
            i = _WHITESPACE.match(data, i).end()  # type: ignore[union-attr]
            if data.startswith(",", i):
                i = _WHITESPACE.match(data, i + 1).end()  # type: ignore[union-attr]
                continue
            if data.startswith("]", i):
                i += 1
                break
            raise UnreadableDocument(f"invalid JSON at {_position(data, i)}: expected ',' or ']'", path)
    i = _WHITESPACE.match(data, i).end()  # type: ignore[union-attr]
    if i != len(data):
        raise UnreadableDocument(f"invalid JSON at {_position(data, i)}: extra data after the array", path)


def _jsonl_values(data: str, path: str | None) -> Iterator[Any]:
    # JSON Lines ends a record at "\n" (a "\r" before it is JSON white space): not str.splitlines, which
    # also breaks at U+2028, U+0085 … that a JSON string may hold raw.
    for line_number, line in enumerate(data.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            yield json.loads(line)
        except json.JSONDecodeError as exc:
            raise UnreadableDocument(f"invalid JSON on line {line_number}: {exc.msg}", path) from exc


def iter_records(
    data: str,
    path: str | None,
    *,
    lines: bool,
    text_field: str,
    title_field: str,
    max_records: int | None = None,
) -> Iterator[Record]:
    """Records holding non-empty text, one at a time; EmptyDocument when there are none, TooManyRecords
    as soon as there are more than `max_records`."""
    values = _jsonl_values(data, path) if lines else _json_values(data, path)
    count = 0
    for index, raw in enumerate(values):
        record = _record(index, raw, text_field, title_field)
        if record is None:
            continue
        count += 1
        if max_records is not None and count > max_records:
            raise TooManyRecords(
                f"more than {max_records} records (ingest.max_records_per_file); split the file or raise the setting",
                path,
            )
        yield record
    if count == 0:
        raise EmptyDocument(f"no record has a non-empty {text_field!r} text field", path)
