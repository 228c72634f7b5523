"""The web UI: a chat page at `/` and an admin page at `/admin`, plain HTML/CSS/JS served by the app,
plus the API docs pages (/docs, /redoc) on local assets."""

from app.ui.routes import STATIC_DIR, docs_assets_dir, mount_docs, mount_ui

__all__ = ["STATIC_DIR", "docs_assets_dir", "mount_docs", "mount_ui"]
