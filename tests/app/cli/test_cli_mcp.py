"""`blendrag mcp` finds a server as `blendrag ask` does but never works on the data dir itself: with no server
running it refuses (exit 3) and leaves the data dir as it was, even one holding a catalog, which `ask` would
have taken. Its relaying is tested end to end in tests/app/api/test_mcp.py."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from app.catalog import Catalog
from app.cli import EXIT_BUSY, NO_SERVER, main
from app.datadir_lock import LOCK_FILE


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("with_catalog", [False, True])
def test_without_a_server_it_refuses_and_leaves_the_data_dir_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], with_catalog: bool
) -> None:
    for name in ("BLENDRAG_URL", "BLENDRAG_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("BLENDRAG_RUNTIME_DIR", str(tmp_path / "run"))  # no server announced there
    monkeypatch.setenv("BLENDRAG_SERVER__PORT", str(_free_port()))  # and none on the configured port
    data = tmp_path / "data"
    if with_catalog:
        data.mkdir()
        Catalog(f"sqlite:///{data / 'catalog.db'}").close()
    before = sorted(p.name for p in data.iterdir()) if data.exists() else None
    assert main(["mcp", "--data-dir", str(data)]) == EXIT_BUSY
    out, err = capsys.readouterr()
    assert (out, err) == ("", f"error: {NO_SERVER}; `blendrag mcp` works through a running server only\n")
    assert (sorted(p.name for p in data.iterdir()) if data.exists() else None) == before
    assert not (data / LOCK_FILE).exists()
