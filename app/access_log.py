"""Keep routine polling out of uvicorn's access log.

The admin page and `blendrag ingest` follow jobs and statistics; load balancers probe /health and /ready.
One line per poll drowned the log (520 lines for one ingest), so successful GETs of those routes are not
logged; every other request, and any poll that fails, still is.
"""

from __future__ import annotations

import logging

POLLED_PREFIXES = ("/ingest/jobs", "/health", "/ready", "/api/stats", "/api/coverage", "/metrics")


class PollingFilter(logging.Filter):
    """Drops uvicorn access records `(client, method, path, http_version, status)` of successful GETs of
    polled routes."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if not isinstance(args, tuple) or len(args) != 5:
            return True
        _, method, path, _, status = args
        if method != "GET" or not isinstance(status, int) or status >= 400:
            return True
        return not str(path).split("?", 1)[0].startswith(POLLED_PREFIXES)


def install_polling_filter() -> None:
    access = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, PollingFilter) for f in access.filters):
        access.addFilter(PollingFilter())
