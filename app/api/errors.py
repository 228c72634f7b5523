"""Error bodies: `{"detail": "<one readable line>"}` everywhere, OpenAI's `{"error": {...}}` under /v1.

FastAPI's default 422 body is a list of pydantic error dicts; clients (and the web UI) want one message
they can show. The list is still there, under `errors`, for programs.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

logger = logging.getLogger(__name__)

OPENAI_PREFIX = "/v1/"

_OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "server_error",
}


# A Retry-After past an hour is not advice a client can use: it is told again when it comes back.
MAX_RETRY_AFTER_S = 3600


def retry_after(seconds: float) -> dict[str, str]:
    """The Retry-After header every 429 and 503 carries: the seconds to wait, rounded up, at least 1."""
    return {"Retry-After": str(max(1, math.ceil(min(seconds, MAX_RETRY_AFTER_S))))}


def openai_error(
    status: int,
    message: str,
    *,
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    """An error in the shape OpenAI clients parse (`openai.APIStatusError.message` shows `message`)."""
    body = {
        "error": {"message": message, "type": _OPENAI_TYPES.get(status, "server_error"), "param": param, "code": code}
    }
    return JSONResponse(body, status_code=status, headers=headers)


def _where(loc: tuple[Any, ...] | list[Any]) -> str:
    # ("body", "mode") -> "mode"; query/path parameters keep their source: "query.limit".
    parts = [str(p) for p in loc]
    if parts and parts[0] == "body":
        parts = parts[1:]
    return ".".join(parts) or "body"


def validation_message(exc: RequestValidationError | ValidationError) -> str:
    """One line for every error of a request body (or an MCP tool's arguments): `field: message; …`."""
    lines = []
    for err in exc.errors():
        msg = str(err.get("msg", "invalid"))
        # pydantic prefixes messages of custom validators with "Value error, ".
        msg = msg.removeprefix("Value error, ")
        lines.append(f"{_where(err.get('loc', ()))}: {msg}")
    return "; ".join(lines) or "invalid request"


async def _on_validation(request: Request, exc: RequestValidationError) -> JSONResponse:
    message = validation_message(exc)
    if request.url.path.startswith(OPENAI_PREFIX):
        first = exc.errors()[0] if exc.errors() else {}
        return openai_error(400, message, param=_where(first.get("loc", ())) if first else None)
    errors = [{"loc": list(e.get("loc", ())), "msg": e.get("msg"), "type": e.get("type")} for e in exc.errors()]
    return JSONResponse({"detail": message, "errors": errors}, status_code=422)


_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def allowed_methods(request: Request) -> list[str]:
    """Every method some route serves at this path (Starlette's 405 names only the first route's)."""
    from starlette.routing import Match, Mount

    methods: set[str] = set()
    # A fresh scope: a mount on the way here (static files) has rewritten root_path in the request's own.
    scope = {"type": "http", "path": request.url.path, "root_path": "", "path_params": {}}
    for route in request.app.router.routes:
        if type(route) is Mount:  # static files: read-only
            if route.matches({**scope, "method": "GET"})[0] == Match.FULL:
                methods.update(("GET", "HEAD"))
            continue
        methods.update(m for m in _METHODS if route.matches({**scope, "method": m})[0] == Match.FULL)
    return [m for m in _METHODS if m in methods]


async def _on_http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    headers = dict(exc.headers or {})
    if exc.status_code == 405:
        headers["Allow"] = ", ".join(allowed_methods(request))
    if request.url.path.startswith(OPENAI_PREFIX):
        return openai_error(exc.status_code, str(exc.detail), headers=headers)
    return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=headers)


STORAGE_FULL_DETAIL = (
    "insufficient storage: the disk or the catalog database is full; nothing was changed "
    "by this request — free space under the data dir and retry"
)


async def _on_storage_error(request: Request, exc: Exception) -> JSONResponse:
    """507 for "no space left" (ENOSPC, SQLite full); anything else is a real 500."""
    from app.services.storage_faults import is_storage_full

    if not is_storage_full(exc):
        raise exc
    logger.error("storage full during %s %s: %s", request.method, request.url.path, exc)
    state = getattr(request.app.state, "blendrag", None)
    if state is not None:
        state.storage.record(f"{type(exc).__name__}: {exc}")
    if request.url.path.startswith(OPENAI_PREFIX):
        return openai_error(507, STORAGE_FULL_DETAIL, code="insufficient_storage")
    return JSONResponse({"detail": STORAGE_FULL_DETAIL}, status_code=507)


def install_error_handlers(app: FastAPI) -> None:
    from sqlalchemy.exc import OperationalError

    app.add_exception_handler(RequestValidationError, _on_validation)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _on_http)  # type: ignore[arg-type]
    app.add_exception_handler(OSError, _on_storage_error)
    app.add_exception_handler(OperationalError, _on_storage_error)
