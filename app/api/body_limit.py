"""A size limit on every request body, enforced while it streams in (no route ever holds more).

JSON and other bodies may carry `server.max_body_bytes`; multipart uploads `server.max_upload_bytes` in all
(each file is also held to `ingest.max_file_bytes` by the ingest route). A declared Content-Length over the
limit is refused before a byte is read; a body that grows past it (chunked, or lying about its length) is cut
off with the same 413.
"""

from __future__ import annotations

from typing import Any

from fastapi import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class BodyTooLarge(HTTPException):
    def __init__(self, limit: int, setting: str) -> None:
        super().__init__(413, f"request body larger than the {limit}-byte limit ({setting})")


class BodySizeLimitMiddleware:
    def __init__(self, app: ASGIApp, max_body_bytes: int, max_upload_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.max_upload_bytes = max_upload_bytes

    def _limit(self, scope: Scope) -> tuple[int, str]:
        headers = dict(scope.get("headers") or [])
        content_type = headers.get(b"content-type", b"").decode("latin-1").lower()
        if content_type.startswith("multipart/"):
            return self.max_upload_bytes, "server.max_upload_bytes"
        return self.max_body_bytes, "server.max_body_bytes"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit, setting = self._limit(scope)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await _refuse(scope, send, limit, setting)
            return
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    # Raised inside the route's body read: the app's HTTPException handler answers 413.
                    raise BodyTooLarge(limit, setting)
            return message

        await self.app(scope, limited_receive, send)


async def _refuse(scope: Scope, send: Send, limit: int, setting: str) -> None:
    import json

    path: str = scope.get("path", "")
    message = BodyTooLarge(limit, setting).detail
    body: dict[str, Any] = (
        {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": "request_too_large"}}
        if path.startswith("/v1/")
        else {"detail": message}
    )
    payload = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})
