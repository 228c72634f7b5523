"""What loaders produce: a document as a list of sections of normalized text."""

from __future__ import annotations

from dataclasses import dataclass, field

from ingest.normalize import content_hash

# Sections are joined with a blank line to form `LoadedDocument.text`; chunk offsets index that string.
SECTION_SEPARATOR = "\n\n"

MetadataValue = str | int | float | bool


@dataclass(frozen=True)
class Section:
    """A contiguous piece of a document; `page` is 1-based for paged formats (PDF), else None."""

    text: str
    page: int | None = None


@dataclass(frozen=True)
class LoadedDocument:
    """One parsed document. Section texts are already normalized (see `ingest.normalize`)."""

    title: str
    source_path: str | None
    format: str  # "txt", "md", "html", "pdf", "docx", "json", "jsonl"
    mime_type: str
    sections: list[Section]
    metadata: dict[str, MetadataValue] = field(default_factory=dict)
    content_hash: str = ""  # sha256 hex of `text`; filled in by __post_init__ when empty

    def __post_init__(self) -> None:
        if not self.content_hash:
            object.__setattr__(self, "content_hash", content_hash(self.text))

    @property
    def text(self) -> str:
        return SECTION_SEPARATOR.join(section.text for section in self.sections)

    def section_offsets(self) -> list[int]:
        """Start offset of each section inside `text`."""
        offsets: list[int] = []
        position = 0
        for section in self.sections:
            offsets.append(position)
            position += len(section.text) + len(SECTION_SEPARATOR)
        return offsets
