"""Moving a prompt's stored KV to an accelerator layer by layer, overlapped with compute (CacheBlend §5).

Per layer, the stored bytes of every chunk (K, V and their quantisation parameters, in storage form) are
packed into one pinned host buffer, cross the bus in **one** asynchronous copy on a side stream, and are
dequantized there into (kv_heads, N, head_dim) K and V of the compute dtype; an event recorded after the
dequantization is what the compute stream waits on. Layer l+1 crosses while layer l computes; the host never
waits for the device.

- `StagingPool`: pinned host buffers allocated once and reused by every layer of every request (allocating
  pinned memory per layer is slow and synchronizing). A buffer goes back to the pool with the event of the
  last copy that reads it and is handed out again only once that copy has finished (`Event.query`, no wait).
- `LayerStager`: one prompt's layout of the bytes (computed once: every layer of an entry has the same shapes)
  and the per-layer pack, copy and dequantize, double-buffered.

On a CPU `device` the same code runs without pinning, streams or events (tests use it to check that every
storage dtype comes out bit for bit as the host conversion makes it).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from kvcache.format import TORCH_STORAGE_DTYPES, EntryMeta, LayerData, layer_tensor_names
from kvcache.hostcopy import host_copy
from kvcache.quant import dequantize_int8
from kvcache.quant_int4 import Int4Quantized, dequantize_int4_spans

_ALIGN = 64  # bytes: every tensor of the packed layer starts aligned for any dtype's view


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


class StagingPool:
    """Reusable host staging buffers (pinned when the device is CUDA); thread-safe, shared by a store."""

    def __init__(self, pin: bool) -> None:
        self.pin = pin
        self._lock = threading.Lock()
        self._free: list[tuple[torch.Tensor, Any]] = []  # (uint8 buffer, event of its last copy or None)
        self.num_allocated = 0  # buffers ever allocated: stays put once the pool is warm

    def acquire(self, nbytes: int) -> torch.Tensor:
        """A uint8 buffer of at least `nbytes` whose last copy has finished (a new one if none is free)."""
        with self._lock:
            for i, (buf, event) in enumerate(self._free):
                if buf.numel() >= nbytes and (event is None or event.query()):
                    del self._free[i]
                    return buf
            self.num_allocated += 1
        # Round up so that a slightly larger prompt later still fits the same buffer.
        size = max(_aligned(nbytes), 1 << 20)
        return torch.empty(size, dtype=torch.uint8, pin_memory=self.pin)

    def release(self, buf: torch.Tensor, event: Any = None) -> None:
        with self._lock:
            self._free.append((buf, event))

    @property
    def num_free(self) -> int:
        with self._lock:
            return len(self._free)


@dataclass(frozen=True)
class _Piece:
    chunk: int  # index into the prompt's chunks
    field: str  # LayerData field
    offset: int  # bytes into the packed layer
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        numel = 1
        for d in self.shape:
            numel *= d
        return numel * self.dtype.itemsize


def _plan(metas: Sequence[EntryMeta]) -> tuple[list[_Piece], int]:
    """Where each chunk's tensors of one layer sit in the packed layer, and its size in bytes."""
    pieces, offset = [], 0
    for i, meta in enumerate(metas):
        for name in layer_tensor_names(0, meta.storage_dtype):  # "k.0", "v.0", "k_scale.0", …
            piece = _Piece(i, name.split(".")[0], offset, meta.expected_dtype(name), meta.expected_shape(name))
            pieces.append(piece)
            offset = _aligned(offset + piece.nbytes)
    return pieces, offset


class LayerStager:
    """One prompt's chunks (one storage dtype): each layer packed, copied and dequantized on `device`."""

    NUM_SLOTS = 2  # layer l+1 is packed while layer l's copy may still be in flight

    def __init__(self, metas: Sequence[EntryMeta], pool: StagingPool, device: torch.device, dtype: torch.dtype) -> None:
        storage = {m.storage_dtype for m in metas}
        if len(storage) != 1:
            raise ValueError(f"one storage dtype per staged prompt, got {sorted(storage)}")
        self.storage_dtype = storage.pop()
        self.metas = list(metas)
        self.pool, self.device, self.dtype = pool, device, dtype
        self.pieces, self.nbytes = _plan(self.metas)
        self.cuda = device.type == "cuda"
        self.stream = torch.cuda.Stream(device) if self.cuda else None
        self._host: list[torch.Tensor | None] = [None] * self.NUM_SLOTS
        self._events: list[Any] = [None] * self.NUM_SLOTS
        # device-side landing buffers, one per slot, reused by every layer (written and read on the side stream)
        self._landing: list[torch.Tensor | None] = [None] * self.NUM_SLOTS

    def stage(self, layer_idx: int, per_chunk: Sequence[LayerData]) -> tuple[torch.Tensor, torch.Tensor, Any]:
        """K and V (kv_heads, N, head_dim) of `layer_idx` on the device, and the event the compute stream must
        wait on before reading them (None on a CPU). Runs on the loader's worker thread."""
        slot = layer_idx % self.NUM_SLOTS
        host = self._host_buffer(slot)
        for piece in self.pieces:
            src = getattr(per_chunk[piece.chunk], piece.field)
            host_copy(self._view(host, piece), src)
        if not self.cuda:
            return (*self._dequantize(host), None)
        assert self.stream is not None
        with torch.cuda.stream(self.stream):
            landing = self._landing[slot]
            if landing is None or landing.numel() < self.nbytes:
                landing = self._landing[slot] = torch.empty(self.nbytes, dtype=torch.uint8, device=self.device)
            landing[: self.nbytes].copy_(host[: self.nbytes], non_blocking=True)  # the layer's one copy
            k, v = self._dequantize(landing)
            ready = torch.cuda.Event()
            ready.record(self.stream)
        compute = torch.cuda.current_stream(self.device)
        # k and v were allocated on the side stream and are read on the compute stream.
        k.record_stream(compute)
        v.record_stream(compute)
        self._events[slot] = ready
        return k, v, ready

    def close(self) -> None:
        """Give the host buffers back to the pool (each with the event of its last copy)."""
        for slot, buf in enumerate(self._host):
            if buf is not None:
                self.pool.release(buf, self._events[slot])
        self._host = [None] * self.NUM_SLOTS

    # -- internals -------------------------------------------------------------------------------------

    def _host_buffer(self, slot: int) -> torch.Tensor:
        buf = self._host[slot]
        if buf is None:
            buf = self._host[slot] = self.pool.acquire(self.nbytes)
            return buf
        event = self._events[slot]
        while event is not None and not event.query():  # the copy of two layers ago still reads it
            time.sleep(50e-6)
        return buf

    @staticmethod
    def _view(buf: torch.Tensor, piece: _Piece) -> torch.Tensor:
        return buf[piece.offset : piece.offset + piece.nbytes].view(piece.dtype).view(piece.shape)

    def _fields(self, buf: torch.Tensor) -> list[dict[str, torch.Tensor]]:
        per_chunk: list[dict[str, torch.Tensor]] = [{} for _ in self.metas]
        for piece in self.pieces:
            per_chunk[piece.chunk][piece.field] = self._view(buf, piece)
        return per_chunk

    def _dequantize(self, buf: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The packed layer in `buf` (on the device) as K and V of the compute dtype, whole-layer ops."""
        parts = self._fields(buf)
        heads, dim = self.metas[0].kv_heads, self.metas[0].head_dim
        num_tokens = sum(m.num_tokens for m in self.metas)
        out = []
        for kind in ("k", "v"):
            if self.storage_dtype == "int4":
                dst = torch.empty((heads, num_tokens, dim), dtype=self.dtype, device=buf.device)
                q4 = [
                    Int4Quantized(
                        packed=p[kind],
                        scale=p[f"{kind}_scale"],
                        zero=p[f"{kind}_zero"],
                        group=m.int4_k_group if kind == "k" else m.int4_v_group,
                    )
                    for p, m in zip(parts, self.metas, strict=True)
                ]
                dequantize_int4_spans(dst, q4, kind)  # type: ignore[arg-type]
            elif self.storage_dtype == "int8":
                codes = torch.cat([p[kind] for p in parts], dim=1)  # (kv_heads, N, head_dim) int8
                scales = torch.cat([p[f"{kind}_scale"] for p in parts], dim=1)  # (kv_heads, N)
                dst = dequantize_int8(codes, scales, self.dtype)
            else:
                assert TORCH_STORAGE_DTYPES[self.storage_dtype] == parts[0][kind].dtype
                dst = torch.cat([p[kind] for p in parts], dim=1).to(self.dtype)
            out.append(dst)
        return out[0], out[1]
