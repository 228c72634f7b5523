"""Markdown for the chat page: rendered with code as code, and nothing from a document or answer executes."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest

from app.services.render import MAX_RENDER_CHARS, render_markdown, reopen_fence


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


# A passage cut from a document may start inside a code block (issue 62, item 7b).
STARTS_INSIDE = "    return client\n```\n\nThen call it:\n\n```python\nclient.get(url)\n```\n"
STARTS_INSIDE_LONE = "client = httpx.Client()\nclient.get(url)\n```\n\nThe client keeps connections open.\n"


def test_a_passage_that_starts_inside_a_code_block_renders_its_code_as_code() -> None:
    # As plain Markdown the first fence opens a block: code reads as prose and the prose after it as code.
    assert render_markdown(STARTS_INSIDE_LONE) == (
        "<p>client = httpx.Client()\nclient.get(url)</p>\n<pre><code>\nThe client keeps connections open.\n"
        "</code></pre>\n"
    )
    assert render_markdown(STARTS_INSIDE_LONE, passage=True) == (
        "<pre><code>client = httpx.Client()\nclient.get(url)\n</code></pre>\n"
        "<p>The client keeps connections open.</p>\n"
    )
    # The fence after the first names a language: the first one closes a block, never opens one.
    assert render_markdown(STARTS_INSIDE, passage=True) == (
        "<pre><code>    return client\n</code></pre>\n<p>Then call it:</p>\n"
        '<pre><code class="language-python">client.get(url)\n</code></pre>\n'
    )


@pytest.mark.parametrize(
    "text",
    [
        "Use a client:\n```\nclient = httpx.Client()\n",  # ends inside a block it opens after a colon
        "Use a client\n\n```\nclient = httpx.Client()\n",  # ... or after a blank line
        "Install it with pip\n```\npip install httpx\n",  # code right after the fence: it opens the block
        "Text\n```\ncode\n```\n\nMore\n",  # a block opened and closed
        "```\ncode\n```\n",  # nothing before the first fence
        "```python\nclient.get(url)\n",  # a fence with a language opens
    ],
)
def test_a_passage_whose_fences_open_their_blocks_is_left_as_it_is(text: str) -> None:
    assert reopen_fence(text) == text
    assert render_markdown(text, passage=True) == render_markdown(text)
