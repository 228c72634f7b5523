"""Real, non-repeating prose for the calibration set's passages: sections of the Python standard library's
own docstrings (PSF licence), read from the running interpreter (nothing shipped, nothing downloaded).

Why real prose and not filler sentences: a set whose passages share a handful of filler templates repeats
text across chunks, and a chunk's stored KV (computed alone) cannot see the other chunks. On Qwen2.5 that
made every selector look no better than reuse on the set, while on held-out Wikipedia passages the same
selector cut reuse's KL to a sixth (docs/benchmarks.md, "Why Qwen needs more"). Documentation sections of
~250 tokens are also what the server's chunks are.

The modules are disjoint from bench/docs_corpus.py's, so that benchmark's answer key stays held out.
"""

from __future__ import annotations

import importlib
import inspect
import re

MODULES = (
    "argparse",
    "logging",
    "difflib",
    "zipfile",
    "tarfile",
    "configparser",
    "base64",
    "uuid",
    "urllib.parse",
    "ipaddress",
    "enum",
    "dataclasses",
    "contextlib",
    "threading",
    "email.utils",
    "mimetypes",
    "platform",
    "locale",
    "codecs",
    "traceback",
    "warnings",
    "weakref",
    "inspect",
    "ast",
    "tokenize",
    "os",
    "io",
    "abc",
    "socket",
    "array",
    "math",
    "time",
    "zlib",
    "lzma",
    "filecmp",
    "smtplib",
    "ftplib",
    "imaplib",
    "wave",
    "getopt",
    "optparse",
    "doctest",
    "pydoc",
    "pkgutil",
    "compileall",
    "py_compile",
    "binascii",
    "gzip",
    "bz2",
    "shelve",
    "timeit",
    "http.client",
    "poplib",
    "cmath",
    "select",
    "signal",
    "plistlib",
    "xml.dom.minidom",
    "runpy",
    "hmac",
    "calendar",
    "pathlib",
    "email.message",
    "http.server",
    "urllib.request",
    "xml.etree.ElementTree",
    "unittest.case",
    "unittest.mock",
    "asyncio.events",
    "asyncio.tasks",
    "multiprocessing.pool",
    # calset-3: sections for its eight follow-ups, with a few to spare (a patch release may drop a docstring)
    "fileinput",
    "pickletools",
    "wsgiref.util",
)
SECTION_CHARS = 1000  # ~250 tokens: a section is cut at the first entry boundary past this
MAX_ENTRY_CHARS = 700  # a long docstring is cut at a sentence boundary before this


def _clean(doc: str) -> str:
    """The docstring's prose: doctest sessions and their output dropped, blank lines collapsed."""
    kept: list[str] = []
    in_example = False
    for line in doc.splitlines():
        stripped = line.strip()
        if stripped.startswith((">>>", "...")):
            in_example = True
            continue
        if in_example and stripped:
            continue  # the example's output
        in_example = False
        kept.append(line.rstrip())
    text = re.sub(r"\n{3,}", "\n\n", "\n".join(kept)).strip()
    if len(text) <= MAX_ENTRY_CHARS:
        return text
    cut = max(text.rfind(". ", 0, MAX_ENTRY_CHARS), text.rfind(".\n", 0, MAX_ENTRY_CHARS))
    return text[: cut + 1] if cut > 0 else text[:MAX_ENTRY_CHARS]


def _entries(module_name: str) -> list[str]:
    """`## module.name(signature)` + docstring for each public function and class the module defines."""
    module = importlib.import_module(module_name)
    out: list[str] = []
    for attr in sorted(a for a in dir(module) if not a.startswith("_")):
        obj = getattr(module, attr, None)
        if not (inspect.isfunction(obj) or inspect.isclass(obj) or inspect.isbuiltin(obj)):
            continue
        if getattr(obj, "__module__", None) != module_name:
            continue  # re-exported from elsewhere
        doc = _clean(inspect.getdoc(obj) or "")
        if len(doc) < 80:
            continue  # a one-liner is not prose
        try:
            # Parameter names only: a default's repr can hold an address (`<object object at 0x7f…>`) or the
            # process's state (logging.shutdown's list of handlers), and the set must be the same everywhere.
            names = [
                str(p.replace(default=p.empty, annotation=p.empty)) for p in inspect.signature(obj).parameters.values()
            ]
            signature = f"({', '.join(names)})"
        except (TypeError, ValueError):
            signature = "(...)"
        out.append(f"## {module_name}.{attr}{signature}\n\n{doc}")
    return out


def sections() -> list[str]:
    """Every module's entries grouped into sections of about SECTION_CHARS, in a fixed order; no line of 40
    characters or more stands twice. (Deterministic for one Python version: the docstrings are the
    interpreter's.)"""
    out: list[str] = []
    seen_lines: set[str] = set()
    for name in MODULES:
        current: list[str] = []
        num_chars = 0
        for entry in _entries(name):
            lines = {line.strip() for line in entry.splitlines() if len(line.strip()) >= 40}
            if lines & seen_lines:
                continue  # docstrings repeat each other now and then (a shared note): the set must not
            seen_lines |= lines
            current.append(entry)
            num_chars += len(entry)
            if num_chars >= SECTION_CHARS:
                out.append("\n\n".join(current))
                current, num_chars = [], 0
    return out


def insert_paragraph(section: str, paragraph: str, position: float) -> str:
    """`section` with `paragraph` inserted at the paragraph boundary nearest `position` (0–1) of its length
    (never before the first paragraph, so a section still starts with its heading)."""
    parts = section.split("\n\n")
    at = min(len(parts), max(1, round(position * len(parts))))
    return "\n\n".join([*parts[:at], paragraph, *parts[at:]])
