"""Settings of the ingest package (parsing and chunking). Composed into the app's settings tree."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# Extension (lower case, no dot) -> loader format. The single source of truth for what can be parsed.
KNOWN_EXTENSIONS: dict[str, str] = {
    "txt": "txt",
    "text": "txt",
    "md": "md",
    "markdown": "md",
    "html": "html",
    "htm": "html",
    "xhtml": "html",
    "pdf": "pdf",
    "docx": "docx",
    "json": "json",
    "jsonl": "jsonl",
    "ndjson": "jsonl",
}

# No tokenizer of the supported models averages more characters per token over real text (≈4 is usual), so
# text over max_document_tokens × this is over the token cap whatever it says.
MAX_CHARS_PER_TOKEN = 16


class IngestSettings(BaseModel):
    """How documents are parsed and cut into chunks."""

    model_config = ConfigDict(extra="forbid")

    chunk_tokens: int = Field(
        512,
        ge=16,
        le=32768,
        description="Chunk budget in LLM tokens, including the blank-line separator appended to every chunk",
    )
    chunk_overlap: int = Field(
        64, ge=0, description="Tokens of the previous chunk's tail repeated at the start of the next (whole sentences)"
    )
    json_text_field: str = Field(
        "text", min_length=1, description="JSON / JSONL records: the field holding the text (dotted: body.text)"
    )
    json_title_field: str = Field(
        "title", min_length=1, description="JSON / JSONL records: the field holding the title"
    )
    max_file_bytes: int = Field(50 * 1024 * 1024, gt=0, description="Largest file one ingest accepts")
    max_unpacked_bytes: int = Field(
        100 * 1024 * 1024,
        gt=0,
        description="A DOCX is a zip: all its parts together may unpack to this many bytes (a zip bomb is refused "
        "before anything is inflated; the zip reader never inflates past a part's declared size)",
    )
    max_parse_seconds: float = Field(
        30.0,
        gt=0,
        description="Seconds one file may take to parse; past it the document fails (parse_time_limit). A DOCX "
        "looks at the clock while it is read; with parse_in_subprocess any parser is stopped (its process killed)",
    )
    parse_in_subprocess: bool = Field(
        True,
        description="Parse each file in a child process (a parse server kept for the next file) that is killed "
        "on a cancel, a shutdown or the time limit, and whose memory is capped by max_parse_memory_bytes, so no "
        "file holds the ingest queue or the server's memory. False: parse in the ingest thread (only DOCX and "
        "JSON stop early there)",
    )
    max_parse_memory_bytes: int = Field(
        # OCR (onnxruntime and OpenCV) addresses about 1.4 GB for a page (0.8 GB resident): 2 GiB lets pdf_ocr read
        # scans under the cap; a parse without OCR stays far below it.
        2 * 1024 * 1024 * 1024,
        ge=64 * 1024 * 1024,
        description="Address space the parse process of one file may use (parse_in_subprocess); past it the "
        "document fails (document_too_large)",
    )
    parse_recycle_bytes: int | None = Field(
        200 * 1024 * 1024,
        ge=0,
        description="A parse process whose resident memory is over this many bytes after a file is replaced for "
        "the next one: a big file's parse leaves the process as large as it grew (a 5 MB HTML page: 318 MB, "
        "where a fresh one holds about 60 MB). null: kept whatever it holds",
    )
    parse_idle_s: float | None = Field(
        300.0,
        gt=0,
        description="A parse process that parsed nothing for this many seconds is stopped (the next file starts "
        "one again, in well under a second), so an idle server holds no parse processes. null: kept",
    )
    parse_workers: int | None = Field(
        None,
        ge=1,
        le=64,
        description="Files of larger jobs parsed at once, each in a parse process of its own, so one slow file "
        "does not hold the jobs behind it; null: half the cores, at most 4, and no more than a quarter of the "
        "memory holds at max_parse_memory_bytes each (app/services/ingest/lanes.py)",
    )
    quick_parse_bytes: int = Field(
        1024 * 1024,
        ge=0,
        description="A job whose files together are at most this many bytes is parsed in a lane of its own (one "
        "more parse process), never behind a larger file's parse; jobs of inline text need no parse process "
        "and never wait for one. 0: no quick lane",
    )
    max_records_per_file: int = Field(
        10_000, ge=1, description="JSON / JSONL: a file with more records (documents) is refused as a whole"
    )
    max_document_tokens: int = Field(
        128 * 1024,
        gt=0,
        description="LLM tokens (≈ KV bytes and prompt-pass time) one document may add; over it the document "
        "fails (too_large), counted while it is parsed and chunked",
    )
    max_job_tokens: int = Field(
        1024 * 1024, gt=0, description="LLM tokens one ingest job may add; past it the rest of the job fails"
    )
    max_job_documents: int = Field(1000, gt=0, description="Sources (files + inline documents) per request")
    allowed_extensions: list[str] = Field(
        default_factory=lambda: sorted(KNOWN_EXTENSIONS),
        description="File extensions ingest accepts (each has a loader)",
    )
    pdf_tables: bool = Field(
        True,
        description="PDF tables as Markdown tables (pdfplumber), in blocks that each repeat the header row, so a "
        "value is retrieved with its row and column headers; a page with over 2,000 ruling lines is read as plain text",
    )
    pdf_ocr: Literal["off", "auto", "on"] = Field(
        "auto",
        description="OCR of PDF pages (RapidOCR, its model inside its package): auto reads the pages without a text "
        "layer (scans), on every page (a text layer that is wrong), off none; in the parse process, within "
        "max_parse_seconds and max_parse_memory_bytes (about 2-6 s a page on 2 cores)",
    )
    md_strip_front_matter: bool = Field(
        True,
        description="Drop a leading YAML front matter block (--- … ---) from Markdown; its scalar keys go to metadata",
    )

    @field_validator("allowed_extensions")
    @classmethod
    def _normalize_extensions(cls, value: list[str]) -> list[str]:
        normalized = sorted({ext.lower().lstrip(".") for ext in value})
        unknown = [ext for ext in normalized if ext not in KNOWN_EXTENSIONS]
        if unknown:
            raise ValueError(f"no loader for extension(s) {unknown}; known: {sorted(KNOWN_EXTENSIONS)}")
        return normalized

    @model_validator(mode="after")
    def _check_overlap(self) -> IngestSettings:
        if self.chunk_overlap >= self.chunk_tokens:
            raise ValueError(
                f"chunk_overlap ({self.chunk_overlap}) must be smaller than chunk_tokens ({self.chunk_tokens})"
            )
        return self

    @property
    def max_document_chars(self) -> int:
        """Characters of text one parsed document may hold: the token cap at MAX_CHARS_PER_TOKEN, checked
        while a loader reads (before anything is tokenized), so text far over the token cap stops early."""
        return self.max_document_tokens * MAX_CHARS_PER_TOKEN
