"""Layer-wise loading of a prompt's cached chunks, with a background prefetch of the next layer.

`TieredKVStore.open_layers(keys, device, dtype)` resolves every key up front (raising `KVEntryMissing`
for those no tier can serve) and returns a `StoreLayerReader`, the `LayerKVReader` the engine consumes:

- `layer(l) -> (k, v)`: K (pre-RoPE) and V of all chunks concatenated in prompt order, each
  (kv_heads, num_tokens, head_dim) in `dtype` on `device`. int8 / int4 entries are dequantized here,
  layer by layer (on which thread: below). Chunks of different storage dtypes (a store written before a
  change of `storage_dtype`) mix freely.
- With prefetch on, opening schedules layer 0 and each `layer(l)` schedules layer l+1 on a private
  worker thread, so reading (and checksumming, and copying to the device) hides behind the caller's
  compute of layer l. Results are identical with and without prefetch.
- A checksum/format failure raises `KVEntryCorrupt(key, layer_idx=l)`; the store has already removed the
  entry from the tier it came from and counted the fault. Later `layer()` calls re-raise it.
- `close()` (or leaving a `with` block) stops the worker, closes the files and, when every layer of a
  lower-tier chunk was read and verified, promotes it (disk -> memory, Redis -> disk + memory).

Disk chunks are read through a `FileEntryReader` opened once per chunk (not once per layer). Where the
conversion to the compute dtype runs depends on the device:

- CPU (`convert_in_caller`, the default there): the worker only reads and verifies; `layer(l)` converts on
  the caller's thread, the whole layer of all chunks at once (`format.dequantize_prompt_layer`) with the
  caller's torch threads. Conversion is CPU work wherever it runs; on the worker it took a core from the
  engine's OpenMP team between every two of its barriers.
- Otherwise the worker converts too: on the host with numpy or torch on its one thread
  (`kvcache.hostcopy`, never torch's OpenMP team), or, for a non-CPU `device`, through `kvcache.staging`:
  every chunk's stored bytes of the layer packed into one pinned buffer from the store's pool, one
  asynchronous copy on a side stream, dequantization there, and an event that the caller's stream waits on
  when `layer(l)` hands the tensors over (the host never waits for the device).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from kvcache.closing import Closing
from kvcache.device_tier import DeviceEntry
from kvcache.errors import KVEntryCorrupt
from kvcache.format import (
    EntryMeta,
    LayerData,
    StoredEntry,
    dequantize_entries_into,
    dequantize_prompt_layer,
)
from kvcache.reader import EntryReader
from kvcache.staging import LayerStager, StagingPool

logger = logging.getLogger(__name__)


@dataclass
class ResolvedChunk:
    """One unique entry of a prompt, bound to the tier that will serve it."""

    key: str
    tier: str  # "device" | "memory" | "disk" | "redis"
    meta: EntryMeta
    entry: StoredEntry | None = None  # memory tier
    resident: DeviceEntry | None = None  # device tier: the KV already in the compute dtype on the device
    reader: EntryReader | None = None  # disk / redis
    raw: bytes | None = None  # Redis value, written to disk on promotion

    def read_layer(self, layer_idx: int, verify: bool) -> LayerData:
        if self.entry is not None:
            return self.entry.layer(layer_idx)
        assert self.reader is not None
        return self.reader.read_layer(layer_idx, verify=verify)

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()


# (k, v, event the consumer's stream waits on before reading them: None where nothing is in flight)
_Staged = tuple[torch.Tensor, torch.Tensor, Any]
CorruptHandler = Callable[[ResolvedChunk, KVEntryCorrupt], None]
PromoteHandler = Callable[[ResolvedChunk, "list[LayerData] | None"], None]
ResidentHandler = Callable[[str, DeviceEntry], bool]  # DeviceTier.put


class StoreLayerReader(Closing):
    """A `LayerKVReader` over store entries; see the module docstring. Use as a context manager."""

    def __init__(
        self,
        chunks: list[ResolvedChunk],
        *,
        device: torch.device | str,
        dtype: torch.dtype,
        prefetch: bool,
        verify: bool,
        on_corrupt: CorruptHandler,
        on_promote: PromoteHandler | None,
        collect_layers: bool,
        convert_on_device: bool | None = None,
        convert_in_caller: bool | None = None,
        staging_pool: StagingPool | None = None,
        on_resident: ResidentHandler | None = None,
    ) -> None:
        self._unique: dict[str, ResolvedChunk] = {c.key: c for c in chunks}
        try:
            if not chunks:
                raise ValueError("open_layers needs at least one key")
            first = chunks[0].meta
            dims = (first.num_layers, first.kv_heads, first.head_dim)
            for c in chunks:
                m = c.meta
                if (m.num_layers, m.kv_heads, m.head_dim) != dims:
                    raise ValueError(
                        f"entry {c.key[:12]} has (layers, kv_heads, head_dim) = "
                        f"{(m.num_layers, m.kv_heads, m.head_dim)}, entry {chunks[0].key[:12]} has "
                        f"{dims}: different models"
                    )
        except BaseException:
            for c in self._unique.values():
                c.close()
            raise
        self._chunks = chunks
        self._device = torch.device(device)
        self._dtype = dtype
        # ship stored bytes and convert on the accelerator (a quarter / half of the bytes cross the bus)
        self._convert_on_device = self._device.type != "cpu" if convert_on_device is None else convert_on_device
        # Chunks resident in the device tier are views of its tensors; the others are read and converted.
        self._staged = [c for c in chunks if c.resident is None]
        # One storage dtype (the usual case): each layer crosses in one copy of its packed bytes (kvcache.staging).
        self._stager = (
            LayerStager(
                [c.meta for c in self._staged],
                staging_pool or StagingPool(pin=self._device.type == "cuda"),
                self._device,
                dtype,
            )
            if self._convert_on_device and self._staged and len({c.meta.storage_dtype for c in self._staged}) == 1
            else None
        )
        # Staged chunks' layers, kept to enter the device tier at close() (views of the staged layers).
        self._on_resident = on_resident if self._stager is not None else None
        self._resident_layers: dict[str, list[tuple[torch.Tensor, torch.Tensor] | None]] = (
            {c.key: [None] * first.num_layers for c in self._staged} if self._on_resident is not None else {}
        )
        # On the CPU the worker only reads (I/O, checksums) and `layer()` converts on the caller's thread with
        # its torch threads: conversion is CPU work either way, and on the worker it competed with the
        # engine's OpenMP team for the same cores (docs/benchmarks.md, "Stored context on the request thread").
        self._convert_in_caller = self._device.type == "cpu" if convert_in_caller is None else convert_in_caller
        self._verify = verify
        self._on_corrupt = on_corrupt
        self._on_promote = on_promote
        self._num_layers = first.num_layers
        self._kv_heads = first.kv_heads
        self._head_dim = first.head_dim
        self._spans: list[tuple[int, int]] = []
        start = 0
        for c in chunks:
            self._spans.append((start, start + c.meta.num_tokens))
            start += c.meta.num_tokens
        self._num_tokens = start
        # layers of lower-tier chunks kept for promotion into the memory tier at close()
        self._collected: dict[str, list[LayerData | None]] = {
            c.key: [None] * self._num_layers
            for c in self._unique.values()
            if collect_layers and c.tier not in ("memory", "device")
        }
        self._loaded_layers: set[int] = set()
        self._failed: KVEntryCorrupt | None = None
        self._closed = False
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="kv-prefetch") if prefetch else None
        self._pending: tuple[int, Future[dict[str, LayerData] | _Staged]] | None = None
        # layer() and close() swap `_pending` and touch the files: one at a time, even if a caller closes the
        # source from another thread while a layer is being read (it then waits for that layer).
        self._lock = threading.Lock()
        self._schedule(0)

    # -- LayerKVReader ---------------------------------------------------------------------------------

    @property
    def num_layers(self) -> int:
        return self._num_layers

    @property
    def num_tokens(self) -> int:
        return self._num_tokens

    @property
    def keys(self) -> list[str]:
        return [c.key for c in self._chunks]

    @property
    def tiers(self) -> list[str]:
        """The tier each chunk (in prompt order) is served from."""
        return [c.tier for c in self._chunks]

    @property
    def loaded_layers(self) -> list[int]:
        """Layers read so far, by the caller or ahead of it by the prefetch worker."""
        return sorted(self._loaded_layers)

    def layer(self, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        with self._lock:
            return self._layer(layer_idx)

    def _layer(self, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self._closed:
            raise RuntimeError("layer reader is closed")
        if not 0 <= layer_idx < self._num_layers:
            raise IndexError(f"layer {layer_idx} out of range (num_layers={self._num_layers})")
        if self._failed is not None:
            raise self._failed
        pending, self._pending = self._pending, None
        result: dict[str, LayerData] | _Staged | None = None
        if pending is not None:
            pending_idx, future = pending
            if pending_idx == layer_idx:
                result = future.result()  # re-raises KVEntryCorrupt from the worker
            else:  # out-of-order access: drop the prefetch (wait so two reads never share a file offset)
                with contextlib.suppress(KVEntryCorrupt):
                    future.result()
                if self._failed is not None:
                    raise self._failed
        if result is None:
            result = self._work(layer_idx)
        self._schedule(layer_idx + 1)  # the next read runs while this layer is converted and used
        if isinstance(result, dict):
            result = self._convert(result, layer_idx)
        k, v, ready = result
        if ready is not None:  # the caller's stream waits for the side stream's copy; the host does not
            torch.cuda.current_stream(self._device).wait_event(ready)
        return k, v

    def close(self) -> None:
        with self._lock:
            self._close()

    def _close(self) -> None:
        if self._closed:
            return
        self._closed = True
        pending, self._pending = self._pending, None
        if pending is not None and not pending[1].cancel():
            with contextlib.suppress(Exception):
                pending[1].result()
        if self._executor is not None:
            self._executor.shutdown(wait=True)
        if self._stager is not None:
            self._stager.close()
        try:
            self._promote()
            self._make_resident()
        finally:
            # The collected layers are a whole copy of the lower-tier chunks' KV: drop them now, not when
            # this source is collected (it sits in reference cycles an idle server never collects).
            self._collected = {}
            self._resident_layers = {}
            for c in self._unique.values():
                c.close()

    # -- internals -------------------------------------------------------------------------------------

    def _schedule(self, layer_idx: int) -> None:
        if self._executor is not None and layer_idx < self._num_layers and self._failed is None:
            self._pending = (layer_idx, self._executor.submit(self._work, layer_idx))

    def _work(self, layer_idx: int) -> dict[str, LayerData] | _Staged:
        """What reading a layer does (on the worker with prefetch): the stored data of every chunk, converted
        to (k, v, ready event) unless the caller converts."""
        per_key = self._read(layer_idx)
        return per_key if self._convert_in_caller else self._convert(per_key, layer_idx)

    def _read(self, layer_idx: int) -> dict[str, LayerData]:
        per_key = {key: self._read_chunk_layer(c, layer_idx) for key, c in self._unique.items() if c.resident is None}
        self._loaded_layers.add(layer_idx)
        return per_key

    def _read_chunk_layer(self, chunk: ResolvedChunk, layer_idx: int) -> LayerData:
        try:
            data = chunk.read_layer(layer_idx, self._verify)
        except KVEntryCorrupt as exc:
            exc.layer_idx = layer_idx if exc.layer_idx is None else exc.layer_idx
            exc.tier = chunk.tier
            self._failed = exc
            self._on_corrupt(chunk, exc)
            raise
        collected = self._collected.get(chunk.key)
        if collected is not None:
            collected[layer_idx] = data
        return data

    def _convert(self, per_key: dict[str, LayerData], layer_idx: int) -> _Staged:
        if len(self._staged) < len(self._chunks):
            return self._assemble(per_key, layer_idx)
        if self._stager is not None:
            return self._keep_for_residence(
                layer_idx, *self._stager.stage(layer_idx, [per_key[c.key] for c in self._chunks])
            )
        shape = (self._kv_heads, self._num_tokens, self._head_dim)
        k = torch.empty(shape, dtype=self._dtype)  # (kv_heads, num_tokens, head_dim)
        v = torch.empty(shape, dtype=self._dtype)
        parts = [(per_key[chunk.key], chunk.meta) for chunk in self._chunks]
        if self._convert_in_caller:
            dequantize_prompt_layer(k, v, parts)  # int4: the whole layer at once, on the caller's torch threads
        else:
            dequantize_entries_into(k, v, parts)  # chunk by chunk, on this worker's one thread
        if self._device.type != "cpu":  # chunks of several storage dtypes (a store written before a change)
            k, v = k.to(self._device), v.to(self._device)
        return k, v, None

    def _assemble(self, per_key: dict[str, LayerData], layer_idx: int) -> _Staged:
        """A layer of a prompt with device-resident chunks: their views and the staged rest, in prompt order."""
        staged: tuple[torch.Tensor, torch.Tensor] | None = None
        if self._staged:
            if self._stager is None:  # several storage dtypes among the others: convert on the host
                raise RuntimeError("device-resident chunks beside chunks of several storage dtypes")
            k_s, v_s, ready = self._keep_for_residence(
                layer_idx, *self._stager.stage(layer_idx, [per_key[c.key] for c in self._staged])
            )
            if ready is not None:  # the concatenation below reads the staged layer on this thread's stream
                torch.cuda.current_stream(self._device).wait_event(ready)
            staged = (k_s, v_s)
        k_parts, v_parts, start = [], [], 0
        for chunk in self._chunks:
            if chunk.resident is not None:
                k_parts.append(chunk.resident.k[layer_idx])  # (kv_heads, num_tokens, head_dim)
                v_parts.append(chunk.resident.v[layer_idx])
                continue
            assert staged is not None
            end = start + chunk.meta.num_tokens
            k_parts.append(staged[0][:, start:end])
            v_parts.append(staged[1][:, start:end])
            start = end
        return torch.cat(k_parts, dim=1), torch.cat(v_parts, dim=1), None

    def _keep_for_residence(self, layer_idx: int, k: torch.Tensor, v: torch.Tensor, ready: Any) -> _Staged:
        """Remember each staged chunk's rows of this layer for the device tier (views: no copy)."""
        if self._on_resident is not None:
            start = 0
            for chunk in self._staged:
                end = start + chunk.meta.num_tokens
                layers = self._resident_layers.get(chunk.key)
                if layers is not None:
                    layers[layer_idx] = (k[:, start:end], v[:, start:end])
                start = end
        return k, v, ready

    def _make_resident(self) -> None:
        """Staged chunks read whole enter the device tier (it decides whether they earn their place)."""
        if self._on_resident is None or self._failed is not None:
            return
        for key, layers in self._resident_layers.items():
            if any(x is None for x in layers):
                continue
            chunk = self._unique[key]
            entry = DeviceEntry(
                meta=chunk.meta,
                k=torch.stack([x[0] for x in layers]),  # type: ignore[index]  # (num_layers, kv_heads, T, D)
                v=torch.stack([x[1] for x in layers]),  # type: ignore[index]
            )
            try:
                self._on_resident(key, entry)
            except Exception:  # residence is an optimisation; never fail the request for it
                logger.exception("kv store: making %s device-resident failed", key[:12])

    def _promote(self) -> None:
        if self._on_promote is None or self._failed is not None:
            return
        if len(self._loaded_layers) != self._num_layers:
            return  # only entries read (and verified) completely are promoted
        for chunk in self._unique.values():
            if chunk.tier in ("memory", "device"):
                continue
            collected = self._collected.get(chunk.key)
            layers = None if collected is None or any(x is None for x in collected) else collected
            try:
                self._on_promote(chunk, layers)  # type: ignore[arg-type]
            except Exception:  # promotion is an optimisation; never fail the request for it
                logger.exception("kv store: promoting %s failed", chunk.key[:12])
