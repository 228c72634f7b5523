"""One model cache per machine: where the settings put it, and two data dirs sharing one conversion while a
data dir from before the cache keeps loading its own copy."""

from __future__ import annotations

from pathlib import Path

import pytest
from fake_catalog import fake_converter, install_fake_entry

from app.settings import load_settings
from engine.models.resolve import resolve_model


def test_the_cache_is_the_users_cache_home_unless_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BLENDRAG_MODELS_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert load_settings(data_dir=tmp_path / "a").models_dir == tmp_path / "home" / ".cache" / "blendrag" / "models"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")  # the XDG specification says to ignore it
    assert load_settings(data_dir=tmp_path / "a").models_dir == tmp_path / "home" / ".cache" / "blendrag" / "models"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    settings = load_settings(data_dir=tmp_path / "a")
    assert settings.models_dir == tmp_path / "xdg" / "blendrag" / "models"
    assert settings.models_dirs_read == (tmp_path / "a" / "models",)
    monkeypatch.setenv("BLENDRAG_MODELS_DIR", str(tmp_path / "env"))
    assert load_settings(data_dir=tmp_path / "a").models_dir == tmp_path / "env"
    assert load_settings(data_dir=tmp_path / "a", models_dir=tmp_path / "arg").models_dir == tmp_path / "arg"


def test_two_data_dirs_share_one_conversion_and_hold_no_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    entry = install_fake_entry(tmp_path, monkeypatch)
    converter = fake_converter(monkeypatch)
    monkeypatch.setenv("BLENDRAG_MODELS_DIR", str(tmp_path / "cache"))
    paths = []
    for name in ("team-a", "team-b"):
        settings = load_settings(data_dir=tmp_path / name, engine={"model": entry.name})
        # what app/build.py hands the engine
        paths.append(resolve_model(entry.name, settings.models_dir, settings.models_dirs_read).path)
    assert paths == [tmp_path / "cache" / entry.converted_dir] * 2
    assert converter.calls == [tmp_path / "cache" / entry.converted_dir]  # the second converted nothing
    assert not (tmp_path / "team-a").exists() and not (tmp_path / "team-b").exists()
    # the joined GGUF is gone once converted; the cache holds the conversion and its lock file
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [".locks", entry.converted_dir]


def test_a_data_dir_made_before_the_cache_loads_its_own_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    entry = install_fake_entry(tmp_path, monkeypatch)
    converter = fake_converter(monkeypatch)
    old = load_settings(data_dir=tmp_path / "old", models_dir=tmp_path / "old" / "models")  # how it was made
    made = resolve_model(entry.name, old.models_dir).path
    assert made == tmp_path / "old" / "models" / entry.converted_dir
    settings = load_settings(data_dir=tmp_path / "old", models_dir=tmp_path / "cache")
    assert resolve_model(entry.name, settings.models_dir, settings.models_dirs_read).path == made
    assert len(converter.calls) == 1 and not (tmp_path / "cache").exists()
