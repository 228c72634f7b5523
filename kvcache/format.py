"""The on-disk / on-wire format of one chunk-KV entry, and its in-memory form.

An entry is a standard safetensors file (any safetensors reader opens it) holding, for every layer l:

- `k.{l}`, `v.{l}`: (kv_heads, num_tokens, head_dim) in the storage dtype (fp16, bf16 or int8); K is
  pre-RoPE, exactly as in `ChunkKV`. int4: uint8 (kv_heads, num_tokens, head_dim / 2), two codes a byte.
- int8 only: `k_scale.{l}`, `v_scale.{l}`: (kv_heads, num_tokens) float32, symmetric absmax scales
  (see `kvcache.quant`), so dequantized = q * scale.
- int4 only: `k_scale.{l}`, `k_zero.{l}`: (kv_heads, num_k_groups, head_dim) fp16 (K per channel, groups
  of `int4_k_group` tokens) and `v_scale.{l}`, `v_zero.{l}`: (num_tokens, kv_heads * head_dim /
  int4_v_group) fp16 (V per token, groups of `int4_v_group` channels); see `kvcache.quant_int4`.

and string metadata: `format` ("blendrag-kv"), `format_version`, `key`, `model_fingerprint`,
`storage_dtype`, `num_layers`, `kv_heads`, `num_tokens`, `head_dim`, `created_at` (unix seconds),
int4 only `int4_k_group` and `int4_v_group`, and `checksums`: JSON {tensor name: CRC32 of its raw
bytes}. Checksums are per tensor so a reader that loads layer by layer verifies each layer as it arrives.
Every reader accepts every storage dtype, whatever the store is configured to write.

Public API:
- `encode_entry(kv, *, key, model_fingerprint, storage_dtype, created_at=None, int4=Int4Params()) -> StoredEntry`
- `serialize_entry(entry) -> bytes`; reading back is `kvcache.reader` (`deserialize_entry`, readers).
- `StoredEntry` (tensors in storage form, CPU): `.nbytes`, `.layer(l) -> LayerData`,
  `.to_chunk_kv(dtype=None, device="cpu") -> ChunkKV`.
- `format_bytes_per_token(storage_dtype, *, num_layers, kv_heads, head_dim, int4=None) -> float`
- `dequantize_layer_into(k_dst, v_dst, data, meta)` (CPU, no torch threads) and
  `dequantize_layer(data, meta, device, dtype)` (any device): one layer in compute form.
- `dequantize_prompt_layer(k_dst, v_dst, parts)` (CPU, the caller's torch threads) and
  `dequantize_entries_into(k_dst, v_dst, parts)` (CPU, entry by entry, no torch threads): one layer of a
  prompt's entries side by side along tokens.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
import zlib
from dataclasses import dataclass, field

import torch
from safetensors.torch import save as safetensors_save

from kvcache.config import StorageDType
from kvcache.errors import KVEntryCorrupt
from kvcache.hostcopy import all_finite, host_copy, host_dequantize, one_torch_thread
from kvcache.keys import check_key
from kvcache.quant import dequantize_int8, quantize_int8
from kvcache.quant_int4 import (
    Int4Quantized,
    check_v_group,
    dequantize_int4,
    dequantize_int4_spans,
    host_dequantize_int4,
    num_k_groups,
    quantize_int4,
    v_group_channels,
)
from kvcache.types import ChunkKV

FORMAT_NAME = "blendrag-kv"
FORMAT_VERSION = 1
TORCH_STORAGE_DTYPES: dict[str, torch.dtype] = {
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "int8": torch.int8,
    "int4": torch.uint8,  # two 4-bit codes a byte
}
QUANTIZED_DTYPES = ("int8", "int4")
SCALE_DTYPE = torch.float32  # int8 scales
INT4_PARAM_DTYPE = torch.float16  # int4 scales and zero points


@dataclass(frozen=True)
class Int4Params:
    """How int4 entries are grouped (see `kvcache.quant_int4`); recorded in each entry's metadata."""

    k_group: int = 128  # target tokens per K group (per channel)
    # channels per V group (per token), at most: SmolLM2's 3 heads x 64 make one group of a token's 192
    # values; one group per head (64) costs 240 B/token more, 6.15 KiB/token in all (KL: see bench kv)
    v_group: int = 192


def default_compute_dtype(storage_dtype: StorageDType) -> torch.dtype:
    """What a read returns when the caller names no dtype: the stored one, float32 for int8 / int4."""
    return torch.float32 if storage_dtype in QUANTIZED_DTYPES else TORCH_STORAGE_DTYPES[storage_dtype]


def layer_tensor_names(layer_idx: int, storage_dtype: str) -> tuple[str, ...]:
    names = (f"k.{layer_idx}", f"v.{layer_idx}")
    if storage_dtype == "int8":
        names += (f"k_scale.{layer_idx}", f"v_scale.{layer_idx}")
    elif storage_dtype == "int4":
        names += (f"k_scale.{layer_idx}", f"k_zero.{layer_idx}", f"v_scale.{layer_idx}", f"v_zero.{layer_idx}")
    return names


def tensor_checksum(t: torch.Tensor) -> int:
    """CRC32 of a CPU tensor's raw bytes (~2.6 GB/s here, cheaper than blake2b at ~0.7 GB/s)."""
    flat = t.contiguous().reshape(-1).view(torch.uint8)  # bf16 has no numpy dtype; bytes do
    return zlib.crc32(flat.numpy())


@dataclass(frozen=True)
class EntryMeta:
    key: str
    model_fingerprint: str
    storage_dtype: StorageDType
    num_layers: int
    kv_heads: int
    num_tokens: int
    head_dim: int
    created_at: float
    checksums: dict[str, int] = field(repr=False)  # tensor name -> CRC32
    int4_k_group: int = 0  # int4 only: tokens per K group of this entry
    int4_v_group: int = 0  # int4 only: channels per V group

    @property
    def quantized(self) -> bool:
        return self.storage_dtype in QUANTIZED_DTYPES

    def tensor_names(self) -> list[str]:
        return [n for layer in range(self.num_layers) for n in layer_tensor_names(layer, self.storage_dtype)]

    def expected_dtype(self, name: str) -> torch.dtype:
        if "_scale." in name or "_zero." in name:
            return INT4_PARAM_DTYPE if self.storage_dtype == "int4" else SCALE_DTYPE
        return TORCH_STORAGE_DTYPES[self.storage_dtype]

    def expected_shape(self, name: str) -> tuple[int, ...]:
        if self.storage_dtype == "int4":
            if name.startswith("k_"):
                return (self.kv_heads, num_k_groups(self.num_tokens, self.int4_k_group), self.head_dim)
            if name.startswith("v_"):
                return (self.num_tokens, self.kv_heads * self.head_dim // self.int4_v_group)
            return (self.kv_heads, self.num_tokens, self.head_dim // 2)
        if "_scale." in name:
            return (self.kv_heads, self.num_tokens)
        return (self.kv_heads, self.num_tokens, self.head_dim)

    @property
    def bytes_per_token(self) -> float:
        """Tensor bytes of this entry per token, scales included (the format's cost)."""
        total = 0
        for name in layer_tensor_names(0, self.storage_dtype):
            numel = 1
            for d in self.expected_shape(name):
                numel *= d
            total += numel * self.expected_dtype(name).itemsize
        return total * self.num_layers / self.num_tokens

    def to_metadata(self) -> dict[str, str]:
        extra = {}
        if self.storage_dtype == "int4":
            extra = {"int4_k_group": str(self.int4_k_group), "int4_v_group": str(self.int4_v_group)}
        return extra | {
            "format": FORMAT_NAME,
            "format_version": str(FORMAT_VERSION),
            "key": self.key,
            "model_fingerprint": self.model_fingerprint,
            "storage_dtype": self.storage_dtype,
            "num_layers": str(self.num_layers),
            "kv_heads": str(self.kv_heads),
            "num_tokens": str(self.num_tokens),
            "head_dim": str(self.head_dim),
            "created_at": repr(self.created_at),
            "checksums": json.dumps(self.checksums, separators=(",", ":"), sort_keys=True),
        }

    @classmethod
    def from_metadata(cls, raw: dict[str, str] | None, expected_key: str) -> EntryMeta:
        """Parse and validate; raises KVEntryCorrupt(kind="format") on anything unexpected."""

        def bad(reason: str) -> KVEntryCorrupt:
            return KVEntryCorrupt(expected_key, reason, kind="format")

        if not isinstance(raw, dict):
            raise bad("no metadata")
        if raw.get("format") != FORMAT_NAME:
            raise bad(f"format is {raw.get('format')!r}, not {FORMAT_NAME!r}")
        if raw.get("format_version") != str(FORMAT_VERSION):
            raise bad(f"unsupported format_version {raw.get('format_version')!r}")
        if raw.get("key") != expected_key:
            raise bad(f"entry says key {str(raw.get('key'))[:16]!r}")  # renamed or misplaced file
        if raw.get("storage_dtype") not in TORCH_STORAGE_DTYPES:
            raise bad(f"unknown storage_dtype {raw.get('storage_dtype')!r}")
        try:
            dims = {n: int(raw[n]) for n in ("num_layers", "kv_heads", "num_tokens", "head_dim")}
            created_at = float(raw["created_at"])
            checksums = json.loads(raw["checksums"])
            fingerprint = raw["model_fingerprint"]
            groups = (
                {n: int(raw[n]) for n in ("int4_k_group", "int4_v_group")} if raw["storage_dtype"] == "int4" else {}
            )
        except (KeyError, ValueError, TypeError) as exc:
            raise bad(f"unreadable metadata: {exc!r}") from exc
        if any(v <= 0 for v in dims.values()):
            raise bad(f"non-positive dimension in {dims}")
        if groups:
            if dims["head_dim"] % 2 or any(v <= 0 for v in groups.values()):
                raise bad(f"int4 entry with head_dim {dims['head_dim']} and groups {groups}")
            try:
                check_v_group(dims["kv_heads"], dims["head_dim"], groups["int4_v_group"])
            except ValueError as exc:
                raise bad(str(exc)) from exc
        if not isinstance(checksums, dict) or not all(
            isinstance(k, str) and isinstance(v, int) for k, v in checksums.items()
        ):
            raise bad("checksums is not a {name: int} map")
        meta = cls(
            key=expected_key,
            model_fingerprint=fingerprint,
            storage_dtype=raw["storage_dtype"],
            created_at=created_at,
            checksums=checksums,
            **dims,
            **groups,
        )  # type: ignore[arg-type]
        if set(checksums) != set(meta.tensor_names()):
            raise bad("checksums do not name exactly the entry's tensors")
        return meta


@dataclass
class LayerData:
    """One layer of one entry in storage form, on CPU."""

    k: torch.Tensor  # (kv_heads, num_tokens, head_dim) storage dtype; int4: uint8 (..., head_dim / 2)
    v: torch.Tensor  # same shape and dtype as k
    k_scale: torch.Tensor | None = None  # int8: (kv_heads, num_tokens) float32; int4: see the module doc
    v_scale: torch.Tensor | None = None
    k_zero: torch.Tensor | None = None  # int4 only
    v_zero: torch.Tensor | None = None

    def named(self, layer_idx: int) -> dict[str, torch.Tensor]:
        out = {f"k.{layer_idx}": self.k, f"v.{layer_idx}": self.v}
        for name in ("k_scale", "k_zero", "v_scale", "v_zero"):
            t = getattr(self, name)
            if t is not None:
                out[f"{name}.{layer_idx}"] = t
        return out


_PARAM_FIELDS = ("k_scale", "v_scale", "k_zero", "v_zero")


def _int4_part(data: LayerData, meta: EntryMeta, kind: str) -> Int4Quantized:
    packed, scale, zero = (data.k, data.k_scale, data.k_zero) if kind == "k" else (data.v, data.v_scale, data.v_zero)
    assert scale is not None and zero is not None
    group = meta.int4_k_group if kind == "k" else meta.int4_v_group
    return Int4Quantized(packed=packed, scale=scale, zero=zero, group=group)


def dequantize_layer_into(k_dst: torch.Tensor, v_dst: torch.Tensor, data: LayerData, meta: EntryMeta) -> None:
    """Write one stored layer into CPU tensors (or views) of the compute dtype, without torch threads."""
    if meta.storage_dtype == "int4":
        for dst, kind in ((k_dst, "k"), (v_dst, "v")):
            q4 = _int4_part(data, meta, kind)
            host_dequantize_int4(dst, q4.packed, q4.scale, q4.zero, kind, q4.group)  # type: ignore[arg-type]
    elif data.k_scale is not None and data.v_scale is not None:
        host_dequantize(k_dst, data.k, data.k_scale)
        host_dequantize(v_dst, data.v, data.v_scale)
    else:
        host_copy(k_dst, data.k)
        host_copy(v_dst, data.v)


def dequantize_prompt_layer(k_dst: torch.Tensor, v_dst: torch.Tensor, parts: list[tuple[LayerData, EntryMeta]]) -> None:
    """One layer of several entries (a prompt's chunks, in order) into CPU tensors (H, N, D) of the compute
    dtype: int4 entries of one V grouping in a few whole-layer ops on the caller's torch threads
    (`dequantize_int4_spans`), anything else entry by entry. Bit for bit `dequantize_layer_into` of each."""
    metas = [meta for _, meta in parts]
    if all(m.storage_dtype == "int4" for m in metas) and len({m.int4_v_group for m in metas}) == 1:
        for dst, kind in ((k_dst, "k"), (v_dst, "v")):
            dequantize_int4_spans(dst, [_int4_part(data, meta, kind) for data, meta in parts], kind)  # type: ignore[arg-type]
        return
    dequantize_entries_into(k_dst, v_dst, parts)


def dequantize_entries_into(k_dst: torch.Tensor, v_dst: torch.Tensor, parts: list[tuple[LayerData, EntryMeta]]) -> None:
    """One layer of several entries into CPU tensors (H, N, D), entry by entry into its own rows
    (`dequantize_layer_into`: no torch threads, no temporaries of the whole layer)."""
    start = 0
    for data, meta in parts:
        end = start + meta.num_tokens
        dequantize_layer_into(k_dst[:, start:end], v_dst[:, start:end], data, meta)
        start = end


def dequantize_layer(
    data: LayerData, meta: EntryMeta, device: torch.device | str, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """One stored layer as (k, v) in `dtype` on `device`, converted there (the stored bytes travel)."""
    if meta.storage_dtype == "int4":
        parts = []
        for kind in ("k", "v"):
            q4 = _int4_part(data, meta, kind)
            on_dev = Int4Quantized(
                packed=q4.packed.to(device), scale=q4.scale.to(device), zero=q4.zero.to(device), group=q4.group
            )
            parts.append(dequantize_int4(on_dev, kind, dtype))  # type: ignore[arg-type]
        return parts[0], parts[1]
    if data.k_scale is not None and data.v_scale is not None:
        return (
            dequantize_int8(data.k.to(device), data.k_scale.to(device), dtype),
            dequantize_int8(data.v.to(device), data.v_scale.to(device), dtype),
        )
    return data.k.to(device).to(dtype), data.v.to(device).to(dtype)


@dataclass
class StoredEntry:
    """A whole entry in storage form on CPU: what the memory tier holds and what readers rebuild.

    Each tensor is its per-layer form (see `LayerData`) stacked along a leading layer dimension."""

    meta: EntryMeta
    k: torch.Tensor  # (num_layers, kv_heads, num_tokens, head_dim) storage dtype (int4: head_dim / 2)
    v: torch.Tensor
    k_scale: torch.Tensor | None = None  # int8 / int4 only
    v_scale: torch.Tensor | None = None
    k_zero: torch.Tensor | None = None  # int4 only
    v_zero: torch.Tensor | None = None

    @property
    def key(self) -> str:
        return self.meta.key

    @property
    def nbytes(self) -> int:
        tensors = [t for t in (self.k, self.v, self.k_scale, self.v_scale, self.k_zero, self.v_zero) if t is not None]
        return sum(t.numel() * t.element_size() for t in tensors)

    def layer(self, layer_idx: int) -> LayerData:
        params = {n: None if getattr(self, n) is None else getattr(self, n)[layer_idx] for n in _PARAM_FIELDS}
        return LayerData(k=self.k[layer_idx], v=self.v[layer_idx], **params)

    def to_chunk_kv(self, dtype: torch.dtype | None = None, device: torch.device | str = "cpu") -> ChunkKV:
        """Dequantized copies (never the tiers' own tensors: callers may rotate K in place)."""
        dtype = dtype or default_compute_dtype(self.meta.storage_dtype)
        m = self.meta
        if torch.device(device).type != "cpu":
            layers = [dequantize_layer(self.layer(i), m, device, dtype) for i in range(m.num_layers)]
            return ChunkKV(k=torch.stack([k for k, _ in layers]), v=torch.stack([v for _, v in layers]))
        shape = (m.num_layers, m.kv_heads, m.num_tokens, m.head_dim)
        k = torch.empty(shape, dtype=dtype)
        v = torch.empty(shape, dtype=dtype)
        if m.storage_dtype == "int4":
            for i in range(m.num_layers):
                dequantize_layer_into(k[i], v[i], self.layer(i), m)
        elif self.k_scale is None or self.v_scale is None:
            host_copy(k, self.k)
            host_copy(v, self.v)
        else:
            host_dequantize(k, self.k, self.k_scale)
            host_dequantize(v, self.v, self.v_scale)
        return ChunkKV(k=k, v=v)

    @classmethod
    def from_layers(cls, meta: EntryMeta, layers: list[LayerData]) -> StoredEntry:
        if len(layers) != meta.num_layers:
            raise ValueError(f"{len(layers)} layers for an entry of {meta.num_layers}")
        params: dict[str, torch.Tensor | None] = {}
        for name in _PARAM_FIELDS:
            parts = [getattr(ld, name) for ld in layers]
            params[name] = None if any(p is None for p in parts) else torch.stack(parts)
        return cls(
            meta=meta,
            k=torch.stack([ld.k for ld in layers]),
            v=torch.stack([ld.v for ld in layers]),
            **params,  # type: ignore[arg-type]
        )

    def named_tensors(self) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for layer in range(self.meta.num_layers):
            out.update(self.layer(layer).named(layer))
        return out


def format_bytes_per_token(
    storage_dtype: StorageDType, *, num_layers: int, kv_heads: int, head_dim: int, int4: Int4Params | None = None
) -> float:
    """Bytes per token of an entry in `storage_dtype` for this model shape, scales included: the store's
    price. int4's K scales are per group of tokens, so the figure is for chunks of one full K group."""
    params = int4 or Int4Params()
    groups = {}
    if storage_dtype == "int4":
        groups = {
            "int4_k_group": params.k_group,
            "int4_v_group": v_group_channels(kv_heads, head_dim, params.v_group),
        }
    meta = EntryMeta(
        key="0" * 64,
        model_fingerprint="-",
        storage_dtype=storage_dtype,
        num_layers=num_layers,
        kv_heads=kv_heads,
        num_tokens=params.k_group,
        head_dim=head_dim,
        created_at=0.0,
        checksums={},
        **groups,
    )
    return meta.bytes_per_token


def _to_storage(x: torch.Tensor, storage_dtype: StorageDType, what: str) -> torch.Tensor:
    if not torch.is_floating_point(x):
        raise ValueError(f"{what} must be a floating tensor, got {x.dtype}")
    # always a copy: the caller (the engine) may reuse or modify its buffers after put()
    out = torch.empty(x.shape, dtype=TORCH_STORAGE_DTYPES[storage_dtype])
    host_copy(out, x.detach().cpu())
    if not all_finite(out):
        # fp16 tops out at 65504: storing inf would turn into NaN attention later, i.e. a wrong answer
        raise ValueError(f"{what} has non-finite values in {storage_dtype} (use bf16 for large activations)")
    return out


def encode_entry(
    kv: ChunkKV,
    *,
    key: str,
    model_fingerprint: str,
    storage_dtype: StorageDType,
    created_at: float | None = None,
    int4: Int4Params | None = None,
) -> StoredEntry:
    """Convert a chunk's KV to its stored form and compute the per-tensor checksums."""
    check_key(key)
    if storage_dtype not in TORCH_STORAGE_DTYPES:
        raise ValueError(f"storage_dtype must be one of {sorted(TORCH_STORAGE_DTYPES)}")
    if not model_fingerprint:
        raise ValueError("model_fingerprint must be non-empty")
    if kv.k.dim() != 4 or kv.k.shape != kv.v.shape:
        raise ValueError(
            f"ChunkKV k/v must both be (num_layers, kv_heads, num_tokens, head_dim); "
            f"got {tuple(kv.k.shape)} and {tuple(kv.v.shape)}"
        )
    if 0 in kv.k.shape:
        raise ValueError(f"ChunkKV has an empty dimension: {tuple(kv.k.shape)}")
    num_layers, kv_heads, num_tokens, head_dim = kv.k.shape
    k_scale = v_scale = k_zero = v_zero = None
    groups: dict[str, int] = {}
    if storage_dtype == "int4":
        params = int4 or Int4Params()
        if head_dim % 2:
            raise ValueError(f"int4 storage needs an even head_dim, got {head_dim}")
        for what, x in (("k", kv.k), ("v", kv.v)):
            if not torch.is_floating_point(x):
                raise ValueError(f"{what} must be a floating tensor, got {x.dtype}")
        with one_torch_thread():
            k4 = quantize_int4(kv.k, kind="k", k_group_target=params.k_group)  # raises on non-finite values
            v4 = quantize_int4(kv.v, kind="v", v_group=params.v_group)
        k, v, k_scale, k_zero, v_scale, v_zero = k4.packed, v4.packed, k4.scale, k4.zero, v4.scale, v4.zero
        groups = {"int4_k_group": k4.group, "int4_v_group": v4.group}
    elif storage_dtype == "int8":
        for what, x in (("k", kv.k), ("v", kv.v)):
            if not torch.is_floating_point(x) or not all_finite(x):
                raise ValueError(f"{what} must be a finite floating tensor")
        with one_torch_thread():
            kq, vq = quantize_int8(kv.k.detach().cpu()), quantize_int8(kv.v.detach().cpu())
        k, v, k_scale, v_scale = kq.q, vq.q, kq.scale, vq.scale
    else:
        k, v = _to_storage(kv.k, storage_dtype, "k"), _to_storage(kv.v, storage_dtype, "v")
    created = time.time() if created_at is None else created_at
    if not math.isfinite(created):
        raise ValueError("created_at must be finite")
    meta = EntryMeta(
        key=key,
        model_fingerprint=model_fingerprint,
        storage_dtype=storage_dtype,
        num_layers=num_layers,
        kv_heads=kv_heads,
        num_tokens=num_tokens,
        head_dim=head_dim,
        created_at=created,
        checksums={},
        **groups,
    )
    entry = StoredEntry(meta=meta, k=k, v=v, k_scale=k_scale, v_scale=v_scale, k_zero=k_zero, v_zero=v_zero)
    checksums = {name: tensor_checksum(t) for name, t in entry.named_tensors().items()}
    entry.meta = dataclasses.replace(meta, checksums=checksums)
    return entry


def serialize_entry(entry: StoredEntry) -> bytes:
    """The entry as safetensors bytes: what the disk tier writes and the Redis tier stores."""
    return safetensors_save(entry.named_tensors(), metadata=entry.meta.to_metadata())
