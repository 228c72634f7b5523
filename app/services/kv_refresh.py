"""After a model (or system prompt) switch: the library's chunk KV recomputed in the background.

Chunk KV is keyed by the model's fingerprint and prompt prefix, so after a switch every ready chunk reads
`stale` in coverage and questions compute its KV when they retrieve it. KVRefresh does that work ahead of
them, through the same writer ingest uses (`KVSpace.ensure`) and the scheduler at ingest priority (a
question never waits for more than one unit of it):

1. chunks whose text another tokenizer encoded get this tokenizer's ids (`encode_chunk_text`: the chunker's
   contract), synchronously at start-up, before any question reads them: the other model's ids mean
   nothing to this one;
2. the old entries (recorded keys no ready chunk expects any more) are evicted first, so the new model's
   entries have the disk budget;
3. the stale chunks' KV is computed and stored batch by batch, and each batch's new keys are recorded, so
   coverage climbs from stale to fresh as it runs.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from app.catalog import DocumentStatus

if TYPE_CHECKING:
    from app.catalog import Catalog
    from app.catalog.records import ChunkRecord
    from engine.engine import Engine
    from engine.scheduler import Scheduler
    from ingest.chunker import TokenizerLike
    from kvcache.space import KVSpace

logger = logging.getLogger(__name__)

BATCH_CHUNKS = 8  # chunks per writer call: one batch's keys are recorded before the next starts


@dataclass(frozen=True)
class RefreshPlan:
    stale: list[ChunkRecord]  # ready chunks whose recorded KV key is not the served model's
    num_retokenized: int  # of them, those whose ids were another tokenizer's (rewritten in the catalog)
    old_keys: list[str]  # recorded keys no ready chunk expects under the served model: evicted first


def plan_refresh(catalog: Catalog, tokenizer: TokenizerLike, kv_space: KVSpace) -> RefreshPlan:
    """Find the stale chunks (re-tokenizing those of another tokenizer) and the entries to evict. `kv_space`:
    the served model's entries."""
    from ingest.chunker import encode_chunk_text

    kv_key = kv_space.key
    ready = catalog.iter_chunks([DocumentStatus.READY])
    stale = [c for c in ready if c.kv_key != kv_key(c.token_ids)]
    recorded = {c.kv_key for c in ready if c.kv_key}
    retokenized: dict[int, list[int]] = {}
    for chunk in stale:
        ids = encode_chunk_text(tokenizer, chunk.text)
        if ids != chunk.token_ids:
            retokenized[chunk.id] = ids
    if retokenized:
        logger.info("%d chunk(s) were tokenized for another model: re-encoded with this one", len(retokenized))
        catalog.set_chunk_token_ids(retokenized)
        stale_ids = {c.id for c in stale}
        ready = catalog.iter_chunks([DocumentStatus.READY])
        stale = [c for c in ready if c.id in stale_ids]
    expected = {kv_key(c.token_ids) for c in ready}
    # Keys of documents still being ingested (or failed ones' leftovers) are not this plan's to evict.
    ready_documents = {c.document_id for c in ready}
    others = {c.kv_key for c in catalog.iter_chunks() if c.kv_key and c.document_id not in ready_documents}
    return RefreshPlan(stale=stale, num_retokenized=len(retokenized), old_keys=sorted(recorded - expected - others))


class KVRefresh:
    """The background recompute of one plan; `stop()` ends it between batches (what is done stays done)."""

    def __init__(
        self,
        catalog: Catalog,
        engine: Engine,
        kv_space: KVSpace,
        scheduler: Scheduler,
        plan: RefreshPlan,
    ) -> None:
        self._catalog, self._engine, self._space = catalog, engine, kv_space
        self._scheduler = scheduler
        self.plan = plan
        self.num_done = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="blendrag-kv-refresh", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the refresh to end; True when it did."""
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    def _run(self) -> None:
        try:
            self.run()
        except Exception:  # noqa: BLE001 - a failed refresh leaves chunks stale: questions compute them
            logger.exception("the background KV refresh failed; stale chunks are computed when asked")

    def run(self) -> None:
        """Evict the old entries, then compute and record the stale chunks' KV batch by batch."""
        from engine.scheduler import PrecomputePriority, SchedulerStopped

        space, engine, catalog = self._space, self._engine, self._catalog
        for key in self.plan.old_keys:
            space.store.delete(key)
        logger.info(
            "KV refresh for %s: %d old entries evicted, %d chunk(s) to compute",
            engine.served_model.name,
            len(self.plan.old_keys),
            len(self.plan.stale),
        )
        stale = self.plan.stale
        for start in range(0, len(stale), BATCH_CHUNKS):
            if self._stop.is_set():
                return
            batch = stale[start : start + BATCH_CHUNKS]
            keys = [space.key(c.token_ids) for c in batch]
            try:
                written = space.ensure(
                    [c.token_ids for c in batch],
                    keys=keys,
                    compute=lambda todo: self._scheduler.precompute_chunks(todo, priority=PrecomputePriority.INGEST),
                    batch_chunks=BATCH_CHUNKS,
                )
            except SchedulerStopped:
                return
            catalog.set_kv_keys({c.id: k for c, k in zip(batch, keys, strict=True) if k not in written.unwritten})
            self.num_done += len(batch)
        logger.info("KV refresh for %s done: %d chunk(s) computed", engine.served_model.name, self.num_done)
