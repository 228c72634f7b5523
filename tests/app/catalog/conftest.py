from pgserver import pg_server, pg_url  # noqa: F401  (a real PostgreSQL server, see tests/pgserver.py)
