"""The composition root builds what a command needs and nothing more: `blendrag purge-failed` and
`blendrag keys` run without the model or the embedder ever being constructed."""

from __future__ import annotations

from pathlib import Path

import pytest
from hash_embedder import HashEmbedder

from app.build import build_services, new_ingest
from app.catalog import DocumentStatus
from app.cli import main
from app.services.ingest import IngestSource
from app.settings import Settings


@pytest.fixture
def no_models(monkeypatch: pytest.MonkeyPatch) -> None:
    """Constructing an engine or an embedder from here on fails the test."""
    from engine.engine import Engine
    from retrieval.embedder import Embedder

    def refuse(self, *args, **kwargs) -> None:  # noqa: ANN001, ANN002, ANN003
        raise AssertionError(f"{type(self).__name__} was constructed")

    monkeypatch.setattr(Engine, "__init__", refuse)
    monkeypatch.setattr(Embedder, "__init__", refuse)


@pytest.mark.parametrize(
    ("need", "built"),
    [
        ({"keys"}, ["catalog"]),
        ({"conversations"}, ["catalog"]),
        ({"kv_store"}, ["store"]),
        ({"documents"}, ["catalog", "store", "retriever"]),
    ],
)
def test_a_need_builds_only_its_parts(need, built, make_fast_settings, no_models) -> None:  # noqa: ANN001
    services = build_services(make_fast_settings(), need)
    try:
        assert services.built == built
        assert services.engine is None and services.scheduler is None and services.ask is None
        assert services.retriever is None or services.retriever._embedder is None  # never made
    finally:
        services.close()


def test_ingest_names_its_collaborators_and_implies_documents(make_fast_settings, fast_engine) -> None:  # noqa: ANN001
    services = build_services(make_fast_settings(), {"ingest"}, engine=fast_engine, embedder=HashEmbedder())  # type: ignore[arg-type]
    try:
        # A passed engine and embedder are the caller's: not built here.
        assert services.built == ["catalog", "store", "retriever", "scheduler"]
        assert services.ingest is not None and services.documents is not None and services.coverage is not None
        assert services.ask is None and services.keys is None and services.job_queue is None
        assert services.scheduler._thread is None  # not started: it computes in the caller's thread
    finally:
        services.close()


def test_an_unknown_need_is_refused(make_fast_settings) -> None:  # noqa: ANN001
    with pytest.raises(ValueError, match="unknown need 'everything'"):
        build_services(make_fast_settings(), {"everything"})  # type: ignore[arg-type]


def _failed_document(settings: Settings, fast_engine, tmp_path: Path) -> str:  # noqa: ANN001
    services = build_services(settings, {"ingest"}, engine=fast_engine, embedder=HashEmbedder())  # type: ignore[arg-type]
    try:
        empty = tmp_path / "empty.txt"
        empty.write_text("   \n")
        service = new_ingest(services)
        submitted = service.submit([IngestSource(kind="file", title="empty.txt", path=str(empty))], enqueue=False)
        service.run_job(submitted.job_id)
        [doc_id] = submitted.document_ids
        assert services.catalog.get_document(doc_id).status == DocumentStatus.FAILED  # type: ignore[union-attr]
        return doc_id
    finally:
        services.close()


def test_purge_failed_loads_no_model(
    make_fast_settings,
    fast_engine,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys,
    request,  # noqa: ANN001
) -> None:
    settings = make_fast_settings()
    doc_id = _failed_document(settings, fast_engine, tmp_path)
    request.getfixturevalue("no_models")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("BLENDRAG_RETRIEVAL__EMBEDDER", HashEmbedder.name)  # the index's own embedder name
    assert main(["purge-failed", "--data-dir", str(settings.data_dir)]) == 0
    assert capsys.readouterr().out == "deleted 1 failed document(s)\n"
    check = build_services(settings, {"documents"})
    try:
        assert check.catalog.get_document(doc_id) is None  # type: ignore[union-attr]
    finally:
        check.close()


def test_keys_load_no_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys, no_models) -> None:  # noqa: ANN001
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("BLENDRAG_SERVER__API_KEY", "admin-secret")
    data = str(tmp_path / "data")
    assert main(["keys", "create", "team A", "--collection", "team-a", "--data-dir", data]) == 0
    key_id = capsys.readouterr().out.split()[1]
    assert main(["keys", "list", "--data-dir", data]) == 0
    assert capsys.readouterr().out.startswith(f"{key_id}  team A  collections=team-a  ingest=no  created=")
    assert main(["keys", "revoke", key_id, "--data-dir", data]) == 0
    assert capsys.readouterr().out == f"key {key_id} revoked\n"
