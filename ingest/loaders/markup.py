"""Documentation markup a Markdown reader never sees, taken out at ingest so that passages (and the answers a
model writes from them) do not repeat it: the Python-Markdown, pymdown and MkDocs (Material, mkdocstrings,
autorefs) extensions that documentation sites such as Pydantic's, FastAPI's or httpx's are written in.

What a reader does see is kept: a reference link's text, an admonition's or a content tab's title and its
body (dedented, or Markdown would read the 4-space body as an indented code block), the object a mkdocstrings
directive documents. Code stays code: inside fenced blocks only the annotation markers (`# (1)!`) go.

- `[text][ref]`, `[text][]`, `![alt][ref]` → `text`, `alt`; a reference definition line `[ref]: https://…` goes
  (a footnote `[^1]: …` is text and stays);
- attribute lists (`{#anchor}`, `{: .class }`, `{ .annotate }`) at the end of a heading or of a block's last
  line, alone on a line, or right after a link (`[x](url){ .md-button }`) go; one inside a line is text;
- `!!! note`, `!!! warning "Careful"`, `??? api "API Documentation"`, `???+ tip`, `=== "Python 3.9+"` → `Note`,
  `Careful`, `API Documentation`, `Tip`, `Python 3.9+` on a line of their own, the body dedented;
- `x = 1  # (1)!` and `# note (2)` in a code block → `x = 1`, `# note`; in a block marked `{ .annotate }`,
  `Lorem (1) ipsum.` → `Lorem ipsum.`;
- `::: pydantic.main.BaseModel` and its indented options → `pydantic.main.BaseModel`;
- `text<br>` → `text` (a line break where one stands inside a line).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# A fence opens with 3+ backticks or tildes after up to three spaces (CommonMark).
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
# An admonition (`!!! type ["title"]`), a collapsible one (`??? type`, `???+ type`) or a content tab
# (`=== "title"`, `===+ "title"`; its title is required, or `===` under a line would be a setext heading's
# underline): the body is the lines indented 4 more spaces below it.
_BLOCK = re.compile(
    r"^(?P<indent> {0,3})(?:(?:!!!|\?\?\?\+?)[ \t]+(?P<type>[\w-]+)(?:[ \t]+[\w-]+)*(?:[ \t]+\"(?P<title>[^\"]*)\")?"
    r"|===\+?[ \t]+\"(?P<tab>[^\"]*)\")[ \t]*$"
)
# One attribute of an attribute list: `#id`, `.class` or `key=value`.
_ATTR = r"""(?:[#.][\w:-]+|[\w:-]+=(?:"[^"]*"|'[^']*'|[^\s}]+))"""
_ATTR_LIST = rf"\{{:?[ \t]*{_ATTR}(?:[ \t]+{_ATTR})*[ \t]*\}}"
_ATX_HEADING = re.compile(r"^ {0,3}#{1,6}(?:[ \t]|$)")
_SETEXT_UNDERLINE = re.compile(r"^ {0,3}(?:=+|-+)[ \t]*$")
_TRAILING_ATTRS = re.compile(rf"[ \t]*{_ATTR_LIST}[ \t]*$")
_ALONE_ATTRS = re.compile(rf"^[ \t]*{_ATTR_LIST}[ \t]*$")
# An attribute list right after an inline link or image: `[Get started](start.md){ .md-button }`.
_INLINE_ATTRS = re.compile(rf"(\]\([^()\s]*(?:[ \t]+\"[^\"]*\")?\)){_ATTR_LIST}")
# A reference definition `[ref]: url "title"`; a footnote `[^1]: text` is text, not a definition.
_REF_DEFINITION = re.compile(r"^ {0,3}\[(?!\^)[^\]]+\]:[ \t]*\S+.*$")
# Code spans are skipped whole; a reference link's text may hold one (`` [`Field`][pydantic.Field] ``). The
# `[` must not follow a name or a closing bracket: `a[0][1]` is an index, not a link.
_REF_LINK = re.compile(
    r"(?P<code>(?P<ticks>`+).+?(?P=ticks))"
    r"|(?<![\w\]\)])!?\[(?P<text>(?:`[^`]*`|\\.|[^\[\]`\\])+)\]\[(?P<ref>[^\[\]]*)\]"
)
_BREAK = re.compile(r"[ \t]*<br[ \t]*/?>[ \t]*", re.IGNORECASE)
_DIRECTIVE = re.compile(r"^ {0,3}:::[ \t]+(?P<path>[\w.]+)[ \t]*$")
# A code annotation: a comment that is only the marker goes whole, a marker after a comment's words goes alone.
_CODE_MARKER_COMMENT = re.compile(r"[ \t]*(?:#|//)[ \t]*\(\d+\)!?[ \t]*$")
_CODE_MARKER = re.compile(r"((?:#|//)[ \t]*\S.*?)[ \t]*\(\d+\)!?[ \t]*$")
_PROSE_MARKER = re.compile(r"[ \t]*\(\d+\)!?(?=[\s.,;:!?]|$)")
_ANNOTATE = re.compile(rf"(?={_ATTR_LIST})\{{[^}}]*\.annotate\b")


@dataclass
class _Line:
    text: str
    code: bool  # inside a fenced block, its fences included


def clean_markup(text: str) -> str:
    """`text` (Markdown, `\\n` line ends) without the documentation markup a reader does not see (module doc)."""
    lines = _unannotate(_drop_directives(_open_blocks(text.split("\n"))))
    out: list[str] = []
    for i, line in enumerate(lines):
        if line.code:
            out.append(_clean_code(line.text))
            continue
        if _REF_DEFINITION.match(line.text) or _ALONE_ATTRS.match(line.text):
            continue
        following = lines[i + 1] if i + 1 < len(lines) else None
        out.append(_clean_prose(line.text, following))
    return "\n".join(out)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _open_blocks(raw: list[str]) -> list[_Line]:
    """Admonitions and content tabs replaced by their titles, their bodies dedented, fenced code marked."""
    out: list[_Line] = []
    bodies: list[int] = []  # the body indent of each open block, innermost last
    fence: str | None = None  # the opening fence's characters while inside a fenced block
    for raw_line in raw:
        stripped = raw_line.lstrip(" \t")
        line = raw_line[: len(raw_line) - len(stripped)].expandtabs(4) + stripped
        if not line.strip():
            out.append(_Line("", fence is not None))
            continue
        while bodies and _indent(line) < bodies[-1]:
            bodies.pop()
        line = line[bodies[-1] :] if bodies else line
        opening = _FENCE.match(line)
        if fence is not None:
            # A fence closes with the same character, at least as long, and nothing else on the line.
            marker = opening.group(1) if opening else ""
            if marker[:1] == fence[0] and len(marker) >= len(fence) and not line.strip().strip(fence[0]):
                fence = None
            out.append(_Line(line, True))
            continue
        if opening:
            fence = opening.group(1)
            out.append(_Line(line, True))
            continue
        block = _BLOCK.match(line)
        if block is None:
            out.append(_Line(line, False))
            continue
        title = block.group("title") if block.group("tab") is None else block.group("tab")
        if title is None:  # an admonition without one shows its type: `!!! note` reads "Note"
            title = (block.group("type") or "").capitalize()
        if title.strip():
            out.extend([_Line(block.group("indent") + title.strip(), False), _Line("", False)])
        bodies.append((bodies[-1] if bodies else 0) + len(block.group("indent")) + 4)
    return out


def _drop_directives(lines: list[_Line]) -> list[_Line]:
    """`::: module.path` becomes the path it documents; the indented options under it go."""
    out: list[_Line] = []
    in_options = False
    for line in lines:
        if not line.code:
            directive = _DIRECTIVE.match(line.text)
            if directive:
                out.append(_Line(directive.group("path"), False))
                in_options = True
                continue
            if in_options and line.text.startswith((" ", "\t")) and line.text.strip():
                continue
        in_options = False
        out.append(line)
    return out


def _clean_code(line: str) -> str:
    if _CODE_MARKER_COMMENT.search(line):
        return _CODE_MARKER_COMMENT.sub("", line)
    return _CODE_MARKER.sub(r"\1", line)


def _clean_prose(line: str, following: _Line | None) -> str:
    line = _REF_LINK.sub(lambda m: m.group("code") or m.group("text"), line)
    line = _INLINE_ATTRS.sub(r"\1", line)
    # An attribute list ends a heading, or the last line of a block (a blank line, code or the end next).
    ends_block = following is None or following.code or not following.text.strip()
    heading = _ATX_HEADING.match(line) or (
        following is not None and not following.code and _SETEXT_UNDERLINE.match(following.text)
    )
    if heading or ends_block:
        line = _TRAILING_ATTRS.sub("", line)
    return _BREAK.sub(lambda m: "" if m.end() == len(line) else "\n", line)


def _unannotate(lines: list[_Line]) -> list[_Line]:
    """In a block (a run of non-blank prose lines) marked `{ .annotate }`, the `(1)` markers of its
    annotations go; the mark itself goes with the other attribute lists."""
    start = 0
    while start < len(lines):
        end = start
        while end < len(lines) and not lines[end].code and lines[end].text.strip():
            end += 1
        if any(_ANNOTATE.search(line.text) for line in lines[start:end]):
            for line in lines[start:end]:
                line.text = _PROSE_MARKER.sub("", line.text)
        start = end + 1
    return lines
