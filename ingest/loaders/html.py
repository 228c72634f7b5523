"""HTML → readable text: page chrome and code are dropped, block elements become line breaks."""

from __future__ import annotations

import re
from dataclasses import dataclass

from bs4 import BeautifulSoup, Comment, Declaration, Doctype, NavigableString, ProcessingInstruction, Tag
from bs4.element import CData, Stylesheet, TemplateString
from bs4.element import Script as ScriptString

from ingest.normalize import normalize_text
from ingest.types import MetadataValue

# Never readable content: code, page chrome (menus, banners, sidebars), embedded objects, forms.
DROPPED_TAGS = frozenset(
    {
        "script",
        "style",
        "nav",
        "header",
        "footer",
        "aside",
        "noscript",
        "template",
        "svg",
        "math",
        "iframe",
        "object",
        "embed",
        "canvas",
        "form",
        "button",
        "select",
        "head",
        "dialog",
    }
)
# Elements that start a new paragraph (blank line before and after).
PARAGRAPH_TAGS = frozenset(
    {
        "p",
        "div",
        "section",
        "article",
        "main",
        "h1",
        "h2",
        "h3",
        "h4",
        "h5",
        "h6",
        "ul",
        "ol",
        "dl",
        "table",
        "blockquote",
        "pre",
        "figure",
        "figcaption",
        "address",
        "details",
        "summary",
        "hr",
        "center",
        "fieldset",
        "caption",
        "body",
    }
)
# Elements that start a new line.
LINE_TAGS = frozenset({"li", "tr", "dt", "dd", "br", "thead", "tbody", "tfoot", "option"})
_CELL_TAGS = frozenset({"td", "th"})
_SKIPPED_STRINGS = (
    Comment,
    Declaration,
    Doctype,
    ProcessingInstruction,
    CData,
    Stylesheet,
    ScriptString,
    TemplateString,
)
_WHITESPACE = re.compile(r"\s+")
_DISPLAY_NONE = re.compile(r"display\s*:\s*none|visibility\s*:\s*hidden", re.IGNORECASE)


@dataclass(frozen=True)
class _Close:
    """Stack marker: the element `name` has been fully visited; emit the break that follows it."""

    name: str


class _TextBuilder:
    """Collects text with pending line breaks, so breaks never produce stray spaces around them."""

    def __init__(self) -> None:
        self._parts: list[str] = []
        self._pending_newlines = 0
        self._at_line_start = True

    def newline(self, count: int) -> None:
        self._pending_newlines = max(self._pending_newlines, count)

    def text(self, value: str, preformatted: bool = False) -> None:
        if not preformatted:
            value = _WHITESPACE.sub(" ", value)
            if self._pending_newlines or self._at_line_start or self._ends_with_space():
                value = value.lstrip(" ")
        if not value:
            return
        if self._pending_newlines:
            if self._parts:
                self._parts[-1] = self._parts[-1].rstrip(" ")
                self._parts.append("\n" * self._pending_newlines)
            self._pending_newlines = 0
        self._parts.append(value)
        self._at_line_start = value.endswith("\n")

    def _ends_with_space(self) -> bool:
        return bool(self._parts) and self._parts[-1].endswith(" ")

    def result(self) -> str:
        return "".join(self._parts)


def _is_hidden(tag: Tag) -> bool:
    if tag.has_attr("hidden") or tag.get("aria-hidden") == "true":
        return True
    style = tag.get("style")
    return isinstance(style, str) and _DISPLAY_NONE.search(style) is not None


def _extract_text(root: Tag) -> str:
    builder = _TextBuilder()
    # Explicit stack instead of recursion: real pages nest deeper than Python's recursion limit allows.
    # Items are (node, inside <pre>) to visit, or _Close markers.
    stack: list[tuple[object, bool] | _Close] = [(root, False)]
    while stack:
        item = stack.pop()
        if isinstance(item, _Close):
            if item.name in PARAGRAPH_TAGS:
                builder.newline(2)
            elif item.name in LINE_TAGS:
                builder.newline(1)
            continue
        node, preformatted = item
        if isinstance(node, NavigableString):
            if not isinstance(node, _SKIPPED_STRINGS):
                builder.text(str(node), preformatted)
            continue
        if not isinstance(node, Tag):
            continue
        name = node.name.lower() if node.name else ""
        if name in DROPPED_TAGS or _is_hidden(node):
            continue
        if name in PARAGRAPH_TAGS:
            builder.newline(2)
        elif name in LINE_TAGS:
            builder.newline(1)
            if name == "li":
                builder.text("- ")
        elif name in _CELL_TAGS and node.find_previous_sibling(_CELL_TAGS) is not None:
            builder.text(" | ")
        stack.append(_Close(name))
        inner_pre = preformatted or name in ("pre", "textarea")
        stack.extend((child, inner_pre) for child in reversed(node.contents))
    return builder.result()


def parse_html(data: bytes) -> tuple[str | None, str, dict[str, MetadataValue]]:
    """(title or None, normalized readable text, metadata). bs4 detects the charset from the bytes."""
    soup = BeautifulSoup(data, "lxml")
    metadata: dict[str, MetadataValue] = {}
    title: str | None = None
    if soup.title is not None and soup.title.get_text(strip=True):
        title = _WHITESPACE.sub(" ", soup.title.get_text()).strip()
    else:
        heading = soup.find("h1")
        if heading is not None and heading.get_text(strip=True):
            title = _WHITESPACE.sub(" ", heading.get_text()).strip()
    html_tag = soup.find("html")
    if isinstance(html_tag, Tag) and isinstance(html_tag.get("lang"), str):
        metadata["language"] = str(html_tag["lang"])
    description = soup.find("meta", attrs={"name": "description"})
    if isinstance(description, Tag) and isinstance(description.get("content"), str):
        metadata["description"] = _WHITESPACE.sub(" ", str(description["content"])).strip()
    root = soup.body if soup.body is not None else soup
    return title, normalize_text(_extract_text(root)), metadata
