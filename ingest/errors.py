"""Typed loader failures. Each carries the file it concerns and a message meant for the end user."""

from __future__ import annotations


class LoaderError(Exception):
    """A document could not be turned into text. `code` is a stable machine-readable reason."""

    code = "loader_error"

    def __init__(self, message: str, path: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.path = path

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class UnsupportedFormat(LoaderError):
    """The file type has no loader, or is not in `IngestSettings.allowed_extensions`."""

    code = "unsupported_format"


class EmptyDocument(LoaderError):
    """The document parsed but holds no text (blank file, scanned PDF without text layer …)."""

    code = "empty_document"


class EncryptedDocument(LoaderError):
    """The document is password protected."""

    code = "encrypted_document"


class UnreadableDocument(LoaderError):
    """The bytes are corrupt, truncated, binary, or otherwise not what the extension promises."""

    code = "unreadable_document"


class DocumentTooLarge(LoaderError):
    """The file is bigger than `IngestSettings.max_file_bytes`, unpacks to more than `max_unpacked_bytes`,
    or holds more text than its token cap allows (`IngestSettings.max_document_chars`)."""

    code = "document_too_large"

    @classmethod
    def text_over_cap(cls, max_chars: int, path: str | None) -> DocumentTooLarge:
        return cls(
            f"document has more than {max_chars} characters of text, more than its token cap allows "
            "(ingest.max_document_tokens)",
            path,
        )


class ParseTimeLimit(LoaderError):
    """Reading the document took longer than `IngestSettings.max_parse_seconds` (a file built to be slow to
    parse: deeply nested or bloated markup, a pathological PDF)."""

    code = "parse_time_limit"

    @classmethod
    def after(cls, max_seconds: float, path: str | None) -> ParseTimeLimit:
        return cls(f"parsing took longer than {max_seconds:g} s, the limit (ingest.max_parse_seconds)", path)


class TooManyRecords(LoaderError):
    """A JSON / JSONL file holds more records than `IngestSettings.max_records_per_file`."""

    code = "too_many_records"


class Interrupted(Exception):  # noqa: N818 - a stop asked for, not an error of the document
    """Raised by a caller's `check` callback (a cancelled job, a stopping server) to stop a loader or the
    chunker between two steps; loaders pass it through untouched instead of reporting an unreadable file."""
