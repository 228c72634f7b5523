"""A web page on another port cannot make the user's browser ingest into (or delete from) a local server
without an API key; an origin listed in `server.cors_origins` can. Real chromium, real uvicorn."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from apitools import LiveServer, server_settings

from app.main import create_app

pytestmark = pytest.mark.browser

PAGE = b"<!doctype html><title>some other site</title><p>hello</p>"
INGEST_JS = """async ([api, mode]) => {
  const form = new FormData();
  form.append("documents", JSON.stringify([{title: "planted", text: "Text a foreign page planted."}]));
  try {
    const response = await fetch(api + "/ingest", {method: "POST", body: form, mode});
    return mode === "no-cors" ? "opaque" : response.status;
  } catch (e) { return "blocked"; }
}"""


class _Page(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(PAGE)))
        self.end_headers()
        self.wfile.write(PAGE)

    def log_message(self, *args: Any) -> None:
        return None


@pytest.fixture(scope="module")
def pages() -> Iterator[tuple[str, str]]:
    """Two plain web pages on other ports of 127.0.0.1: (allowed origin, foreign origin)."""
    servers = [ThreadingHTTPServer(("127.0.0.1", 0), _Page) for _ in range(2)]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    yield tuple(f"http://127.0.0.1:{s.server_address[1]}" for s in servers)  # type: ignore[misc]
    for server in servers:
        server.shutdown()


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path, pages: tuple[str, str]) -> Iterator[str]:
    settings = server_settings(
        tmp_path_factory.mktemp("xsite") / "data", tiny_llama_dir, server={"cors_origins": [pages[0]]}
    )
    with LiveServer(create_app(settings, load_in_background=False)) as server:
        yield server.url


def _num_jobs(api: str) -> int:
    return len(httpx.get(f"{api}/ingest/jobs").json()["jobs"])


def test_foreign_page_cannot_ingest_but_an_allowed_origin_can(browser: Any, api: str, pages: tuple[str, str]) -> None:
    allowed, foreign = pages
    context = browser.new_context()
    try:
        page = context.new_page()
        page.goto(foreign)
        # no-cors: the browser sends the multipart POST without a preflight, the page just can't read the answer
        assert page.evaluate(INGEST_JS, [api, "no-cors"]) == "opaque"
        assert page.evaluate(INGEST_JS, [api, "cors"]) == "blocked"
        assert _num_jobs(api) == 0  # nothing was queued
        page.goto(allowed)
        assert page.evaluate(INGEST_JS, [api, "cors"]) == 202
        assert _num_jobs(api) == 1
        # the server's own pages keep working (same origin)
        page.goto(f"{api}/")
        assert page.evaluate(INGEST_JS, ["", "same-origin"]) in (202,)
    finally:
        context.close()


def test_what_the_guard_lets_through(api: str, pages: tuple[str, str]) -> None:
    host = api.removeprefix("http://")
    body = {"documents": [{"title": "t", "text": "Some words here."}]}
    foreign = httpx.post(f"{api}/ingest", json=body, headers={"Origin": pages[1], "Sec-Fetch-Site": "same-site"})
    assert foreign.status_code == 403
    assert foreign.json()["detail"].startswith(f"cross-site request refused: origin '{pages[1]}'")
    assert httpx.delete(f"{api}/documents/x", headers={"Origin": "null"}).status_code == 403
    assert httpx.delete(f"{api}/documents/x", headers={"Sec-Fetch-Site": "cross-site"}).status_code == 403
    assert httpx.get(f"{api}/documents", headers={"Origin": pages[1]}).status_code == 200  # reads are safe
    assert httpx.delete(f"{api}/documents/x").status_code == 204  # no browser headers: curl, the CLI
    assert httpx.delete(f"{api}/documents/x", headers={"Origin": f"http://{host}"}).status_code == 204
    assert httpx.delete(f"{api}/documents/x", headers={"Sec-Fetch-Site": "same-origin"}).status_code == 204
    chat = httpx.post(f"{api}/v1/chat/completions", json={"messages": []}, headers={"Origin": "https://evil.test"})
    assert chat.status_code == 403 and chat.json()["error"]["code"] == "cross_site"
