import json
import struct
import zlib
from pathlib import Path

import pytest
import torch
from kvtest_helpers import FINGERPRINT, HEAD_DIM, KV_HEADS, NUM_LAYERS, NUM_TOKENS, key_of, make_kv
from safetensors import safe_open

from kvcache.errors import KVEntryCorrupt
from kvcache.format import FORMAT_NAME, StoredEntry, encode_entry, serialize_entry
from kvcache.quant import dequantize_int8, quantize_int8
from kvcache.reader import BytesEntryReader, FileEntryReader, deserialize_entry, read_entry_file
from kvcache.types import ChunkKV


def _encode(kv: ChunkKV, dtype: str = "fp16", key: str | None = None, created_at: float = 1700000000.5):
    return encode_entry(
        kv,
        key=key or key_of(0),
        model_fingerprint=FINGERPRINT,  # type: ignore[arg-type]
        storage_dtype=dtype,
        created_at=created_at,
    )  # type: ignore[arg-type]


def _write(folder: Path, entry: StoredEntry) -> Path:
    """The entry serialized to `folder`/e.safetensors."""
    path = folder / "e.safetensors"
    path.write_bytes(serialize_entry(entry))
    return path


@pytest.mark.parametrize(("storage", "torch_dtype"), [("fp16", torch.float16), ("bf16", torch.bfloat16)])
def test_round_trip_is_bit_exact(tmp_path: Path, storage: str, torch_dtype: torch.dtype) -> None:
    kv = make_kv(1, dtype=torch_dtype)
    entry = _encode(kv, storage)
    data = serialize_entry(entry)
    back = deserialize_entry(data, entry.key)
    assert back.k.dtype == torch_dtype
    assert torch.equal(back.k.view(torch.int16), kv.k.view(torch.int16))  # bit patterns, not values
    assert torch.equal(back.v.view(torch.int16), kv.v.view(torch.int16))
    path = tmp_path / "e.safetensors"
    path.write_bytes(data)
    from_file = read_entry_file(path, entry.key).to_chunk_kv()
    assert torch.equal(from_file.k, kv.k) and torch.equal(from_file.v, kv.v)


def test_float32_input_is_stored_as_its_fp16_rounding() -> None:
    kv = make_kv(2, dtype=torch.float32)
    back = deserialize_entry(serialize_entry(_encode(kv, "fp16")), key_of(0)).to_chunk_kv(torch.float32)
    assert torch.equal(back.k, kv.k.half().float())
    assert torch.equal(back.v, kv.v.half().float())


def test_int8_error_is_at_most_half_a_scale_step() -> None:
    kv = make_kv(3, dtype=torch.float32)
    kv.k[1, 0, 5] = 0.0  # an all-zero row: scale 0, dequantizes to exactly 0
    entry = _encode(kv, "int8", key=key_of(0))
    back = deserialize_entry(serialize_entry(entry), entry.key)
    assert back.k.dtype == torch.int8 and back.k_scale is not None and back.v_scale is not None
    assert back.k_scale.shape == (NUM_LAYERS, KV_HEADS, NUM_TOKENS)
    assert back.k_scale.dtype == torch.float32
    expected_scale = kv.k.abs().amax(dim=-1) / 127
    assert torch.equal(back.k_scale, expected_scale)
    out = back.to_chunk_kv(torch.float32)
    for orig, deq, scale in ((kv.k, out.k, back.k_scale), (kv.v, out.v, back.v_scale)):
        err = (orig - deq).abs()
        bound = scale.unsqueeze(-1) / 2 * (1 + 1e-5) + 1e-7  # scale/2 up to float32 rounding
        assert bool((err <= bound).all()), float((err - bound).max())
    assert torch.equal(out.k[1, 0, 5], torch.zeros(HEAD_DIM))
    # the row's absmax element is reproduced exactly: q = ±127
    assert int(back.k.abs().amax()) == 127


def test_quantize_helpers_directly() -> None:
    x = torch.tensor([[0.5, -1.0, 0.25, 0.0]])
    qz = quantize_int8(x)
    assert qz.q.tolist() == [[64, -127, 32, 0]]  # round(0.5*127)=64 (half to even: 63.5 -> 64)
    assert torch.allclose(qz.scale, torch.tensor([1.0 / 127]))
    assert dequantize_int8(qz.q, qz.scale, torch.float32)[0, 1].item() == -1.0


def test_metadata_and_checksums(tmp_path: Path) -> None:
    kv = make_kv(4)
    entry = _encode(kv, "fp16", created_at=1234.25)
    path = _write(tmp_path, entry)
    # any safetensors reader opens it: names, dtypes, shapes and metadata as documented
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
        assert sorted(f.keys()) == sorted([f"k.{i}" for i in range(4)] + [f"v.{i}" for i in range(4)])
        t = f.get_tensor("v.3")
        assert t.dtype == torch.float16 and t.shape == (KV_HEADS, NUM_TOKENS, HEAD_DIM)
        assert torch.equal(t, kv.v[3])
    assert meta["format"] == FORMAT_NAME and meta["format_version"] == "1"
    assert meta["key"] == entry.key and meta["model_fingerprint"] == FINGERPRINT
    dims = (meta["num_layers"], meta["kv_heads"], meta["num_tokens"], meta["head_dim"])
    assert dims == ("4", "2", "16", "8")
    assert meta["storage_dtype"] == "fp16" and float(meta["created_at"]) == 1234.25
    sums = json.loads(meta["checksums"])
    assert sums["k.2"] == zlib.crc32(kv.k[2].contiguous().view(torch.uint8).numpy().tobytes())
    assert len(sums) == 8


def test_int8_file_names_scales(tmp_path: Path) -> None:
    entry = _encode(make_kv(5, dtype=torch.float32), "int8", key=key_of(1))
    path = _write(tmp_path, entry)
    with safe_open(str(path), framework="pt") as f:
        assert f.get_tensor("k.0").dtype == torch.int8
        assert f.get_tensor("v_scale.3").shape == (KV_HEADS, NUM_TOKENS)
        assert len(list(f.keys())) == 16


@pytest.mark.parametrize("bad", ["rank", "shape_mismatch", "empty", "overflow", "nan", "int"])
def test_encode_rejects_malformed_kv(bad: str) -> None:
    kv = make_kv(6, dtype=torch.float32)
    if bad == "rank":
        kv = ChunkKV(k=kv.k[0], v=kv.v[0])
    elif bad == "shape_mismatch":
        kv = ChunkKV(k=kv.k, v=kv.v[:, :, :8])
    elif bad == "empty":
        kv = ChunkKV(k=kv.k[:, :, :0], v=kv.v[:, :, :0])
    elif bad == "overflow":
        kv.k[0, 0, 0, 0] = 1e6  # beyond fp16's 65504
    elif bad == "nan":
        kv.v[2, 1, 3, 4] = float("nan")
    else:
        kv = ChunkKV(k=kv.k.to(torch.int32), v=kv.v.to(torch.int32))
    with pytest.raises(ValueError):
        _encode(kv, "fp16")


def test_overflow_is_fine_in_bf16() -> None:
    kv = make_kv(6, dtype=torch.float32)
    kv.k[0, 0, 0, 0] = 1e6
    entry = _encode(kv, "bf16", key=key_of(0))
    assert entry.k[0, 0, 0, 0].item() == pytest.approx(1e6, rel=1e-2)


def _data_offset_of(data: bytes, name: str) -> int:
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    return 8 + n + header[name]["data_offsets"][0]


def test_checksum_failure_is_per_layer() -> None:
    entry = _encode(make_kv(7))
    data = bytearray(serialize_entry(entry))
    data[_data_offset_of(bytes(data), "v.2") + 5] ^= 0x40
    reader = BytesEntryReader(bytes(data), entry.key)  # header is fine: opens
    for layer in (0, 1, 3):
        assert torch.equal(reader.read_layer(layer).k, entry.k[layer])
    with pytest.raises(KVEntryCorrupt) as info:
        reader.read_layer(2)
    assert (info.value.kind, info.value.layer_idx, info.value.key) == ("checksum", 2, entry.key)
    # without verification the flipped bit goes through: that is what the checksum is for
    assert not torch.equal(reader.read_layer(2, verify=False).v, entry.v[2])


@pytest.mark.parametrize(
    ("mutation", "kind"),
    [
        ("truncate_data", "truncated"),
        ("truncate_header", "truncated"),
        ("tiny", "truncated"),
        ("trailing", "format"),
        ("header_garbage", "format"),
        ("wrong_key", "format"),
        ("huge_header_len", "format"),
    ],
)
def test_damaged_bytes_are_rejected_at_open(tmp_path: Path, mutation: str, kind: str) -> None:
    entry = _encode(make_kv(8))
    data = serialize_entry(entry)
    key = entry.key
    if mutation == "truncate_data":
        data = data[:-10]
    elif mutation == "truncate_header":
        data = data[:40]
    elif mutation == "tiny":
        data = data[:5]
    elif mutation == "trailing":
        data = data + b"\0" * 16
    elif mutation == "header_garbage":
        data = data[:20] + b"\xff\xfe" + data[22:]
    elif mutation == "wrong_key":
        key = key_of(99)
    else:
        data = struct.pack("<Q", 2**40) + data[8:]
    with pytest.raises(KVEntryCorrupt) as info:
        BytesEntryReader(data, key)
    assert info.value.kind == kind
    path = tmp_path / "x.safetensors"
    path.write_bytes(data)
    with pytest.raises(KVEntryCorrupt) as info2:
        FileEntryReader(path, key)
    assert info2.value.kind == kind


def test_file_shrinking_under_an_open_reader_is_an_error_not_a_crash(tmp_path: Path) -> None:
    entry = _encode(make_kv(9))
    path = _write(tmp_path, entry)
    with FileEntryReader(path, entry.key) as reader:
        assert torch.equal(reader.read_layer(0).k, entry.k[0])
        with open(path, "r+b") as f:
            f.truncate(200)  # with an mmap (safe_open) this read would SIGBUS the process
        with pytest.raises(KVEntryCorrupt) as info:
            reader.read_layer(3)
    assert info.value.kind == "truncated"


@pytest.mark.parametrize("storage_dtype", ["int4", "int8"])
def test_quantizing_runs_on_the_calling_thread_and_gives_the_threads_back(
    storage_dtype: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import kvcache.format as format_module

    seen: list[int] = []
    name = "quantize_int4" if storage_dtype == "int4" else "quantize_int8"
    real = getattr(format_module, name)

    def spy(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return real(*args, **kwargs)

    monkeypatch.setattr(format_module, name, spy)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        encode_entry(make_kv(1), key=key_of(1), model_fingerprint=FINGERPRINT, storage_dtype=storage_dtype)
        assert seen == [1, 1]  # K and V, each with no OpenMP team of its own
        assert torch.get_num_threads() == 2
        bad = make_kv(2)
        bad.k[0, 0, 0, 0] = float("inf")
        with pytest.raises(ValueError):
            encode_entry(bad, key=key_of(2), model_fingerprint=FINGERPRINT, storage_dtype=storage_dtype)
        assert torch.get_num_threads() == 2  # restored when quantizing raises, too
    finally:
        torch.set_num_threads(before)


def test_a_reader_used_with_with_is_closed_on_the_way_out_an_error_included(tmp_path: Path) -> None:
    entry = _encode(make_kv(9))
    path = _write(tmp_path, entry)
    with FileEntryReader(path, entry.key) as reader:
        assert torch.equal(reader.read_layer(0).k, entry.k[0])
    with pytest.raises(ValueError, match="reader is closed"):
        reader.read_layer(0)
    with pytest.raises(RuntimeError, match="boom"), FileEntryReader(path, entry.key) as failing:
        raise RuntimeError("boom")
    with pytest.raises(ValueError, match="reader is closed"):
        failing.read_layer(0)
