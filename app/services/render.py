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
"""

from __future__ import annotations

import functools

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


def render_markdown(text: str) -> str:
    """Sanitized HTML for `text` (Markdown). Raises ValueError past MAX_RENDER_CHARS."""
    import nh3

    if len(text) > MAX_RENDER_CHARS:
        raise ValueError(f"text is longer than {MAX_RENDER_CHARS} characters")
    html = _parser().render(text)
    return nh3.clean(
        html,
        tags=_TAGS,
        attributes=_ATTRIBUTES,
        url_schemes=_URL_SCHEMES,
        link_rel="noopener noreferrer nofollow",
        attribute_filter=_same_origin_only,
        filter_style_properties={"text-align"},
    )
