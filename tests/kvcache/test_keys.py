import hashlib
import struct

import pytest
import torch

from kvcache.keys import check_key, chunk_key, is_valid_key


def _expected(fingerprint: str, prefix: list[int], chunk: list[int], dtype: str) -> str:
    """The key spelled out byte by byte: changing this breaks every stored entry, so it is pinned."""

    def framed(b: bytes) -> bytes:
        return struct.pack("<Q", len(b)) + b

    def ids(xs: list[int]) -> bytes:
        return struct.pack("<Q", len(xs)) + b"".join(struct.pack("<q", x) for x in xs)

    data = (
        framed(b"blendrag-kv-key/v1") + framed(fingerprint.encode()) + ids(prefix) + ids(chunk) + framed(dtype.encode())
    )
    return hashlib.sha256(data).hexdigest()


def test_key_is_sha256_of_framed_inputs() -> None:
    key = chunk_key("smollm2@abc", [1, 2, 3], [10, 20])
    # the format slot always holds "fp16": keys of entries written when it held the storage dtype
    assert key == _expected("smollm2@abc", [1, 2, 3], [10, 20], "fp16")
    assert len(key) == 64 and is_valid_key(key)


def test_same_inputs_same_key_whatever_the_container() -> None:
    a = chunk_key("m", [1, 2], [3, 4, 5])
    assert a == chunk_key("m", (1, 2), (3, 4, 5))
    assert a == chunk_key("m", torch.tensor([1, 2]), torch.tensor([3, 4, 5]))
    assert a == chunk_key("m", iter([1, 2]), range(3, 6))


@pytest.mark.parametrize("change", ["fingerprint", "prefix", "chunk"])
def test_any_change_makes_a_new_key(change: str) -> None:
    args = {"model_fingerprint": "m1", "prefix_token_ids": [1, 2], "chunk_token_ids": [3, 4]}
    base = chunk_key(**args)  # type: ignore[arg-type]
    changed = dict(args)
    changed.update(
        {
            "fingerprint": {"model_fingerprint": "m2"},
            "prefix": {"prefix_token_ids": [1, 2, 0]},
            "chunk": {"chunk_token_ids": [3, 5]},
        }[change]
    )
    assert chunk_key(**changed) != base  # type: ignore[arg-type]


def test_boundary_between_prefix_and_chunk_matters() -> None:
    assert chunk_key("m", [1, 2], [3]) != chunk_key("m", [1], [2, 3])
    assert chunk_key("m", [], [1, 2]) != chunk_key("m", [1], [2])


def test_empty_prefix_is_allowed() -> None:
    assert chunk_key("m", [], [5]) == _expected("m", [], [5], "fp16")


@pytest.mark.parametrize(
    "bad",
    [
        {"chunk_token_ids": []},
        {"chunk_token_ids": [1, -2]},
        {"prefix_token_ids": [1.5]},
        {"chunk_token_ids": [2**63]},
        {"model_fingerprint": ""},
    ],
)
def test_bad_inputs_raise(bad: dict[str, object]) -> None:
    args: dict[str, object] = {
        "model_fingerprint": "m",
        "prefix_token_ids": [1],
        "chunk_token_ids": [2],
    }
    args.update(bad)
    with pytest.raises(ValueError):
        chunk_key(**args)  # type: ignore[arg-type]


def test_key_validation() -> None:
    good = "0" * 64
    assert check_key(good) == good
    for bad in ["", "0" * 63, "0" * 65, "A" * 64, "../" + "0" * 61, None, 123]:
        assert not is_valid_key(bad)
        with pytest.raises(ValueError):
            check_key(bad)
