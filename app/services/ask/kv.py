"""Opening a planned prompt's KV: chunks, then earlier turns, layer-wise from the store; what the store
lacks is computed once (questions first in the engine's queue) and served as computed."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from app.services.ask.prompt import TurnKV

if TYPE_CHECKING:
    from app.services.ask.types import AskPlan
    from engine.engine import Engine
    from engine.scheduler import Scheduler
    from kvcache.space import KVSpace
    from kvcache.types import LayerKVReader

logger = logging.getLogger(__name__)

OPEN_ATTEMPTS = 3  # a present entry may be evicted between two opens: it is then computed too


@dataclass(frozen=True)
class OpenedKV:
    """The prompt's KV (chunks, then earlier turns), ready to stream into a prompt pass, and how much of it
    the store had."""

    reader: LayerKVReader
    num_hits: int  # retrieved chunks found in the store
    num_misses: int  # retrieved chunks computed now
    num_history_reused_tokens: int = 0  # earlier turns' tokens found in the store


class PromptKV:
    """Opens a planned prompt's KV: the stored entries of its chunks, then of its earlier turns."""

    def __init__(self, engine: Engine, kv_space: KVSpace, scheduler: Scheduler) -> None:
        self._engine, self._space, self._scheduler = engine, kv_space, scheduler

    def open(self, plan: AskPlan) -> OpenedKV:
        """Open the prompt's stored KV layer-wise (chunks, then earlier turns); KV the store lacks is
        computed once and served as computed.

        Runs in a worker thread (it blocks on the engine for missing segments). The computed KV is stored
        too (kvcache.writer), but served from what was computed, so a store that cannot keep it still
        answers. A missing or corrupt turn entry is computed like a missing chunk, never an error; outside a
        stored conversation it is kept in memory only (no stored record names it: see `TurnFinisher`).
        Close `reader` after.
        """
        from engine.scheduler import PrecomputePriority
        from kvcache.errors import KVEntryMissing
        from kvcache.format import StoredEntry

        engine, space, scheduler = self._engine, self._space, self._scheduler
        chunk_ids = [c.token_ids for c in plan.ordered]
        chunk_keys = [space.key(ids) for ids in chunk_ids]
        history = set(plan.history_keys)
        keys = chunk_keys + plan.history_keys
        # (ids, keys, persist): chunks always go to disk; turns only when a stored conversation names them.
        parts = (
            (chunk_ids, chunk_keys, True),
            (plan.layout.history_ids, plan.history_keys, plan.conversation is not None),
        )
        computed: dict[str, StoredEntry] = {}
        missed: set[str] = set()
        for _attempt in range(OPEN_ATTEMPTS):
            try:
                reader = space.open(keys, engine.device, engine.dtype, computed=computed, history_keys=history)
                num_misses = len(missed - history)
                return OpenedKV(
                    reader=reader,
                    num_hits=len(set(chunk_keys)) - num_misses,
                    num_misses=num_misses,
                    num_history_reused_tokens=TurnKV.reused_tokens(plan.layout, plan.history_keys, missed),
                )
            except KVEntryMissing as exc:
                missed.update(exc.keys)
                logger.info("computing the KV of %d segment(s) missing from the store", len(exc.keys))
                absent = set(exc.keys)
                for part_ids, part_keys, persist in parts:
                    missing = [k for k in part_keys if k in absent]
                    if not missing:
                        continue
                    written = space.ensure(
                        part_ids,
                        keys=part_keys,
                        # The engine's worker computes them before any other prompt work: a question waits.
                        compute=lambda todo: scheduler.precompute_chunks(todo, priority=PrecomputePriority.QUESTION),
                        missing_keys=missing,
                        keep_entries=True,
                        history_keys=history,
                        persist=persist,
                    )
                    computed.update(written.computed)
        raise RuntimeError("KV store keeps losing entries; see the kvcache faults in /metrics")
