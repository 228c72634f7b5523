"""What `blendrag ingest` says before it starts: how many tokens the model is about to read, and how long that
takes at this machine's measured prefill rate.

Ingest runs the model over every token once (the chunk KV precompute): 19 Markdown pages of 90k tokens took
22 minutes on two busy cores, with nothing said up front. The line gives two counts: the tokens of the parsed
text, and the tokens of its chunks, which is what the model reads and the KV cache stores (the text's tokens,
the separator closing each chunk and the overlap each chunk repeats of the one before: 82,650 tokens of text
made 90,311 chunk tokens). They are the served model's own tokenizer's over the parsed text, cut by the
ingest's own chunker, when the model is ready on this machine (a catalogue model's conversion, or a checkpoint
directory); otherwise, and for a file that does not parse, characters / 4 and the chunks' share of overlap,
and the line says "about". The rate is the one the server learned from its own prefills (`/api/stats`'
`prefill_tokens_per_s`; a server measures one at start when it has none), or, ingesting in this process, the one
the data dir kept (`prefill_rate.json`); none measured yet: the line says so.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from app.settings import Settings
    from ingest.config import IngestSettings

logger = logging.getLogger(__name__)

CHARS_PER_TOKEN = 4  # the fallback count: English prose and code run 3.5-4.5 characters per token


@dataclass(frozen=True)
class TokenCount:
    text: int  # tokens of the parsed text
    chunks: int  # tokens of its chunks: the text's, each chunk's closing separator and the overlap it repeats
    exact: bool  # counted by the model's tokenizer and chunker (False: characters / 4 for some or all files)


@dataclass(frozen=True)
class IngestEstimate:
    num_files: int
    count: TokenCount
    tokens_per_s: float | None  # the measured prefill rate, None when none was measured yet
    rate_source: str  # whose measured rate it is ("the server's", "this data dir's"), for the message
    chunk_overlap: int  # tokens a chunk may repeat of the one before (ingest.chunk_overlap), for the message

    @property
    def seconds(self) -> float | None:
        """What the KV precompute takes: it reads the chunk tokens, overlap included, not just the text's."""
        return None if not self.tokens_per_s else self.count.chunks / self.tokens_per_s

    def message(self) -> str:
        from app.cli.common import duration

        about = "" if self.count.exact else "about "
        count = (
            f"{about}{self.count.text:,} tokens of text, {about}{self.count.chunks:,} in its chunks (each repeats up "
            f"to {self.chunk_overlap} tokens of the one before)"
        )
        head = f"{self.num_files} file(s), {count}: the model reads every chunk token once (KV precompute)"
        if self.seconds is None:
            return f"{head}; {self.rate_source} prefill rate is not measured yet, so no time estimate"
        rate = self.tokens_per_s or 0.0
        shown = f"{rate:,.0f}" if rate >= 10 else f"{rate:.1f}"
        return f"{head}, about {duration(self.seconds)} at {shown} tokens/s ({self.rate_source} measured prefill rate)"


def tokenizer_dir(settings: Settings) -> Path | None:
    """The served model's checkpoint directory when it is ready here without a conversion, else None (a
    catalogue model not converted yet, a GGUF file: the count falls back on characters)."""
    from engine.models.catalog import catalog_entry
    from engine.models.resolve import converted_path, is_catalog_model_converted

    entry = catalog_entry(settings.engine.model)
    if entry is not None:
        for models_dir in (*settings.models_dirs_read, settings.models_dir):
            if models_dir is not None and is_catalog_model_converted(entry, Path(models_dir)):
                return converted_path(entry, Path(models_dir))
        return None
    path = Path(settings.engine.model).expanduser()
    return path if path.is_dir() and (path / "config.json").is_file() else None


def load_tokenizer(settings: Settings) -> Any | None:
    """The served model's tokenizer, or None when it is not ready here."""
    path = tokenizer_dir(settings)
    if path is None:
        return None
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as exc:  # the estimate is advice: a tokenizer that does not load means characters / 4
        logger.warning("counting by characters: the model's tokenizer at %s does not load: %s", path, exc)
        return None


def chunk_share(num_tokens: int, ingest: IngestSettings) -> int:
    """The chunk tokens of `num_tokens` of text when they are not counted: each chunk repeats up to
    `chunk_overlap` tokens of the one before, so a chunk of `chunk_tokens` holds that many fewer new ones."""
    return num_tokens * ingest.chunk_tokens // (ingest.chunk_tokens - ingest.chunk_overlap)


def count_tokens(paths: Sequence[Path], settings: Settings) -> TokenCount:
    """The tokens of every file's parsed text and of its chunks, cut as the ingest cuts them."""
    from ingest.chunker import Chunker
    from ingest.loaders import load_path

    tokenizer = load_tokenizer(settings)
    chunker = Chunker.from_settings(tokenizer, settings.ingest) if tokenizer is not None else None
    text, chunks, exact = 0, 0, chunker is not None
    for path in paths:
        try:
            documents = list(load_path(path, settings.ingest))
        except Exception:  # the ingest reports the file's error; here its size stands in for its text
            size = path.stat().st_size // CHARS_PER_TOKEN if path.is_file() else 0
            text, chunks, exact = text + size, chunks + chunk_share(size, settings.ingest), False
            continue
        for document in documents:
            if chunker is None:
                size = len(document.text) // CHARS_PER_TOKEN
                text, chunks = text + size, chunks + chunk_share(size, settings.ingest)
                continue
            text += len(tokenizer(document.text, add_special_tokens=False)["input_ids"])
            chunks += sum(len(c.token_ids) for c in chunker.chunk_document(document))
    return TokenCount(text, chunks, exact)


def stored_rate(data_dir: Path) -> float | None:
    """The prefill rate the data dir kept (app/services/estimates.py writes it), or None."""
    from app.state import PREFILL_RATE_FILE

    try:
        rate = float(json.loads((data_dir / PREFILL_RATE_FILE).read_text(encoding="utf-8"))["tokens_per_s"])
    except (OSError, ValueError, TypeError, KeyError):
        return None
    return rate if rate > 0 else None


def estimate(paths: Sequence[Path], settings: Settings, server_rate: float | None, remote: bool) -> IngestEstimate:
    """The estimate for ingesting `paths`: at the server's rate when a server ingests them (`remote`),
    else at the data dir's."""
    count = count_tokens(paths, settings)
    if remote:
        rate, source = server_rate, "the server's"
    else:
        rate, source = stored_rate(settings.data_dir), "this data dir's"
    return IngestEstimate(len(paths), count, rate, source, settings.ingest.chunk_overlap)
