"""KV coverage of the library: which chunks can be served from a fresh cached entry.

For each `ChunkRef(chunk_id, document_id, expected_key, recorded_key)`:
- expected_key: the key under the current model / prefix / storage dtype (`TieredKVStore.key_for`);
- recorded_key: the key written when the chunk was ingested (None if it never was).

State: **fresh** if the expected key is present in some tier; **stale** if not fresh but the recorded
key is present and differs from the expected one (the model, prompt template or dtype changed since
ingest); **missing** otherwise. coverage = num_fresh / num_chunks (1.0 for zero chunks: nothing to do).
Fresh entries are also counted per tier holding them (`fresh_by_tier`, `bytes_by_tier`; an entry in
memory and on disk counts in both), and `ChunkCoverage.tier` is the tier a read would be served from.

    compute_coverage(store: TieredKVStore, refs: Iterable[ChunkRef]) -> CoverageReport

Presence is looked up with one `store.locate_many` call (a single Redis round trip).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from kvcache.store import EntryLocation, TieredKVStore

ChunkId = int | str
DocumentId = int | str


@dataclass(frozen=True)
class ChunkRef:
    chunk_id: ChunkId
    document_id: DocumentId
    expected_key: str
    recorded_key: str | None = None


class ChunkState(StrEnum):
    """A chunk's stored KV. OUTDATED: an entry exists, under a key this engine no longer reads (another model,
    system prompt or template). Its wire value stays "stale", as the API and admin page have always said; inside
    the code "stale" names only the blend's stored keys left unrecomputed (engine/blend)."""

    FRESH = "fresh"
    OUTDATED = "stale"
    MISSING = "missing"


@dataclass(frozen=True)
class ChunkCoverage:
    ref: ChunkRef
    state: ChunkState
    tier: str | None  # fresh only: the tier serving reads
    num_bytes: int  # fresh only: size in that tier, else 0


@dataclass(frozen=True)
class CoverageCounts:
    num_chunks: int = 0
    num_fresh: int = 0
    num_outdated: int = 0
    num_missing: int = 0
    fresh_by_tier: dict[str, int] = field(default_factory=dict)
    bytes_by_tier: dict[str, int] = field(default_factory=dict)

    @property
    def coverage(self) -> float:
        return self.num_fresh / self.num_chunks if self.num_chunks else 1.0


@dataclass(frozen=True)
class CoverageReport:
    total: CoverageCounts
    documents: dict[DocumentId, CoverageCounts]  # in first-seen order
    chunks: tuple[ChunkCoverage, ...]  # in input order

    def chunk_ids(self, state: ChunkState) -> list[ChunkId]:
        """E.g. the stale + missing chunk ids a re-precompute job should process."""
        return [c.ref.chunk_id for c in self.chunks if c.state == state]


class _Tally:
    def __init__(self) -> None:
        self.states: Counter[ChunkState] = Counter()
        self.fresh_by_tier: Counter[str] = Counter()
        self.bytes_by_tier: Counter[str] = Counter()

    def add(self, state: ChunkState, location: EntryLocation | None) -> None:
        self.states[state] += 1
        if state == ChunkState.FRESH and location is not None:
            for tier in location.tiers:
                self.fresh_by_tier[tier] += 1
                self.bytes_by_tier[tier] += location.num_bytes_by_tier[tier]

    def freeze(self) -> CoverageCounts:
        return CoverageCounts(
            num_chunks=sum(self.states.values()),
            num_fresh=self.states[ChunkState.FRESH],
            num_outdated=self.states[ChunkState.OUTDATED],
            num_missing=self.states[ChunkState.MISSING],
            fresh_by_tier=dict(self.fresh_by_tier),
            bytes_by_tier=dict(self.bytes_by_tier),
        )


def classify(ref: ChunkRef, locations: dict[str, EntryLocation]) -> ChunkCoverage:
    fresh = locations.get(ref.expected_key)
    if fresh is not None:
        return ChunkCoverage(
            ref=ref, state=ChunkState.FRESH, tier=fresh.tier, num_bytes=fresh.num_bytes_by_tier[fresh.tier]
        )
    if ref.recorded_key is not None and ref.recorded_key != ref.expected_key and ref.recorded_key in locations:
        return ChunkCoverage(ref=ref, state=ChunkState.OUTDATED, tier=None, num_bytes=0)
    return ChunkCoverage(ref=ref, state=ChunkState.MISSING, tier=None, num_bytes=0)


def compute_coverage(store: TieredKVStore, refs: Iterable[ChunkRef]) -> CoverageReport:
    refs = list(refs)
    wanted = [r.expected_key for r in refs] + [r.recorded_key for r in refs if r.recorded_key]
    locations = store.locate_many(wanted)
    total = _Tally()
    per_doc: dict[DocumentId, _Tally] = {}
    chunks: list[ChunkCoverage] = []
    for ref in refs:
        cov = classify(ref, locations)
        location = locations.get(ref.expected_key)
        total.add(cov.state, location)
        per_doc.setdefault(ref.document_id, _Tally()).add(cov.state, location)
        chunks.append(cov)
    return CoverageReport(
        total=total.freeze(), documents={d: t.freeze() for d, t in per_doc.items()}, chunks=tuple(chunks)
    )
