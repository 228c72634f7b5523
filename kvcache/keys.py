"""Content-addressed keys of chunk-KV entries.

`chunk_key(model_fingerprint, prefix_token_ids, chunk_token_ids) -> str` is the sha256 (64 lowercase
hex chars) over the inputs, each framed with its length so that no two different inputs hash the same
bytes (prefix [1, 2] + chunk [3] differs from prefix [1] + chunk [2, 3]). Changing the model, the system
prompt/template (prefix) or the chunk text yields a new key, so stale entries are never served: they
simply stop being found.

A key names what was computed, not how it is stored: the storage dtype is in the entry's metadata and
every reader dequantizes whatever it finds, so changing `storage_dtype` (or `blendrag cache convert`)
keeps every key and every stored entry usable. Keys once also framed the storage dtype; that slot is
kept and always holds "fp16" (the default of that time), so entries written then keep their keys.
"""

from __future__ import annotations

import hashlib
import re
import struct
import sys
from array import array
from collections.abc import Iterable

KEY_VERSION = b"blendrag-kv-key/v1"
_KEY_RE = re.compile(r"^[0-9a-f]{64}$")
_FORMAT_SLOT = b"fp16"  # see the module docstring


def _token_bytes(token_ids: Iterable[int]) -> bytes:
    ids = token_ids.tolist() if hasattr(token_ids, "tolist") else list(token_ids)  # tensors, numpy arrays
    try:
        packed = array("q", ids)  # int64; refuses floats and out-of-range values
    except (TypeError, OverflowError) as exc:
        raise ValueError(f"token ids must be integers in int64 range: {exc}") from exc
    if any(t < 0 for t in packed):
        raise ValueError("token ids must be non-negative")
    if sys.byteorder == "big":  # keys must not depend on the host
        packed.byteswap()
    return struct.pack("<Q", len(packed)) + packed.tobytes()


def _framed(data: bytes) -> bytes:
    return struct.pack("<Q", len(data)) + data


def chunk_key(model_fingerprint: str, prefix_token_ids: Iterable[int], chunk_token_ids: Iterable[int]) -> str:
    """The entry key of one chunk precomputed behind `prefix_token_ids` by the model `model_fingerprint`."""
    if not model_fingerprint:
        raise ValueError("model_fingerprint must be a non-empty string")
    chunk = _token_bytes(chunk_token_ids)
    if chunk[:8] == b"\0" * 8:
        raise ValueError("a chunk needs at least one token")
    h = hashlib.sha256()
    h.update(_framed(KEY_VERSION))
    h.update(_framed(model_fingerprint.encode("utf-8")))
    h.update(_token_bytes(prefix_token_ids))
    h.update(chunk)
    h.update(_framed(_FORMAT_SLOT))
    return h.hexdigest()


def is_valid_key(key: object) -> bool:
    """True for a string shaped like a key (64 lowercase hex chars); safe to use in a file name."""
    return isinstance(key, str) and _KEY_RE.fullmatch(key) is not None


def check_key(key: object) -> str:
    """Return `key` unchanged or raise ValueError; every tier calls this before touching storage."""
    if not is_valid_key(key):
        raise ValueError(f"not a KV entry key (64 lowercase hex chars): {key!r:.80}")
    return key  # type: ignore[return-value]
