"""`blendrag db upgrade|current` and `blendrag worker`'s refusal without PostgreSQL."""

from __future__ import annotations

from pathlib import Path

import pytest
from pgserver import pg_server, pg_url  # noqa: F401

from app.catalog import migrate as migrations
from app.cli import main


@pytest.fixture(params=["sqlite", "postgresql"])
def catalog_url(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    url = (
        f"sqlite:///{tmp_path / 'data' / 'catalog.db'}"
        if request.param == "sqlite"
        else request.getfixturevalue("pg_url")
    )
    monkeypatch.setenv("BLENDRAG_CATALOG__URL", url)
    return url


def test_db_upgrade_then_current(catalog_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    head = migrations.head_revision()
    assert main(["db", "current"]) == 1
    assert f"revision (empty), behind {head}: run `blendrag db upgrade`" in capsys.readouterr().out
    assert main(["db", "upgrade"]) == 0
    assert f"revision (empty) -> {head}" in capsys.readouterr().out
    assert main(["db", "current"]) == 0
    assert f"revision {head}, up to date" in capsys.readouterr().out


def test_db_upgrade_reports_an_unreachable_server(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("BLENDRAG_CATALOG__URL", "postgresql://someone:secret@127.0.0.1:1/nowhere")
    assert main(["db", "upgrade"]) == 1
    err = capsys.readouterr().err
    assert "error: catalog postgresql+psycopg://someone:***@127.0.0.1:1/nowhere: OperationalError" in err
    assert "secret" not in err


def test_worker_needs_postgresql(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["worker", "--data-dir", str(tmp_path)]) == 2
    assert "needs a PostgreSQL catalog" in capsys.readouterr().err
