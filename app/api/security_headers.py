"""Security headers on every response: no MIME sniffing anywhere; on HTML pages a Content-Security-Policy
and no framing.

Another local origin could frame `/admin`, which shows keys and collections with the admin key the page
keeps in the browser's storage; `frame-ancestors 'none'` (and `X-Frame-Options: DENY` for older browsers)
stops that. The UI pages load only their own scripts and styles (`script-src 'self'`: no inline script, no
eval) and images from this server or `data:` only, so a remote image in a rendered document or answer can
never ping another host (the renderer drops them too, app/services/render.py). Inline `style` attributes
stay allowed: the pages and rendered tables use them for alignment, and a style cannot run code.

The API docs pages (`/docs`, `/redoc`) run FastAPI's inline start-up script, so they get only the framing
rules.
"""

from __future__ import annotations

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

PAGE_CSP = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self' 'unsafe-inline'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "font-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ]
)
DOCS_CSP = "frame-ancestors 'none'"
DOCS_PATHS = ("/docs", "/redoc")


class SecurityHeadersMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                headers.setdefault("X-Content-Type-Options", "nosniff")
                if headers.get("content-type", "").startswith("text/html"):
                    docs = path.startswith(DOCS_PATHS)
                    headers.setdefault("Content-Security-Policy", DOCS_CSP if docs else PAGE_CSP)
                    headers.setdefault("X-Frame-Options", "DENY")
                    headers.setdefault("Referrer-Policy", "same-origin")
            await send(message)

        await self.app(scope, receive, send_with_headers)
