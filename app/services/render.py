"""Markdown → safe HTML for the chat page: answers and source passages.

The model answers in Markdown (fences, headings, lists) and documents are often Markdown too; shown as
raw text they read as noise. Rendering happens here, with maintained libraries and no CDN: markdown-it-py
(CommonMark + tables) with raw HTML *disabled* — an `<img onerror=…>` in a document or an answer is shown
as text, never parsed — and then nh3 (the Ammonia sanitizer) over the result as a second, independent
allow-list, so nothing a document or the model writes can execute in the page.

Images load only from this server: a document (or an answer the model is talked into writing) with
`![x](https://tracker.example/p.gif)` would otherwise make every reader's browser ping that host when the
passage is opened. A remote image keeps its alt text and loses its `src`; the pages' Content-Security-Policy
(`img-src 'self' data:`, app/api/security_headers.py) refuses one anyway.

CommonMark closes an unclosed code fence at the end of the text, so a half-streamed answer that has opened
a ```python block renders its code as code already.

A passage is cut from its document, and may start inside a code block (the chunk before opened it): its
first fence then closes a block CommonMark never saw open, so the code before it would render as prose and the
prose after it as code, inverted. `reopen_fence` tells such a passage by its fences and gives it back the fence
it starts behind; the chat page renders passages with it (`passage=True`).
"""

from __future__ import annotations

import functools
import re

MAX_RENDER_CHARS = 200_000  # an answer is at most a few thousand tokens; a passage at most a chunk

_TAGS = {
    "p", "br", "hr", "h1", "h2", "h3", "h4", "h5", "h6", "strong", "em", "del", "code", "pre", "blockquote",
    "ul", "ol", "li", "a", "table", "thead", "tbody", "tr", "th", "td", "img",
}  # fmt: skip
_ATTRIBUTES = {
    "a": {"href", "title"},
    "img": {"src", "alt", "title"},
    "code": {"class"},  # language-python: the fence's language, for styling
    "ol": {"start"},
    "th": {"style"},
    "td": {"style"},
}
_URL_SCHEMES = {"http", "https", "mailto"}
# A fence line (CommonMark): up to three spaces, 3+ backticks or tildes, then an info string (the language) or
# nothing. A closing fence never carries an info string.
_FENCE_LINE = re.compile(r"^ {0,3}(?P<marker>`{3,}|~{3,})[ \t]*(?P<info>[^\n]*?)[ \t]*$", re.MULTILINE)


def _same_origin_only(tag: str, attribute: str, value: str) -> str | None:
    """nh3's attribute filter: an image `src` naming a host (`https://…`, `//host/…`) is dropped."""
    if tag == "img" and attribute == "src":
        url = value.strip().replace("\\", "/")  # browsers read a backslash in a URL as a slash
        if url.startswith("//") or ":" in url.split("/", 1)[0]:
            return None
    return value


@functools.cache
def _parser():  # noqa: ANN202 (markdown_it.MarkdownIt, imported lazily)
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False}).enable("table")


def reopen_fence(text: str) -> str:
    """`text` (a passage cut from a document) with the code fence it starts behind put back in front, when its
    fences say it starts inside a code block; else `text` unchanged. The fences say so when the first fence,
    which carries no info string (a closing fence never does) and follows text, cannot open a block:
    - the fence after it carries an info string (```python), so it opens a block, and the first one, were it an
      opening fence, would have had no closing fence before it; or
    - it is the odd one out (an odd number of fences) and the lines around it are a closing fence's: the line
      before is code (not blank, and not prose that introduces a block, ending in ":") and the line after is
      blank or there is none (code follows an opening fence at once)."""
    # A backtick line whose info string holds a backtick is inline code (```x```), not a fence.
    fences = [m for m in _FENCE_LINE.finditer(text) if not (m["marker"][0] == "`" and "`" in m["info"])]
    if not fences or fences[0].group("info") or not text[: fences[0].start()].strip():
        return text
    first = fences[0]
    if len(fences) > 1 and fences[1].group("info") and fences[1].group("marker")[0] == first.group("marker")[0]:
        inside = True
    else:
        before = text[: first.start()].removesuffix("\n").rsplit("\n", 1)[-1]  # the line right before it
        after = text[first.end() :].removeprefix("\n").split("\n", 1)[0]  # and the one right after it
        code_before = bool(before.strip()) and not before.rstrip().endswith(":")
        inside = len(fences) % 2 == 1 and code_before and not after.strip()
    return f"{first.group('marker')}\n{text}" if inside else text


def render_markdown(text: str, *, passage: bool = False) -> str:
    """Sanitized HTML for `text` (Markdown; `passage`: a passage cut from a document, which may start inside a
    code block: `reopen_fence`). Raises ValueError past MAX_RENDER_CHARS."""
    import nh3

    if len(text) > MAX_RENDER_CHARS:
        raise ValueError(f"text is longer than {MAX_RENDER_CHARS} characters")
    html = _parser().render(reopen_fence(text) if passage else text)
    return nh3.clean(
        html,
        tags=_TAGS,
        attributes=_ATTRIBUTES,
        url_schemes=_URL_SCHEMES,
        link_rel="noopener noreferrer nofollow",
        attribute_filter=_same_origin_only,
        filter_style_properties={"text-align"},
    )
