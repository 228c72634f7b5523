"""`Closing`: the base of the readers and sources used as `with x:`, whose exit is their `close()`."""

from __future__ import annotations

from types import TracebackType
from typing import Self


class Closing:
    """`with x:` hands back `x` and calls `x.close()` on the way out (an exception included)."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
