"""The KV space of a served model: one store, one model fingerprint, one prompt prefix.

Every chunk (or conversation turn) KV entry the server writes or reads is named by the same three things:
the model that computed it, the prefix it was computed behind, and its own token ids (kvcache/keys.py).
`KVSpace` holds the first two beside the store, so a caller hands over token ids only and the key of a
chunk can be computed one way:

    space = KVSpace.of_engine(store, engine)       # the composition root makes one (app/build.py)
    key = space.key(chunk_ids)                       # what a catalog row records
    written = space.ensure(chunks, compute=...)      # compute and store what the store lacks (the one KV writer)
    with space.open(written.keys, device, dtype) as reader: ...  # layer-wise, as a question reads it

kvcache imports no engine: `of_engine` takes anything with a `fingerprint` and a `prompt.prefix_ids`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from kvcache.keys import chunk_key
from kvcache.writer import DEFAULT_BATCH_CHUNKS, BatchStorer, ChunkKVWrite, ComputeKV, report, write_batches

if TYPE_CHECKING:
    import torch

    from kvcache.format import StoredEntry
    from kvcache.loader import StoreLayerReader
    from kvcache.store import TieredKVStore


class _HasPrefix(Protocol):
    @property
    def prefix_ids(self) -> Sequence[int]: ...


class ServedModel(Protocol):
    """What `KVSpace.of_engine` reads of an engine."""

    @property
    def fingerprint(self) -> str: ...

    @property
    def prompt(self) -> _HasPrefix: ...


class KVSpace:
    """The entries of one model behind one prefix in one store: their keys, their writes, their reads."""

    def __init__(self, store: TieredKVStore, model_fingerprint: str, prefix_ids: Sequence[int]) -> None:
        if not model_fingerprint:
            raise ValueError("a KV space needs a model fingerprint")
        self.store = store
        self.model_fingerprint = model_fingerprint
        self.prefix_ids: tuple[int, ...] = tuple(prefix_ids)

    @classmethod
    def of_engine(cls, store: TieredKVStore, engine: ServedModel) -> KVSpace:
        """The space of `engine`'s model behind its prompt prefix (the server's system prompt)."""
        return cls(store, engine.fingerprint, engine.prompt.prefix_ids)

    def key(self, token_ids: Sequence[int]) -> str:
        """The entry key of a chunk's (or turn's) token ids, whatever the storage dtype."""
        return chunk_key(self.model_fingerprint, self.prefix_ids, token_ids)

    def ensure(
        self,
        chunks: Sequence[Sequence[int]],
        *,
        compute: ComputeKV,
        keys: Sequence[str] | None = None,
        keep_entries: bool = False,
        batch_chunks: int = DEFAULT_BATCH_CHUNKS,
        missing_keys: Sequence[str] | None = None,
        on_batch: Callable[[int], None] | None = None,
        history_keys: Collection[str] = (),
        persist: bool = True,
    ) -> ChunkKVWrite:
        """Make sure every chunk's KV is stored: compute the missing ones `batch_chunks` at a time and put them
        (kvcache/writer.py: the batches overlap their writes, one policy for a failed put).

        `keys`: the chunks' keys when the caller has them already from `self.key` (ingest records them), so
        each is hashed once. `missing_keys`: the caller already knows which keys are missing (a failed
        `open`); otherwise the store is asked (one `locate_many`). `on_batch(num_done)` runs after each batch
        with the number of `chunks` handled so far (present ones count from the start); it may raise to stop
        (ingest's cancel). With `keep_entries` the computed entries come back, in the store's encoding, for
        the caller to serve. `history_keys`: the keys of conversation turns (their memory copy goes to the
        history memory tier). `persist=False`: memory tiers only (`TieredKVStore.put_entry`).
        """
        if keys is None:
            keys = [self.key(ids) for ids in chunks]
        elif len(keys) != len(chunks):
            raise ValueError(f"{len(keys)} keys for {len(chunks)} chunks")
        keys = list(keys)
        ids_by_key = {key: list(ids) for key, ids in zip(keys, chunks, strict=True)}
        if missing_keys is None:
            present = self.store.locate_many(list(ids_by_key))
            todo = [key for key in ids_by_key if key not in present]
        else:
            wanted = set(missing_keys)
            todo = [key for key in ids_by_key if key in wanted]
        todo_set = set(todo)
        num_done = sum(1 for key in keys if key not in todo_set)
        if on_batch is not None and not todo:
            on_batch(num_done)
        stored = BatchStorer(
            self.store, self.model_fingerprint, keys, num_done, keep_entries, history_keys, on_batch, persist
        )
        write_batches(stored, todo, ids_by_key, compute, batch_chunks)
        return report(stored, keys, len(ids_by_key), len(todo))

    def open(
        self,
        keys: list[str],
        device: torch.device | str = "cpu",
        dtype: torch.dtype | None = None,
        *,
        computed: Mapping[str, StoredEntry] | None = None,
        history_keys: Collection[str] = (),
        prefetch: bool | None = None,
    ) -> StoreLayerReader:
        """Serve these entries layer by layer (`TieredKVStore.open_layers`; raises `KVEntryMissing`)."""
        return self.store.open_layers(
            keys, device=device, dtype=dtype, computed=computed, history_keys=history_keys, prefetch=prefetch
        )
