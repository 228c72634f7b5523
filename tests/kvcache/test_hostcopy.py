import itertools

import pytest
import torch

from kvcache.hostcopy import all_finite, host_copy, host_dequantize
from kvcache.quant import dequantize_int8, quantize_int8

DTYPES = [torch.float16, torch.bfloat16, torch.float32]


@pytest.mark.parametrize(("src_dtype", "dst_dtype"), list(itertools.product(DTYPES, DTYPES)))
def test_host_copy_matches_torch_conversion(src_dtype: torch.dtype, dst_dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    src = (torch.randn(3, 40, 8, generator=g) * 100).to(src_dtype)
    src[0, 0, :4] = torch.tensor([0.0, -0.0, 1e-7, -65504.0]).to(src_dtype)  # zeros, subnormals, extremes
    dst = torch.zeros(3, 100, 8, dtype=dst_dtype)
    host_copy(dst[:, 30:70], src)  # a strided destination, as in the loader
    assert torch.equal(dst[:, 30:70], src.to(dst_dtype))
    assert torch.equal(dst[:, :30], torch.zeros(3, 30, 8, dtype=dst_dtype))
    assert torch.equal(dst[:, 70:], torch.zeros(3, 30, 8, dtype=dst_dtype))
    # bit-level for the signed zero
    assert torch.equal(torch.signbit(dst[0, 30, :2]), torch.tensor([False, True]))


def test_float32_to_bfloat16_rounds_as_torch_does_on_every_edge() -> None:
    """The loader's float32 -> bf16 step (int4 entries served to a bf16 engine) runs in numpy, not torch."""
    g = torch.Generator().manual_seed(3)
    edges = [0.0, -0.0, 1e-40, -1e-40, 3.4e38, -3.4e38, float("inf"), float("-inf"), float("nan")]
    ties = [1.0 + 2**-8, 1.0 + 3 * 2**-8, 1.0 + 2**-8 + 2**-20]  # halfway to even, halfway to odd, just above
    src = torch.cat([torch.randn(4096, generator=g) * 50, torch.tensor(edges + ties)])
    dst = torch.zeros(2, src.numel(), dtype=torch.bfloat16)
    host_copy(dst[1], src)
    ref = src.to(torch.bfloat16)
    nan = torch.isnan(ref.float())
    assert torch.equal(dst[1][~nan].view(torch.int16), ref[~nan].view(torch.int16))  # bit for bit
    assert torch.isnan(dst[1][nan].float()).all() and not dst[0].any()


@pytest.mark.parametrize("dst_dtype", DTYPES)
def test_host_dequantize_matches_torch(dst_dtype: torch.dtype) -> None:
    x = torch.randn(2, 24, 8, generator=torch.Generator().manual_seed(1))
    qz = quantize_int8(x)
    dst = torch.empty(2, 50, 8, dtype=dst_dtype)
    host_dequantize(dst[:, 10:34], qz.q, qz.scale)
    assert torch.equal(dst[:, 10:34], dequantize_int8(qz.q, qz.scale, dst_dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bad", [None, float("inf"), float("-inf"), float("nan")])
def test_all_finite(dtype: torch.dtype, bad: float | None) -> None:
    x = torch.randn(2, 3, 8, generator=torch.Generator().manual_seed(2)).to(dtype)
    x[1, 2, 7] = 65504 if dtype == torch.float16 else 1e30  # large but finite
    if bad is not None:
        x[0, 1, 3] = bad
    assert all_finite(x) == (bad is None) == bool(torch.isfinite(x).all())
    assert all_finite(x[:, 1:]) == bool(torch.isfinite(x[:, 1:]).all())  # non-contiguous views
