"""The pages under their own Content-Security-Policy (no bypass): they load and run with no violation, a
remote image never leaves the browser, and another origin cannot frame /admin."""

from __future__ import annotations

from typing import Any

import pytest
from apitools import LiveServer


@pytest.mark.parametrize(("path", "ready"), [("/", "#server-status .dot.ok"), ("/admin", "#card-docs")])
def test_the_pages_run_under_their_csp_with_no_violation(
    ui_server: LiveServer, browser: Any, path: str, ready: str
) -> None:
    context = browser.new_context()
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    try:
        page.goto(ui_server.url + path)
        page.wait_for_selector(ready)
        assert [e for e in errors if "status of 401" not in e] == []  # a CSP violation is a console error
        # An image that got past the renderer would still be refused by img-src 'self' data:.
        with page.expect_console_message(lambda msg: "tracker.example" in msg.text) as refused:
            page.evaluate(
                "() => { const i = document.createElement('img'); i.src = 'https://tracker.example/p.gif';"
                " document.body.append(i); }"
            )
        assert (
            "violates the following Content Security Policy directive: \"img-src 'self' data:\"" in refused.value.text
        )
    finally:
        context.close()


def test_another_origin_cannot_frame_the_admin_page(ui_server: LiveServer, browser: Any) -> None:
    context = browser.new_context()
    page = context.new_page()
    errors: list[str] = []
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    try:
        with page.expect_console_message(lambda msg: "frame-ancestors" in msg.text) as refused:
            page.set_content(f'<iframe id="f" src="{ui_server.url}/admin"></iframe>')  # about:blank: another origin
        assert (
            "violates the following Content Security Policy directive: \"frame-ancestors 'none'\"" in refused.value.text
        )
        frame = page.frame_locator("#f")
        assert frame.locator("#card-docs").count() == 0
    finally:
        context.close()
