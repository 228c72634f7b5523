"""Refuse state-changing requests that a browser sends on behalf of another site.

Without an API key (the default) a multipart `POST /ingest` or a `DELETE` is something any web page the
user opens could make their browser send to a server on localhost: a multipart form is a CORS "simple"
request, sent without a preflight. Browsers say where a request comes from: `Sec-Fetch-Site` (all current
browsers) and `Origin` (on every POST, PUT, PATCH and DELETE). A request is refused (403) when those say
another origin made it, unless that origin is listed in `server.cors_origins`.

Allowed: `Sec-Fetch-Site: same-origin` or `none` (the user's own navigation), an `Origin` equal to the
server's own (`Host`) or listed in `server.cors_origins`, and requests with neither header (curl, the CLI,
SDKs: no browser, no ambient credentials to abuse). `same-site` is not enough: another port on
localhost is the same site. Safe methods (GET, HEAD, OPTIONS, so CORS preflights too) are never refused.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

logger = logging.getLogger(__name__)

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
OPENAI_PREFIX = "/v1/"


def _origin_key(origin: str) -> str | None:
    """scheme://host[:port] in lower case, default ports dropped; None for "null" or junk."""
    try:
        parts = urlsplit(origin.strip())
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    default = {"http": 80, "https": 443}[parts.scheme]
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{parts.scheme}://{host}" + (f":{port}" if port not in (None, default) else "")


def _host_key(host: str) -> str:
    """The Host header without a default port, lower case."""
    host = host.strip().lower()
    for suffix in (":80", ":443"):
        host = host.removesuffix(suffix)
    return host


class CrossSiteGuardMiddleware:
    def __init__(self, app: ASGIApp, allowed_origins: Iterable[str] = ()) -> None:
        self.app = app
        self.allow_any = "*" in allowed_origins
        self.allowed = {key for key in (_origin_key(o) for o in allowed_origins if o != "*") if key}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in SAFE_METHODS:
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        refusal = self._refusal(headers)
        if refusal is None:
            await self.app(scope, receive, send)
            return
        logger.warning("refused %s %s: %s", scope["method"], scope["path"], refusal)
        await _forbidden(scope, send, refusal)

    def _refusal(self, headers: dict[str, str]) -> str | None:
        """Why the request is refused, or None when it may go on."""
        fetch_site = headers.get("sec-fetch-site", "").strip().lower()
        origin = headers.get("origin")
        if fetch_site in ("same-origin", "none"):
            return None
        if origin is None:
            # Neither header: not a browser. A browser saying "cross-site" without an Origin: refused.
            cross = fetch_site in ("same-site", "cross-site")
            return f"a {fetch_site} request without an Origin header" if cross else None
        key = _origin_key(origin)
        if key is not None and (self.allow_any or key in self.allowed):
            return None
        own = _host_key(headers.get("host", ""))
        if key is not None and own and key.split("://", 1)[1] == own:
            return None  # the server's own pages (any scheme: a TLS proxy may sit in front)
        return f"origin {origin!r} is not this server's and not in server.cors_origins"


async def _forbidden(scope: Scope, send: Send, reason: str) -> None:
    detail = f"cross-site request refused: {reason}"
    if scope["path"].startswith(OPENAI_PREFIX):
        body = {"error": {"message": detail, "type": "permission_error", "param": None, "code": "cross_site"}}
    else:
        body = {"detail": detail}
    payload = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 403,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": payload})
