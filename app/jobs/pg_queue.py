"""The ingest job queue on PostgreSQL, through PgQueuer (https://github.com/janbjorge/pgqueuer).

Why PgQueuer: it keeps the queue in the catalog's own PostgreSQL (no broker to run), wakes workers with
LISTEN/NOTIFY, and re-hands a job whose worker stopped sending heartbeats to another worker by itself
(`heartbeat_timeout`): exactly what surviving a SIGKILLed worker needs, with nothing home-made.
Procrastinate was the other candidate; it finds stalled jobs only through a periodic task the app must
write and schedule. The queue row carries just the catalog job id: the catalog's `ingest_jobs` row stays the
record of progress, errors and cancellation, whichever worker runs the job.

The queue's tables are created by catalog migration 0003 (PostgreSQL only).
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from sqlalchemy.engine import make_url

if TYPE_CHECKING:
    from app.catalog import Catalog

logger = logging.getLogger(__name__)

ENTRYPOINT = "blendrag.ingest"
INSTALL_HINT = "the PostgreSQL catalog needs its extra: pip install 'blendrag[postgres]' (psycopg, pgqueuer)"


def libpq_url(sqlalchemy_url: str) -> str:
    """`postgresql+psycopg://u:p@h/db` → `postgresql://u:p@h/db`, what psycopg connects to."""
    return make_url(sqlalchemy_url).set(drivername="postgresql").render_as_string(hide_password=False)


def install_sql() -> str:
    """The DDL of PgQueuer's tables, types and triggers (used by the Alembic migration)."""
    from pgqueuer.adapters.persistence.qb import QueryBuilderEnvironment

    return QueryBuilderEnvironment().build_install_query(create_schema=False)


def uninstall_sql() -> str:
    from pgqueuer.adapters.persistence.qb import QueryBuilderEnvironment

    return QueryBuilderEnvironment().build_uninstall_query()


class PgJobQueue:
    """Enqueue side, used by the API replicas (synchronous; one autocommit connection, reopened if lost)."""

    def __init__(self, catalog_url: str) -> None:
        try:
            import psycopg  # noqa: F401
            from pgqueuer.adapters.persistence.queries import SyncQueries  # noqa: F401
        except ImportError as exc:
            raise RuntimeError(INSTALL_HINT) from exc
        self._dsn = libpq_url(catalog_url)
        self._lock = threading.Lock()
        self._conn = None  # psycopg.Connection

    def enqueue(self, job_id: str) -> bool:
        """Hand a catalog job to the workers. The job id is the dedupe key: a job waiting or running in the
        queue is not queued twice. Returns whether it was queued now."""
        import psycopg
        from pgqueuer.adapters.drivers.psycopg import SyncPsycopgDriver
        from pgqueuer.adapters.persistence.queries import SyncQueries

        with self._lock:
            for attempt in (1, 2):
                try:
                    if self._conn is None or self._conn.closed:
                        self._conn = psycopg.connect(self._dsn, autocommit=True)
                    queued = SyncQueries(SyncPsycopgDriver(self._conn)).enqueue(
                        ENTRYPOINT, job_id.encode(), dedupe_key=job_id, on_conflict="skip"
                    )
                    return queued[0] is not None
                except psycopg.OperationalError:
                    # A connection the server dropped (restart, idle timeout): reconnect once.
                    if self._conn is not None:
                        self._conn.close()
                    self._conn = None
                    if attempt == 2:
                        raise
        return False

    def requeue_unfinished(self, catalog: Catalog) -> list[str]:
        """Queue every unfinished catalog job the queue does not hold (its enqueue was lost, or it was
        recorded while the catalog ran without workers). Returns the ids queued now."""
        from app.catalog import JobStatus

        jobs = catalog.jobs_with_status([JobStatus.QUEUED, JobStatus.RUNNING])
        return [job.id for job in jobs if self.enqueue(job.id)]

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
