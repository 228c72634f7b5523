"""One short transaction per call, shared by every catalog store (`Catalog`, `ConversationStore`, `KeyStore`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy.orm import Session, sessionmaker


class SessionStore:
    """A store over one `sessionmaker`: each call opens a session in a transaction, committed on exit."""

    _sessions: sessionmaker[Session]

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self._sessions = sessions

    @contextmanager
    def _session(self) -> Iterator[Session]:
        with self._sessions.begin() as session:
            yield session
