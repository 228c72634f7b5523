"""A data dir keeps the compute dtype it was built with: `auto` resolves once (from the CPU's capabilities)
and later starts keep it, whatever the capability check says then; only an explicit engine.dtype (or another
device kind) changes it. The capability check is played both ways, never this machine's CPU."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from app.build import build_services
from app.compute_dtype import RECORD_FILE, data_dir_dtype
from engine import dtype_choice
from engine.dtype_choice import CpuBf16Support, DtypeChoice

AMX = CpuBf16Support(amx_tile=True, avx512_bf16=True, onednn_bf16=True, capability="AVX512")
AVX2 = CpuBf16Support(amx_tile=False, avx512_bf16=False, onednn_bf16=False, capability="AVX2")
KEPT_BF16 = "kept from the data dir (compute_dtype.json: built in bfloat16 on cpu; set engine.dtype to change it)"
KEPT_FP32 = "kept from the data dir (compute_dtype.json: built in float32 on cpu; set engine.dtype to change it)"


def play_cpu(monkeypatch: pytest.MonkeyPatch, support: CpuBf16Support) -> None:
    monkeypatch.setattr(dtype_choice, "detect_cpu_bf16", lambda: support)


def recorded(data_dir: Path) -> dict[str, str]:
    return json.loads((data_dir / RECORD_FILE).read_text())


@pytest.mark.parametrize(
    ("first", "later", "dtype", "kept"), [(AMX, AVX2, "bfloat16", KEPT_BF16), (AVX2, AMX, "float32", KEPT_FP32)]
)
def test_auto_is_decided_once_per_data_dir_and_kept(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    first: CpuBf16Support,
    later: CpuBf16Support,
    dtype: str,
    kept: str,
) -> None:
    play_cpu(monkeypatch, first)
    assert data_dir_dtype(tmp_path, "auto", "cpu").dtype == dtype
    assert recorded(tmp_path) == {"dtype": dtype, "device": "cpu"}
    play_cpu(monkeypatch, later)  # whatever the check says at a later start, the store's dtype stays
    assert data_dir_dtype(tmp_path, "auto", "cpu") == DtypeChoice(dtype, kept, "auto")
    assert recorded(tmp_path) == {"dtype": dtype, "device": "cpu"}


def test_an_explicit_dtype_changes_the_record_with_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    play_cpu(monkeypatch, AMX)
    assert data_dir_dtype(tmp_path, "auto", "cpu").dtype == "bfloat16"
    with caplog.at_level(logging.WARNING, logger="app.compute_dtype"):
        assert data_dir_dtype(tmp_path, "float32", "cpu") == DtypeChoice("float32", "set by engine.dtype", "float32")
    assert [r.getMessage() for r in caplog.records] == [
        "the data dir was built computing in bfloat16 on cpu; now float32 (set by engine.dtype): KV entries stored "
        "in the old dtype no longer match (a chunk without fresh KV is recomputed)"
    ]
    assert recorded(tmp_path) == {"dtype": "float32", "device": "cpu"}
    assert data_dir_dtype(tmp_path, "auto", "cpu") == DtypeChoice("float32", KEPT_FP32, "auto")


def test_another_device_kind_or_an_unreadable_record_chooses_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    play_cpu(monkeypatch, AVX2)
    assert data_dir_dtype(tmp_path, "auto", "cpu").dtype == "float32"
    assert data_dir_dtype(tmp_path, "auto", "cuda:0") == DtypeChoice("bfloat16", "CUDA device", "auto")
    assert recorded(tmp_path) == {"dtype": "bfloat16", "device": "cuda"}
    (tmp_path / RECORD_FILE).write_text("{not json")
    assert data_dir_dtype(tmp_path, "auto", "cpu").dtype == "float32"
    assert recorded(tmp_path) == {"dtype": "float32", "device": "cpu"}


def test_a_restart_whose_capability_check_differs_keeps_every_kv_key(
    tmp_path: Path, tiny_llama_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two starts of a whole component stack on one data dir: the engine fingerprint (part of every KV key)
    is the same, so no stored entry goes stale by chance."""
    from app.settings import load_settings

    settings = load_settings(
        data_dir=tmp_path / "data",
        engine={"model": str(tiny_llama_dir), "dtype": "auto", "num_threads": 2},
        retrieval={"embed_dtype": "float32"},
    )
    fingerprints = []
    for support in (AVX2, AMX):
        play_cpu(monkeypatch, support)
        services = build_services(settings, {"doctor", "ingest"})
        try:
            assert services.engine.dtype_choice.dtype == "float32"
            fingerprints.append(services.engine.fingerprint)
        finally:
            services.close()
    assert fingerprints[0] == fingerprints[1]


def test_the_calibration_loads_the_engine_as_the_server_on_its_data_dir_does(
    tmp_path: Path, tiny_llama_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`blendrag calibrate` measures the model in the data dir's dtype: one engine loader for both."""
    from app.calibration import search
    from app.engine_loader import load_engine
    from app.settings import load_settings

    settings = load_settings(data_dir=tmp_path / "data", engine={"model": str(tiny_llama_dir), "dtype": "auto"})
    settings.data_dir.mkdir()
    play_cpu(monkeypatch, AVX2)
    assert data_dir_dtype(settings.data_dir, "auto", "cpu").dtype == "float32"  # the data dir was built so
    play_cpu(monkeypatch, AMX)  # a later start's check would pick bfloat16
    engine = load_engine(settings)
    assert engine.dtype_choice == DtypeChoice("float32", KEPT_FP32, "auto")
    loaded: list[object] = []

    def stop_after_loading(engine: object, *args: object, **kwargs: object) -> object:
        loaded.append(engine)
        raise RuntimeError("loaded")

    monkeypatch.setattr(search, "calibrate", stop_after_loading)
    with pytest.raises(RuntimeError, match="loaded"):
        search.run_calibration(settings, save=False)
    assert [e.dtype_choice for e in loaded] == [DtypeChoice("float32", KEPT_FP32, "auto")]  # type: ignore[attr-defined]
