"""Reading entries back, whole or one layer at a time, with validation and per-tensor checksums.

Files are read with `os.preadv` straight into freshly allocated tensors through a file descriptor held
open for the reader's life (so a layer-wise reader opens each file once, not once per layer). We parse
the safetensors header ourselves instead of using `safetensors.safe_open` because safe_open mmaps the
file: a file truncated while mapped kills the process with SIGBUS, whereas a short pread here becomes a
`KVEntryCorrupt(kind="truncated")`. Measured on this machine (11.3 MiB entry, page cache warm, 30
layers): pread 13.3 GB/s vs safe_open 9.6 GB/s held open and 2.1 GB/s reopened per layer; with CRC32
verification both are ~2.9 GB/s (the checksum dominates).

Public API:
- `FileEntryReader(path, key)` / `BytesEntryReader(data, key)`: `.meta`, `.nbytes`,
  `.read_layer(l, verify=True) -> LayerData`, `.read_all(verify=True) -> StoredEntry`, `.close()`.
  Constructors validate the header against the metadata (names, dtypes, shapes, offsets, size) and
  raise `KVEntryCorrupt`; `FileEntryReader` raises `FileNotFoundError` for a missing file.
- `deserialize_entry(data, key, verify=True) -> StoredEntry`, `read_entry_file(path, key, verify=True)`.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from kvcache.closing import Closing
from kvcache.errors import KVEntryCorrupt
from kvcache.format import EntryMeta, LayerData, StoredEntry, layer_tensor_names, tensor_checksum

_ST_DTYPES: dict[str, torch.dtype] = {
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "F32": torch.float32,
}
MAX_HEADER_BYTES = 16 * 1024 * 1024  # a 100-layer int8 entry's header is ~40 KiB


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int  # absolute byte offset in the file / buffer
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


def _parse_header(key: str, header_len: int, header: bytes, total_size: int) -> tuple[EntryMeta, dict[str, TensorSpec]]:
    """Validate everything that can be checked without reading tensor data."""
    try:
        doc = json.loads(header)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise KVEntryCorrupt(key, f"header is not JSON: {exc}", kind="format") from exc
    if not isinstance(doc, dict):
        raise KVEntryCorrupt(key, "header is not a JSON object", kind="format")
    meta = EntryMeta.from_metadata(doc.pop("__metadata__", None), key)
    data_start = 8 + header_len
    specs: dict[str, TensorSpec] = {}
    for name in meta.tensor_names():
        info = doc.get(name)
        try:
            dtype = _ST_DTYPES[info["dtype"]]
            shape = tuple(int(d) for d in info["shape"])
            start, end = (int(x) for x in info["data_offsets"])
        except (TypeError, KeyError, ValueError) as exc:
            raise KVEntryCorrupt(key, f"tensor {name}: bad or missing header entry", kind="format") from exc
        if dtype != meta.expected_dtype(name) or shape != meta.expected_shape(name):
            raise KVEntryCorrupt(key, f"tensor {name}: {dtype} {shape} does not match the metadata", kind="format")
        if end - start != int(np.prod(shape)) * dtype.itemsize or start < 0:
            raise KVEntryCorrupt(key, f"tensor {name}: offsets {start}..{end} do not fit its shape", kind="format")
        specs[name] = TensorSpec(name, dtype, shape, data_start + start, data_start + end)
    if set(doc) != set(specs):
        raise KVEntryCorrupt(key, f"unexpected tensors {sorted(set(doc) - set(specs))[:4]}", kind="format")
    # safetensors packs tensors back to back; the data must cover the rest of the file exactly
    expected_size = data_start + sum(s.nbytes for s in specs.values())
    if max(s.end for s in specs.values()) != expected_size:
        raise KVEntryCorrupt(key, "tensor data overlaps or leaves holes", kind="format")
    if total_size < expected_size:
        raise KVEntryCorrupt(key, f"{total_size} bytes, header needs {expected_size}", kind="truncated")
    if total_size > expected_size:
        raise KVEntryCorrupt(key, f"{total_size - expected_size} trailing bytes", kind="format")
    return meta, specs


class EntryReader(Closing):
    """Common part of the file and bytes readers; subclasses implement `_read_into`."""

    def __init__(self, key: str, meta: EntryMeta, specs: dict[str, TensorSpec], nbytes: int) -> None:
        self.key = key
        self.meta = meta
        self.nbytes = nbytes  # serialized size
        self._specs = specs

    def _read_into(self, spec: TensorSpec, out: np.ndarray) -> None:
        raise NotImplementedError

    def read_tensor(self, name: str, *, verify: bool = True, layer_idx: int | None = None) -> torch.Tensor:
        spec = self._specs[name]
        out = torch.empty(spec.shape, dtype=spec.dtype)
        self._read_into(spec, out.view(-1).view(torch.uint8).numpy())
        if verify and tensor_checksum(out) != self.meta.checksums[name]:
            raise KVEntryCorrupt(self.key, f"checksum mismatch in {name}", kind="checksum", layer_idx=layer_idx)
        return out

    def read_layer(self, layer_idx: int, *, verify: bool = True) -> LayerData:
        if not 0 <= layer_idx < self.meta.num_layers:
            raise IndexError(f"layer {layer_idx} of an entry with {self.meta.num_layers} layers")
        i = layer_idx
        parts = {
            name.split(".")[0]: self.read_tensor(name, verify=verify, layer_idx=i)
            for name in layer_tensor_names(i, self.meta.storage_dtype)
        }
        return LayerData(**parts)

    def read_all(self, *, verify: bool = True) -> StoredEntry:
        layers = [self.read_layer(layer, verify=verify) for layer in range(self.meta.num_layers)]
        return StoredEntry.from_layers(self.meta, layers)

    def close(self) -> None:
        return None


class FileEntryReader(EntryReader):
    """Reads one entry file through a descriptor held open until `close()`."""

    def __init__(self, path: Path, key: str) -> None:
        self.path = path
        self._fd: int | None = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            size = os.fstat(self._fd).st_size
            head = os.pread(self._fd, 8, 0)
            if len(head) < 8:
                raise KVEntryCorrupt(key, f"file of {len(head)} bytes", kind="truncated")
            (header_len,) = struct.unpack("<Q", head)
            if header_len > MAX_HEADER_BYTES:
                raise KVEntryCorrupt(key, f"header length {header_len} is implausible", kind="format")
            header = os.pread(self._fd, header_len, 8)
            if len(header) < header_len:
                raise KVEntryCorrupt(key, "file ends inside the header", kind="truncated")
            meta, specs = _parse_header(key, header_len, header, size)
        except BaseException:
            self.close()
            raise
        super().__init__(key, meta, specs, size)

    def _read_into(self, spec: TensorSpec, out: np.ndarray) -> None:
        if self._fd is None:
            raise ValueError("reader is closed")
        view = memoryview(out).cast("B")
        done = 0
        while done < spec.nbytes:
            try:
                n = os.preadv(self._fd, [view[done:]], spec.start + done)
            except OSError as exc:  # EIO and friends: the entry cannot be trusted
                raise KVEntryCorrupt(self.key, f"read error in {spec.name}: {exc}", kind="io") from exc
            if n == 0:  # file shrank after we opened it
                raise KVEntryCorrupt(self.key, f"file ends inside {spec.name}", kind="truncated")
            done += n

    def close(self) -> None:
        fd, self._fd = getattr(self, "_fd", None), None
        if fd is not None:
            os.close(fd)

    def __del__(self) -> None:  # a source the caller forgot to close must not leak descriptors
        self.close()


class BytesEntryReader(EntryReader):
    """Reads an entry from its serialized bytes (a Redis value)."""

    def __init__(self, data: bytes, key: str) -> None:
        self._data = memoryview(data)
        if len(data) < 8:
            raise KVEntryCorrupt(key, f"value of {len(data)} bytes", kind="truncated")
        (header_len,) = struct.unpack("<Q", self._data[:8])
        if header_len > MAX_HEADER_BYTES:
            raise KVEntryCorrupt(key, f"header length {header_len} is implausible", kind="format")
        if len(data) < 8 + header_len:
            raise KVEntryCorrupt(key, "value ends inside the header", kind="truncated")
        meta, specs = _parse_header(key, header_len, bytes(self._data[8 : 8 + header_len]), len(data))
        super().__init__(key, meta, specs, len(data))

    def _read_into(self, spec: TensorSpec, out: np.ndarray) -> None:
        out[:] = np.frombuffer(self._data[spec.start : spec.end], dtype=np.uint8)

    def close(self) -> None:
        self._data = memoryview(b"")  # drop the (possibly large) value; no release(): slices may live on


def deserialize_entry(data: bytes, key: str, *, verify: bool = True) -> StoredEntry:
    with BytesEntryReader(data, key) as reader:
        return reader.read_all(verify=verify)


def read_entry_file(path: Path, key: str, *, verify: bool = True) -> StoredEntry:
    with FileEntryReader(path, key) as reader:
        return reader.read_all(verify=verify)
