"""Serve the UI pages, their static assets and the API docs pages (no CDN: the browser loads nothing
from another host)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from fastapi import APIRouter, FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse
from fastapi.staticfiles import StaticFiles

STATIC_DIR = Path(__file__).resolve().parent / "static"
DOCS_STATIC_URL = "/static-docs"
FAVICON_URL = "/static/favicon.svg"

# Pages change with the server version; make the browser revalidate instead of showing a stale UI.
_NO_CACHE = {"Cache-Control": "no-cache"}

router = APIRouter(include_in_schema=False)


# HEAD too: uptime checks and link previews ask with HEAD (GET-only routes answer it 405).
@router.api_route("/", methods=["GET", "HEAD"])
def chat_page() -> FileResponse:
    return FileResponse(STATIC_DIR / "index.html", headers=_NO_CACHE)


@router.api_route("/admin", methods=["GET", "HEAD"])
def admin_page() -> FileResponse:
    return FileResponse(STATIC_DIR / "admin.html", headers=_NO_CACHE)


def docs_assets_dir() -> Path | None:
    """Swagger UI and ReDoc files shipped by the `fastapi-offline` wheel (None when it is not installed)."""
    spec = importlib.util.find_spec("fastapi_offline")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "static"
    return path if (path / "swagger-ui-bundle.js").is_file() else None


def mount_ui(app: FastAPI) -> None:
    app.include_router(router)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")


def mount_docs(app: FastAPI, assets: Path) -> None:
    """/docs (Swagger UI) and /redoc served from local files; create the app with docs_url=None."""
    app.mount(DOCS_STATIC_URL, StaticFiles(directory=assets), name="static-docs")
    openapi_url = app.openapi_url or "/openapi.json"

    def page(request: Request, **assets: str) -> dict[str, str]:
        """What both pages are given: the schema, the title and their asset URLs (server paths in `assets`),
        all behind the root path a proxy serves the app under."""
        root = request.scope.get("root_path", "")
        return {"openapi_url": root + openapi_url, "title": f"{app.title} · API"} | {
            name: root + path for name, path in assets.items()
        }

    @app.get("/docs", include_in_schema=False)
    def swagger_ui(request: Request) -> HTMLResponse:
        return get_swagger_ui_html(
            **page(
                request,
                swagger_js_url=f"{DOCS_STATIC_URL}/swagger-ui-bundle.js",
                swagger_css_url=f"{DOCS_STATIC_URL}/swagger-ui.css",
                swagger_favicon_url=FAVICON_URL,
            )
        )

    @app.get("/redoc", include_in_schema=False)
    def redoc(request: Request) -> HTMLResponse:
        return get_redoc_html(
            **page(request, redoc_js_url=f"{DOCS_STATIC_URL}/redoc.standalone.js", redoc_favicon_url=FAVICON_URL),
            with_google_fonts=False,
        )
