"""`blendrag sync`'s service end to end on the fast stand-ins: a folder scanned, planned, ingested and finished
through `LocalTarget`, the collection checked against the folder after each change."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from app.build import Services
from app.catalog import DocumentStatus
from app.services.doctor import run_doctor
from app.services.folder_sync.runner import SyncReport, run_sync
from app.services.folder_sync.scan import FolderError
from app.services.folder_sync.service import FolderSyncService, Removal, SyncRefused, SyncRequest
from app.services.folder_sync.targets import LocalTarget
from app.services.folder_sync.watch import watch_folder
from app.services.ingest import IngestSource
from app.settings import Settings

PARAGRAPHS = [
    "Quintaro is the capital of the planet Zorblat, and its rivers run purple in spring.",
    "Sourdough needs flour, water, salt and a starter; it bakes at 250 degrees for forty minutes.",
    "The Moon orbits the Earth every 27.3 days and always shows the same face to us.",
    "Kites fly over Quintaro every May, when the wind comes down from the violet hills.",
]


@pytest.fixture
def settings(make_fast_settings: Callable[..., Settings]) -> Settings:
    # Small chunks: a file of four paragraphs is several chunks, so a one-paragraph change leaves most alone.
    return make_fast_settings(ingest={"chunk_tokens": 32, "chunk_overlap": 0})


@pytest.fixture
def services(make_fast_services: Callable[[Settings], Services], settings: Settings) -> Services:
    return make_fast_services(settings)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    root = tmp_path / "notes"
    (root / "sub").mkdir(parents=True)
    (root / "zorblat.md").write_text("# Zorblat\n\n" + "\n\n".join(PARAGRAPHS) + "\n")
    (root / "sub" / "bread.txt").write_text("Rye bread rises slowly in a cold kitchen overnight.\n")
    (root / "moon.txt").write_text("Phobos circles Mars three times a day, low over the dust.\n")
    (root / ".hidden.md").write_text("never synced\n")
    (root / ".git-like").mkdir()
    (root / ".git-like" / "inside.md").write_text("never synced\n")
    (root / "picture.png").write_bytes(b"\x89PNG not a document")
    return root


def sync(services: Services, folder: Path, collection: str = "notes", **kwargs: bool) -> SyncReport:
    assert services.catalog is not None and services.documents is not None and services.ingest is not None
    target = LocalTarget(
        FolderSyncService(services.catalog, services.documents), services.ingest, services.settings.uploads_dir
    )
    settings = services.settings.ingest
    return run_sync(
        folder,
        target,
        collection,
        extensions=settings.allowed_extensions,
        max_file_bytes=settings.max_file_bytes,
        replace_collection=kwargs.get("replace", False),
    )


def ready_sources(services: Services, collection: str = "notes") -> dict[str, str]:
    """source path -> title of the collection's documents, all of them ready."""
    assert services.catalog is not None
    docs = services.catalog.all_documents([collection])
    assert {d.status for d in docs} <= {DocumentStatus.READY}, [(d.source_path, d.status, d.error) for d in docs]
    return {d.source_path or "": d.title for d in docs}


def changes(report: SyncReport) -> dict[str, int]:
    return report.outcome.changes.as_dict()


def doctor_problems(services: Services) -> int:
    return run_doctor(services.doctor_parts(), repair=False).problems


def test_a_folder_synced_added_changed_removed(services: Services, folder: Path) -> None:
    assert services.catalog is not None and services.retriever is not None and services.store is not None
    first = sync(services, folder)
    assert changes(first) == {"added": 3, "changed": 0, "removed": 0, "unchanged": 0, "failed": 0, "skipped": 0}
    assert ready_sources(services) == {"zorblat.md": "Zorblat", "sub/bread.txt": "bread.txt", "moon.txt": "moon.txt"}
    num_chunks = services.retriever.count
    assert first.ingest.kv["computed"] == first.ingest.kv["total"] == num_chunks
    assert services.catalog.syncs.get("notes").changes == changes(first)  # type: ignore[union-attr]
    assert services.catalog.syncs.get("notes").folder == str(folder.resolve())  # type: ignore[union-attr]

    again = sync(services, folder)
    assert changes(again) == {"added": 0, "changed": 0, "removed": 0, "unchanged": 3, "failed": 0, "skipped": 0}
    assert again.ingest.job_ids == []  # nothing changed, nothing ingested

    # One paragraph of the four changes: only the chunk that holds it is computed; the rest keep their KV.
    old_zorblat = next(d for d in services.catalog.all_documents(["notes"]) if d.source_path == "zorblat.md")
    old_keys = {c.kv_key for c in services.catalog.chunks_of(old_zorblat.id)}
    text = (folder / "zorblat.md").read_text().replace("every May", "every June")
    (folder / "zorblat.md").write_text(text)
    changed = sync(services, folder)
    assert changes(changed) == {"added": 0, "changed": 1, "removed": 0, "unchanged": 2, "failed": 0, "skipped": 0}
    new_zorblat = next(d for d in services.catalog.all_documents(["notes"]) if d.source_path == "zorblat.md")
    new_keys = {c.kv_key for c in services.catalog.chunks_of(new_zorblat.id)}
    assert new_zorblat.id != old_zorblat.id and services.catalog.get_document(old_zorblat.id) is None
    assert changed.ingest.kv["computed"] == len(new_keys - old_keys) == 1
    assert changed.ingest.kv["total"] == len(new_keys) > 1
    for key in old_keys - new_keys:  # the replaced chunk's KV went with the old version
        assert not services.store.contains(key)
    assert services.retriever.count == num_chunks
    assert doctor_problems(services) == 0

    # A deleted file: its document, index entries and KV are gone.
    moon = next(d for d in services.catalog.all_documents(["notes"]) if d.source_path == "moon.txt")
    moon_keys = {c.kv_key for c in services.catalog.chunks_of(moon.id)}
    moon_chunks = len(moon_keys)
    (folder / "moon.txt").unlink()
    (folder / "sub" / "new.md").write_text("# New\n\nA new note about comets.\n")
    removed = sync(services, folder)
    assert changes(removed) == {"added": 1, "changed": 0, "removed": 1, "unchanged": 2, "failed": 0, "skipped": 0}
    assert ready_sources(services) == {"zorblat.md": "Zorblat", "sub/bread.txt": "bread.txt", "sub/new.md": "New"}
    assert services.catalog.get_document(moon.id) is None
    assert all(not services.store.contains(k) for k in moon_keys)
    new_doc = next(d for d in services.catalog.all_documents(["notes"]) if d.source_path == "sub/new.md")
    assert services.retriever.count == num_chunks - moon_chunks + new_doc.num_chunks
    assert doctor_problems(services) == 0


def test_identical_files_are_stored_once_and_a_sync_stays_level(services: Services, folder: Path) -> None:
    (folder / "copy.txt").write_bytes((folder / "moon.txt").read_bytes())
    first = sync(services, folder)
    assert changes(first) == {"added": 4, "changed": 0, "removed": 0, "unchanged": 0, "failed": 0, "skipped": 0}
    assert sorted(ready_sources(services)) == ["copy.txt", "sub/bread.txt", "zorblat.md"]  # the first in order
    assert changes(sync(services, folder))["unchanged"] == 4
    # copy.txt goes: moon.txt's bytes are now stored under its own path.
    (folder / "copy.txt").unlink()
    after = sync(services, folder)
    assert changes(after) == {"added": 1, "changed": 0, "removed": 1, "unchanged": 2, "failed": 0, "skipped": 0}
    assert sorted(ready_sources(services)) == ["moon.txt", "sub/bread.txt", "zorblat.md"]
    assert doctor_problems(services) == 0


def test_a_collection_holding_other_documents_or_following_another_folder_is_refused(
    services: Services, folder: Path, tmp_path: Path
) -> None:
    assert services.ingest is not None and services.catalog is not None
    source = IngestSource(kind="text", title="Mine", text="A document ingested by hand.", source_path="mine")
    job = services.ingest.run_job(services.ingest.submit([source], enqueue=False, collection="notes").job_id)
    assert job.status.value == "succeeded"
    with pytest.raises(SyncRefused, match=r"holds documents of 1 source\(s\) that are not files of .*\(mine\)"):
        sync(services, folder)
    assert ready_sources(services) == {"mine": "Mine"}  # nothing was changed
    assert services.catalog.syncs.get("notes") is None

    assert changes(sync(services, folder, replace=True))["removed"] == 1
    assert sorted(ready_sources(services)) == ["moon.txt", "sub/bread.txt", "zorblat.md"]
    other = tmp_path / "other"
    other.mkdir()
    (other / "a.txt").write_text("Another folder.\n")
    with pytest.raises(SyncRefused, match=r"collection 'notes' is kept equal to the folder .*notes, not .*other"):
        sync(services, other)
    assert sorted(ready_sources(services)) == ["moon.txt", "sub/bread.txt", "zorblat.md"]
    assert changes(sync(services, other, "other"))["added"] == 1  # its own collection


def test_unreadable_files_keep_their_documents(services: Services, folder: Path) -> None:
    (folder / "loop.md").write_text("# Loop\n\nA note that becomes a symlink loop.\n")
    assert changes(sync(services, folder))["added"] == 4
    # A symlink loop cannot be read now: held, its document stays (an unreadable file or folder is held the same
    # way: tests/app/services/folder_sync/test_scan.py, as a user chmod binds). A FIFO and a symlinked folder are
    # no files of the folder: left out with their reason.
    (folder / "loop.md").unlink()
    (folder / "loop.md").symlink_to(folder / "loop.md")
    os.mkfifo(folder / "pipe.txt")
    (folder / "elsewhere").symlink_to(folder / "sub", target_is_directory=True)
    report = sync(services, folder)
    skipped = {s.source: (s.reason, s.held) for s in report.skipped}
    assert skipped == {
        "loop.md": ("symlink loop", True),
        "pipe.txt": ("not a regular file", False),
        "elsewhere/": ("symlinked folder: not followed", False),
    }
    assert changes(report) == {"added": 0, "changed": 0, "removed": 0, "unchanged": 3, "failed": 0, "skipped": 3}
    assert sorted(ready_sources(services)) == ["loop.md", "moon.txt", "sub/bread.txt", "zorblat.md"]
    (folder / "loop.md").unlink()  # gone for good now: removed
    assert changes(sync(services, folder))["removed"] == 1
    assert sorted(ready_sources(services)) == ["moon.txt", "sub/bread.txt", "zorblat.md"]


def test_a_missing_path_or_a_file_is_a_clear_error(services: Services, tmp_path: Path) -> None:
    with pytest.raises(FolderError, match=r"missing: no such folder$"):
        sync(services, tmp_path / "missing")
    (tmp_path / "file.md").write_text("# A file\n")
    with pytest.raises(FolderError, match=r"file.md: not a folder"):
        sync(services, tmp_path / "file.md")


class ChangingTarget(LocalTarget):
    """The real local target, with a change made to the folder at a chosen step (between the plan and the copy)."""

    def __init__(self, services: Services, change: Callable[[], None]) -> None:
        assert services.catalog is not None and services.documents is not None and services.ingest is not None
        super().__init__(
            FolderSyncService(services.catalog, services.documents), services.ingest, services.settings.uploads_dir
        )
        self._change = change

    def remove_gone(self, request: SyncRequest) -> Removal:
        removal = super().remove_gone(request)
        self._change()  # after the scan and plan, before the files are copied
        return removal


def test_files_changing_or_deleted_during_the_sync(services: Services, folder: Path) -> None:
    def change() -> None:
        (folder / "zorblat.md").write_text("# Zorblat\n\nRewritten while the sync ran.\n")
        (folder / "moon.txt").unlink()

    settings = services.settings.ingest
    report = run_sync(
        folder,
        ChangingTarget(services, change),
        "notes",
        extensions=settings.allowed_extensions,
        max_file_bytes=settings.max_file_bytes,
    )
    # zorblat.md is ingested as its copy has it, under the copy's hash; moon.txt was never stored: left out.
    assert changes(report) == {"added": 2, "changed": 0, "removed": 0, "unchanged": 0, "failed": 0, "skipped": 1}
    assert [(s.source, s.reason) for s in report.skipped] == [("moon.txt", "deleted during the sync")]
    assert report.changed_during == ["moon.txt", "zorblat.md"]
    assert services.catalog is not None
    zorblat = next(d for d in services.catalog.all_documents(["notes"]) if d.source_path == "zorblat.md")
    assert [c.text.strip() for c in services.catalog.chunks_of(zorblat.id)] == [
        "# Zorblat",
        "Rewritten while the sync ran.",
    ]
    assert sorted(ready_sources(services)) == ["sub/bread.txt", "zorblat.md"]
    # The next sync finds the folder level with the collection.
    assert changes(sync(services, folder))["unchanged"] == 2


def test_watch_syncs_after_a_burst_of_changes(services: Services, folder: Path) -> None:
    sync(services, folder)
    stop = threading.Event()
    reports: list[SyncReport] = []

    def once() -> None:
        reports.append(sync(services, folder))
        stop.set()  # one burst is enough here

    watcher = threading.Thread(target=watch_folder, args=(folder, once), kwargs={"debounce_ms": 200, "stop": stop})
    watcher.start()
    time.sleep(0.5)  # the watcher is listening (the sync below happens only after a change it sees)
    (folder / "late.md").write_text("# Late\n\nWritten while watched.\n")
    (folder / ".hidden.md").write_text("a hidden change alone would not sync\n")
    watcher.join(timeout=60)
    assert not watcher.is_alive()
    assert [changes(r)["added"] for r in reports] == [1]
    assert "late.md" in ready_sources(services)
