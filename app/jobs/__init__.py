"""Ingest jobs on a PostgreSQL-backed queue (PgQueuer) for `blendrag worker`; SQLite keeps the in-process worker."""
