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
    """The file is bigger than `IngestSettings.max_file_bytes`."""

    code = "document_too_large"


class TooManyRecords(LoaderError):
    """A JSON / JSONL file holds more records than `IngestSettings.max_records_per_file`."""

    code = "too_many_records"
