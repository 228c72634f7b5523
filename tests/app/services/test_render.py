"""Markdown for the chat page: rendered with code as code, and nothing from a document or answer executes."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest

from app.services.render import MAX_RENDER_CHARS, render_markdown


def test_fences_headings_and_inline_code_render_as_html() -> None:
    html = render_markdown("### `timeout`\n\n```python\nimport httpx\nhttpx.get(url, timeout=5)\n```\n\n* one\n* two\n")
    assert html == (
        "<h3><code>timeout</code></h3>\n"
        '<pre><code class="language-python">import httpx\nhttpx.get(url, timeout=5)\n</code></pre>\n'
        "<ul>\n<li>one</li>\n<li>two</li>\n</ul>\n"
    )


def test_an_unclosed_fence_while_streaming_is_already_code() -> None:
    assert render_markdown("Try this:\n\n```python\nclient = httpx.Client(") == (
        '<p>Try this:</p>\n<pre><code class="language-python">client = httpx.Client(</code></pre>\n'
    )


@pytest.mark.parametrize(
    "hostile",
    [
        '<img src=x onerror="alert(1)">',
        "<script>alert(1)</script>",
        '<a href="javascript:alert(1)">x</a>',
        "[click](javascript:alert(1))",
        '<iframe src="https://example.org"></iframe>',
        "<svg onload=alert(1)>",
    ],
)
def test_raw_html_and_script_links_never_become_markup(hostile: str) -> None:
    tags = Tags()
    tags.feed(render_markdown(f"Before {hostile} after"))
    assert tags.seen == [("p", [])]  # the hostile markup is text inside the paragraph, nothing else


class Tags(HTMLParser):
    """The elements (and their attributes) a browser would build from the HTML."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, list[tuple[str, str | None]]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.seen.append((tag, attrs))


def test_links_get_safe_rel_and_size_is_capped() -> None:
    assert render_markdown("[httpx](https://www.python-httpx.org)") == (
        '<p><a href="https://www.python-httpx.org" rel="noopener noreferrer nofollow">httpx</a></p>\n'
    )
    with pytest.raises(ValueError, match="longer than"):
        render_markdown("x" * (MAX_RENDER_CHARS + 1))


@pytest.mark.parametrize(
    "src",
    [
        "https://tracker.example/p.gif",
        "http://tracker.example/p.gif",
        "HTTPS://tracker.example/p.gif",
        "//tracker.example/p.gif",
    ],
)
def test_remote_images_lose_their_src_and_keep_their_alt(src: str) -> None:
    assert render_markdown(f"![pixel]({src})").strip() == '<p><img alt="pixel"></p>'


def test_images_of_this_server_stay() -> None:
    assert (
        render_markdown("![logo](/static/favicon.svg)").strip() == '<p><img src="/static/favicon.svg" alt="logo"></p>'
    )
    # A backslash is percent-encoded by the Markdown parser: a path on this server, never `//host`.
    assert (
        render_markdown("![x](/\\tracker.example/p.gif)").strip()
        == '<p><img src="/%5Ctracker.example/p.gif" alt="x"></p>'
    )
