import itertools
from pathlib import Path

import pytest
import torch
from kvtest_helpers import FINGERPRINT, key_of, make_kv, settings

from kvcache.errors import KVEntryCorrupt
from kvcache.format import Int4Params, encode_entry, serialize_entry
from kvcache.quant_int4 import (
    dequantize_int4,
    dequantize_int4_spans,
    host_dequantize_int4,
    k_group_tokens,
    pack_nibbles,
    quantize_int4,
    unpack_nibbles,
)
from kvcache.reader import deserialize_entry
from kvcache.store import TieredKVStore
from kvcache.types import ChunkKV


def _layer(seed: int, heads: int = 3, tokens: int = 45, dim: int = 16) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(heads, tokens, dim, generator=g)
    x[:, :, 3] *= 40.0  # an outlier channel, as pre-RoPE keys have
    x[1, :, 5] += 7.0  # a channel offset: what the zero point is for
    return x


def test_k_groups_are_balanced_near_the_target() -> None:
    assert [k_group_tokens(t, 128) for t in (1, 64, 128, 150, 191, 192, 256, 300, 1000)] == [
        1,
        64,
        128,
        150,  # one group of 150, not 128 + a nearly empty 22
        191,
        96,
        128,
        150,
        125,
    ]
    with pytest.raises(ValueError):
        k_group_tokens(0, 128)


def test_packing_is_lossless_and_low_nibble_is_the_even_channel() -> None:
    codes = torch.tensor(list(itertools.product(range(16), repeat=2)), dtype=torch.uint8)  # (256, 2)
    packed = pack_nibbles(codes)
    assert packed.shape == (256, 1)
    assert packed[:, 0].tolist() == [a | (b << 4) for a, b in codes.tolist()]
    assert torch.equal(unpack_nibbles(packed), codes)
    rnd = torch.randint(0, 16, (3, 7, 10), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    assert torch.equal(unpack_nibbles(pack_nibbles(rnd)), rnd)
    with pytest.raises(ValueError, match="even"):
        pack_nibbles(torch.zeros(2, 3, dtype=torch.uint8))


@pytest.mark.parametrize(("kind", "group"), [("k", 20), ("k", 128), ("v", 8), ("v", 16), ("v", 48)])
def test_round_trip_error_is_at_most_half_a_step_per_group(kind: str, group: int) -> None:
    x = _layer(1)  # 45 tokens: K groups of 20 -> balanced 2 groups of 23 (the last one 22)
    q4 = quantize_int4(x, kind=kind, k_group_target=group, v_group=group)  # type: ignore[arg-type]
    back = dequantize_int4(q4, kind, torch.float32)  # type: ignore[arg-type]
    s, z = q4.scale.float(), q4.zero.float()
    if kind == "k":
        assert q4.group == k_group_tokens(45, group)
        assert q4.scale.shape == (3, -(-45 // q4.group), 16) and q4.scale.dtype == torch.float16
        step = s.repeat_interleave(q4.group, dim=1)[:, :45]  # (H, T, D): each value's own group step
        zero = z.repeat_interleave(q4.group, dim=1)[:, :45]
        groups = x.transpose(1, 2)  # (H, D, T)
    else:
        assert q4.scale.shape == (45, 3 * 16 // group)
        step = s.repeat_interleave(group, dim=1).reshape(45, 3, 16).transpose(0, 1)
        zero = z.repeat_interleave(group, dim=1).reshape(45, 3, 16).transpose(0, 1)
        groups = x
    # the definition: zero <= every value <= zero + 15 * step, codes 0..15
    assert bool((zero <= x).all()) and bool((x <= zero + 15 * step * (1 + 1e-6)).all())
    err = (x - back).abs()
    bound = step / 2 + 1e-6 * (zero.abs() + 15 * step)  # half a step, up to float32 rounding of q*s+z
    assert bool((err <= bound).all()), float((err - bound).max())
    assert groups.numel() == x.numel()
    # the extreme values of a group are hit within half a step too, so the step is as small as it can be
    assert int(unpack_nibbles(q4.packed).max()) == 15 and int(unpack_nibbles(q4.packed).min()) == 0


def test_constant_group_reconstructs_its_value() -> None:
    x = torch.full((1, 4, 2), 0.3)
    for kind in ("k", "v"):
        q4 = quantize_int4(x, kind=kind, v_group=2)  # type: ignore[arg-type]
        # the zero point is 0.3 rounded down to fp16; the step only spans that rounding gap
        assert bool((q4.zero.float() <= 0.3).all()) and bool((q4.scale.float() * 15 < 0.3 * 2**-10).all())
        back = dequantize_int4(q4, kind, torch.float32)  # type: ignore[arg-type]
        assert bool(((back - x).abs() <= q4.scale.float().max() / 2 * (1 + 1e-6)).all())


@pytest.mark.parametrize("group", [8, 16, 24, 48])  # V: within a head, across a head boundary, whole heads
def test_host_dequantize_matches_torch_bit_for_bit(group: int) -> None:
    x = _layer(2, tokens=37)
    for kind in ("k", "v"):
        q4 = quantize_int4(x, kind=kind, k_group_target=group, v_group=group)  # type: ignore[arg-type]
        out = torch.empty(x.shape)
        host_dequantize_int4(out, q4.packed, q4.scale, q4.zero, kind, q4.group)  # type: ignore[arg-type]
        assert torch.equal(out, dequantize_int4(q4, kind, torch.float32))  # type: ignore[arg-type]
        wide = torch.zeros(3, 50, 16)
        host_dequantize_int4(wide[:, 5:42], q4.packed, q4.scale, q4.zero, kind, q4.group)  # type: ignore[arg-type]
        assert torch.equal(wide[:, 5:42], out) and not wide[:, :5].any() and not wide[:, 42:].any()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("group", [8, 16, 24, 48])
def test_host_dequantize_into_the_compute_dtype_rounds_like_torch(group: int, dtype: torch.dtype) -> None:
    # Straight into a bf16/fp16 view of a wider tensor (a chunk's rows of the prompt's layer), no float32 copy.
    x = _layer(2, tokens=37)
    for kind in ("k", "v"):
        q4 = quantize_int4(x, kind=kind, k_group_target=group, v_group=group)  # type: ignore[arg-type]
        wide = torch.zeros(3, 50, 16, dtype=dtype)
        host_dequantize_int4(wide[:, 5:42], q4.packed, q4.scale, q4.zero, kind, q4.group)  # type: ignore[arg-type]
        assert torch.equal(wide[:, 5:42], dequantize_int4(q4, kind, dtype))  # type: ignore[arg-type]
        assert not wide[:, :5].any() and not wide[:, 42:].any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("group", [8, 16, 24, 48])
def test_a_prompts_chunks_dequantized_together_equal_each_dequantized_alone(group: int, dtype: torch.dtype) -> None:
    # Chunks of different lengths get different K token groups (37 → 5 groups of 8, 1 token → 1 group of 1…),
    # all side by side in one view of a wider tensor, as the loader fills a prompt's layer.
    lengths = [37, 1, 130, 9]
    xs = [_layer(seed, tokens=n) for seed, n in enumerate(lengths)]
    for kind in ("k", "v"):
        parts = [quantize_int4(x, kind=kind, k_group_target=group, v_group=group) for x in xs]  # type: ignore[arg-type]
        assert kind == "v" or len({p.group for p in parts}) > 1
        wide = torch.zeros(3, sum(lengths) + 7, 16, dtype=dtype)
        dequantize_int4_spans(wide[:, 3:-4], parts, kind)  # type: ignore[arg-type]
        expected = torch.cat([dequantize_int4(p, kind, dtype) for p in parts], dim=1)  # type: ignore[arg-type]
        assert torch.equal(wide[:, 3:-4], expected)
        assert not wide[:, :3].any() and not wide[:, -4:].any()


def test_dequantizing_spans_refuses_parts_that_do_not_fit() -> None:
    parts = [quantize_int4(_layer(0, tokens=n), kind="v", v_group=g) for n, g in ((10, 8), (12, 16))]
    with pytest.raises(ValueError, match="tokens do not add up"):
        dequantize_int4_spans(torch.empty(3, 21, 16), parts, "v")
    with pytest.raises(ValueError, match="different channel groups"):
        dequantize_int4_spans(torch.empty(3, 22, 16), parts, "v")


def test_non_finite_and_odd_head_dim_are_refused() -> None:
    kv = make_kv(0, dtype=torch.float32)
    kv.v[0, 0, 0, 0] = float("inf")
    with pytest.raises(ValueError):
        encode_entry(kv, key=key_of(0), model_fingerprint=FINGERPRINT, storage_dtype="int4")
    big = make_kv(0, dtype=torch.float32)
    big.k[0, 0, 0, 0] = 1e6  # beyond fp16: the zero point cannot hold it
    with pytest.raises(ValueError, match="fp16"):
        encode_entry(big, key=key_of(0), model_fingerprint=FINGERPRINT, storage_dtype="int4")
    with pytest.raises(ValueError, match="even head_dim"):
        encode_entry(make_kv(0, head_dim=7), key=key_of(0), model_fingerprint=FINGERPRINT, storage_dtype="int4")


def test_entry_bytes_round_trip_and_bytes_per_token() -> None:
    kv = make_kv(3, num_tokens=40, dtype=torch.float32, head_dim=16)  # (4 layers, 2 heads, 40, 16)
    params = Int4Params(k_group=16, v_group=16)
    entry = encode_entry(kv, key=key_of(3), model_fingerprint=FINGERPRINT, storage_dtype="int4", int4=params)
    assert entry.meta.int4_k_group == 20 and entry.meta.int4_v_group == 16  # 40 tokens: 2 groups of 20
    assert entry.k.dtype == torch.uint8 and entry.k.shape == (4, 2, 40, 8)
    assert entry.k_scale is not None and entry.k_scale.shape == (4, 2, 2, 16)
    assert entry.v_scale is not None and entry.v_scale.shape == (4, 40, 2)
    # per token: 4 layers x 2 heads x 16 channels x 2 (K, V) / 2 codes a byte, plus fp16 scale + zero of
    # K (2 groups of each (head, channel) over 40 tokens) and V (2 groups per token)
    codes = 4 * 2 * 16 * 2 // 2
    params_bytes = 4 * (2 * 2 * 16 * 2 * 2) / 40 + 4 * 2 * 2 * 2
    assert entry.meta.bytes_per_token == codes + params_bytes == entry.nbytes / 40
    back = deserialize_entry(serialize_entry(entry), entry.key)
    assert back.meta == entry.meta
    assert all(
        torch.equal(a, b) for a, b in zip(back.named_tensors().values(), entry.named_tensors().values(), strict=True)
    )
    out = back.to_chunk_kv()
    assert out.k.dtype == torch.float32
    for layer in range(4):
        assert torch.equal(
            out.k[layer], dequantize_int4(quantize_int4(kv.k[layer], kind="k", k_group_target=16), "k", torch.float32)
        )
    assert float((out.v - kv.v).abs().max()) < 0.5


def test_store_serves_int4_and_other_formats_side_by_side(tmp_path: Path) -> None:
    old = TieredKVStore(settings(tmp_path, storage_dtype="fp16", memory_bytes=0))
    kv_old = make_kv(0)
    old.put(key_of(0), kv_old, model_fingerprint=FINGERPRINT)
    old.close()
    store = TieredKVStore(settings(tmp_path, storage_dtype="int4", memory_bytes=0))  # the setting changed
    kv_new = make_kv(1, dtype=torch.float32)
    store.put(key_of(1), kv_new, model_fingerprint=FINGERPRINT)
    expected_new = store.get(key_of(1))
    assert expected_new is not None
    with store.open_layers([key_of(0), key_of(1)], dtype=torch.float32) as source:
        for layer in range(source.num_layers):
            k, v = source.layer(layer)
            assert torch.equal(k[:, :16], kv_old.k[layer].float())  # the fp16 entry, unchanged
            assert torch.equal(v[:, 16:], expected_new.v[layer])
    assert store.get_entry(key_of(0)).meta.storage_dtype == "fp16"  # type: ignore[union-attr]
    assert store.get_entry(key_of(1)).meta.storage_dtype == "int4"  # type: ignore[union-attr]


def test_corrupt_int4_entry_is_detected_and_recomputed(tmp_path: Path) -> None:
    store = TieredKVStore(settings(tmp_path, storage_dtype="int4", memory_bytes=0))
    kv = make_kv(2, dtype=torch.float32)
    store.put(key_of(2), kv, model_fingerprint=FINGERPRINT)
    assert store.disk is not None
    path = store.disk.path_for(key_of(2))
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x10  # one nibble of the last tensor's data
    path.write_bytes(bytes(data))
    with pytest.raises(KVEntryCorrupt) as info, store.open_layers([key_of(2)]) as source:
        for layer in range(source.num_layers):
            source.layer(layer)
    assert info.value.kind == "checksum"
    assert store.contains(key_of(2)) is None and not path.exists()  # dropped: the caller recomputes it
    store.put(key_of(2), kv, model_fingerprint=FINGERPRINT)  # ... and stores it again
    again = store.get(key_of(2))
    assert again is not None and float((again.k - kv.k).abs().max()) < 0.5
    assert store.stats().tier("disk").faults_by_kind == {"checksum": 1}  # type: ignore[union-attr]


def test_int4_on_a_device_path_matches_the_host_path() -> None:
    kv = make_kv(4, num_tokens=21, dtype=torch.float32)
    store = TieredKVStore(settings(None, storage_dtype="int4", memory_bytes=1 << 20, prefetch=False))
    keys = [key_of(4), key_of(5)]
    for key in keys:
        store.put(key, kv, model_fingerprint=FINGERPRINT)
    with store.open_layers(keys, dtype=torch.float32, convert_on_device=False) as host:
        host_layers = [host.layer(i) for i in range(host.num_layers)]
    with store.open_layers(keys, dtype=torch.float32, convert_on_device=True) as dev:
        dev_layers = [dev.layer(i) for i in range(dev.num_layers)]
    for (hk, hv), (dk, dv) in zip(host_layers, dev_layers, strict=True):
        assert torch.equal(hk, dk) and torch.equal(hv, dv)


def test_chunk_kv_of_int4_in_bf16() -> None:
    kv = make_kv(6, dtype=torch.float32)
    entry = encode_entry(kv, key=key_of(6), model_fingerprint=FINGERPRINT, storage_dtype="int4")
    f32, bf16 = entry.to_chunk_kv(torch.float32), entry.to_chunk_kv(torch.bfloat16)
    assert isinstance(bf16, ChunkKV) and bf16.k.dtype == torch.bfloat16
    assert torch.equal(bf16.k, f32.k.to(torch.bfloat16)) and torch.equal(bf16.v, f32.v.to(torch.bfloat16))
