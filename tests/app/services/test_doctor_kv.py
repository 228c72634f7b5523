"""doctor reads KV entries whole (a bounded sample): a corrupt entry on disk is a problem it reports, and
--repair deletes and recomputes it. Real files corrupted on disk, the fast stack (tests/app/conftest.py)."""

from __future__ import annotations

from app.build import Services, new_ingest
from app.services.doctor import run_doctor
from app.services.ingest import IngestSource


def test_doctor_finds_a_corrupt_kv_entry_and_repair_recomputes_it(services: Services) -> None:
    service = new_ingest(services)
    texts = ["Quintaro is the capital of Zorblat.", "Sourdough needs flour, water and salt.", "The Moon orbits."]
    submitted = service.submit([IngestSource(kind="text", title=f"T{i}", text=t) for i, t in enumerate(texts)])
    assert service.run_job(submitted.job_id).status.value == "succeeded"
    chunks = sorted(services.catalog.iter_chunks(), key=lambda c: c.id)
    victim = chunks[1]
    path = services.store.disk.path_for(victim.kv_key)  # type: ignore[union-attr]
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF  # one byte of a tensor: the checksum no longer matches
    path.write_bytes(bytes(data))
    services.store.memory.delete(victim.kv_key)  # type: ignore[union-attr]  # only the disk copy remains

    report = run_doctor(services.doctor_parts(), repair=False)
    assert (report.kv_corrupt_keys, report.num_kv_checked) == ([victim.kv_key], 3)
    assert report.kv_missing_chunk_ids == [victim.id] and report.problems == 1
    assert path.exists()  # reported, not removed, without --repair

    repaired = run_doctor(services.doctor_parts(), repair=True)
    assert repaired.kv_corrupt_keys == [victim.kv_key]
    clean = run_doctor(services.doctor_parts(), repair=False)
    assert (clean.kv_corrupt_keys, clean.kv_missing_chunk_ids, clean.problems) == ([], [], 0)
