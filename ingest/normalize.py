"""Text normalization shared by every loader, so equal content hashes mean equal extracted text."""

from __future__ import annotations

import hashlib
import re
import unicodedata

# Characters that carry no text: zero-width space/joiners, BOM, soft hyphen.
_INVISIBLE = dict.fromkeys(map(ord, "\u200b\u200c\u200d\u2060\ufeff\u00ad"), None)
# Unicode spaces that should read as an ordinary space (NBSP, thin space …). Tabs are kept for code.
_SPACES = re.compile(r"[\u00a0\u1680\u2000-\u200a\u202f\u205f\u3000]")
# Control characters other than \t and \n (form feeds from PDFs become line breaks first).
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0e-\x1f\x7f]")
_TRAILING_SPACE = re.compile(r"[ \t]+\n")
_BLANK_RUNS = re.compile(r"\n{3,}")


def normalize_text(text: str) -> str:
    """NFC, unified line endings, no invisible/control characters, no trailing spaces, ≤ 1 blank line."""
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\x0c", "\n").replace("\u2028", "\n")
    text = unicodedata.normalize("NFC", text)
    text = text.translate(_INVISIBLE)
    text = _SPACES.sub(" ", text)
    text = _CONTROL.sub("", text)
    text = _TRAILING_SPACE.sub("\n", text + "\n")
    text = _BLANK_RUNS.sub("\n\n", text)
    # Leading spaces of the first line are kept out: they never carry meaning at document start.
    return text.strip()


def content_hash(text: str) -> str:
    """sha256 (hex) of already-normalized text."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
