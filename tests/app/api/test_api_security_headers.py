"""Security headers: the pages carry a Content-Security-Policy and refuse framing; nothing is MIME-sniffed."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from app.api.security_headers import PAGE_CSP

EXPECTED_PAGE_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)


@pytest.mark.parametrize("path", ["/", "/admin"])
def test_pages_carry_a_csp_and_refuse_framing(client: TestClient, path: str) -> None:
    for method in ("GET", "HEAD"):
        response = client.request(method, path)
        assert response.status_code == 200, (method, response.text)
        assert response.headers["content-security-policy"] == EXPECTED_PAGE_CSP == PAGE_CSP
        assert response.headers["x-frame-options"] == "DENY"
        assert response.headers["x-content-type-options"] == "nosniff"
        assert response.headers["referrer-policy"] == "same-origin"
    assert client.head(path).content == b""


def test_static_files_and_api_answers_are_not_sniffed(client: TestClient) -> None:
    for path in ("/static/js/chat.js", "/static/css/app.css", "/health", "/nope"):
        response = client.get(path)
        assert response.headers["x-content-type-options"] == "nosniff", path
        assert "content-security-policy" not in response.headers, path


def test_the_api_docs_pages_refuse_framing(client: TestClient) -> None:
    response = client.get("/docs")
    assert response.status_code == 200
    assert response.headers["content-security-policy"] == "frame-ancestors 'none'"
    assert response.headers["x-frame-options"] == "DENY"
