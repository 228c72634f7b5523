"""engine.dtype: auto → bfloat16 only where the CPU has native bf16 matrix units; the choice is logged and kept."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from enginetest_tiny import random_chunks

from engine import dtype_choice
from engine.dtype_choice import CpuBf16Support, DtypeChoice, choose_compute_dtype
from engine.types import BlendConfig
from kvcache.types import InMemoryLayerReader

AMX = CpuBf16Support(amx_tile=True, avx512_bf16=True, onednn_bf16=True, capability="AVX512")
AVX2 = CpuBf16Support(amx_tile=False, avx512_bf16=False, onednn_bf16=False, capability="AVX2")


def _no_timing(repeats: int = 3) -> float:
    raise AssertionError("the dtype is decided from the CPU's capabilities, never from a timing")


def test_auto_on_a_cpu_with_bf16_units_is_bfloat16() -> None:
    choice = choose_compute_dtype("auto", "cpu", detect=lambda: AMX)
    assert choice == DtypeChoice("bfloat16", "CPU: AMX tiles and AVX512-BF16 (torch dispatches AVX512)", "auto")


def test_auto_on_avx2_is_float32() -> None:
    choice = choose_compute_dtype("auto", "cpu", detect=lambda: AVX2)
    assert choice == DtypeChoice("float32", "CPU: no bf16 matrix units (torch dispatches AVX2)", "auto")


def test_the_choice_is_the_same_at_every_start_whatever_the_machine_load(monkeypatch: pytest.MonkeyPatch) -> None:
    # The old GEMM probe measured 1.4x .. 5.5x across starts of one loaded machine and flipped the dtype.
    monkeypatch.setattr(dtype_choice, "probe_bf16_speedup", _no_timing)
    assert {choose_compute_dtype("auto", "cpu", detect=lambda: AMX).dtype for _ in range(5)} == {"bfloat16"}
    assert {choose_compute_dtype("auto", "cpu", detect=lambda: AVX2).dtype for _ in range(5)} == {"float32"}


def test_units_without_onednn_keep_float32() -> None:
    support = CpuBf16Support(amx_tile=False, avx512_bf16=True, onednn_bf16=False, capability="AVX512")
    choice = choose_compute_dtype("auto", "cpu", detect=lambda: support)
    assert choice == DtypeChoice("float32", "CPU: AVX512-BF16 reported but oneDNN's bf16 path is unavailable", "auto")


def _never_detect() -> CpuBf16Support:
    raise AssertionError("no CPU detection for an explicit dtype or a CUDA device")


def test_cuda_and_explicit_settings() -> None:
    assert choose_compute_dtype("auto", "cuda:0", detect=_never_detect) == DtypeChoice(
        "bfloat16", "CUDA device", "auto"
    )
    explicit = choose_compute_dtype("float32", "cpu", detect=_never_detect)
    assert explicit == DtypeChoice("float32", "set by engine.dtype", "float32")


def test_detection_reads_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    support = dtype_choice.detect_cpu_bf16()
    assert (support.amx_tile, support.avx512_bf16, support.capability) == (True, False, "AVX512")
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    assert dtype_choice.detect_cpu_bf16().amx_tile is False


def test_probe_measures_a_ratio() -> None:
    assert dtype_choice.probe_bf16_speedup(repeats=1) > 0


@pytest.mark.parametrize(("support", "expected"), [(AMX, "bfloat16"), (AVX2, "float32")], ids=["amx", "avx2"])
def test_engine_logs_and_keeps_its_choice(
    support: CpuBf16Support,
    expected: str,
    tiny_model_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from engine.config import EngineSettings
    from engine.engine import Engine

    monkeypatch.setattr(dtype_choice, "detect_cpu_bf16", lambda: support)
    monkeypatch.setattr(dtype_choice, "probe_bf16_speedup", _no_timing)
    with caplog.at_level(logging.INFO, logger="engine.dtype_choice"):
        engine = Engine(EngineSettings(model=str(tiny_model_dir), device="cpu", dtype="auto"), models_dir=tmp_path)
    assert engine.dtype_choice.dtype == expected and engine.dtype == getattr(torch, expected)
    assert [r.getMessage() for r in caplog.records] == [
        f"engine computes in {expected} (auto: {engine.dtype_choice.reason})"
    ]


@pytest.fixture(scope="module")
def bf16_engine(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    from engine.config import EngineSettings
    from engine.engine import Engine

    return Engine(
        EngineSettings(model=str(tiny_model_dir), device="cpu", dtype="bfloat16"), tmp_path_factory.mktemp("m")
    )


@pytest.mark.parametrize("selector", ["query", "deviation"])
def test_bf16_blend_at_ratio_one_matches_bf16_full_prefill(bf16_engine, selector: str) -> None:
    chunks = random_chunks([23, 40, 17, 31], seed=11)
    layout = bf16_engine.prompt.layout(chunks, "who jumps over the lazy dog?")
    kvs = bf16_engine.precompute_chunks(chunks)
    assert kvs[0].k.dtype == torch.bfloat16
    full = bf16_engine.prompt_pass(layout, None, "full")
    blend = bf16_engine.prompt_pass(
        layout, InMemoryLayerReader(kvs), "blend", BlendConfig(recompute_ratio=1.0, selector=selector)
    )
    assert full.logits.dtype == torch.float32  # logits stay float32 whatever the compute dtype
    # Same rows, same kernels, but the stored K is rotated at question time instead of in the prefill:
    # one bf16 rounding apart at most (bf16 has 8 significant bits).
    torch.testing.assert_close(blend.logits, full.logits, atol=0.05, rtol=0.02)
    probs_full, probs_blend = full.logits.softmax(-1), blend.logits.softmax(-1)
    kl = float((probs_full * (probs_full.log() - probs_blend.log())).sum())
    assert kl < 1e-3
    assert int(blend.logits.argmax()) == int(full.logits.argmax())
