from __future__ import annotations

from pathlib import Path

import pytest

from app.settings import SettingsError, load_settings


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # No settings.yaml or BLENDRAG_* from the developer's shell may leak into these tests.
    monkeypatch.chdir(tmp_path)
    import os

    for name in list(os.environ):
        if name.startswith("BLENDRAG_"):
            monkeypatch.delenv(name)


def test_defaults_put_everything_under_data_dir() -> None:
    s = load_settings()
    assert s.data_dir == Path("data")
    assert s.kvcache.dir == Path("data") / "kv"
    assert s.catalog.url == "sqlite:///data/catalog.db"
    assert s.engine.mode == "blend"
    assert s.engine.blend.recompute_ratio == 0.15
    assert s.engine.model == "qwen2.5-coder-0.5b"


def test_yaml_file_then_env_then_arguments(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "settings.yaml").write_text(
        "data_dir: /srv/blend\nengine:\n  recompute_ratio: 0.3\n  mode: full\nretrieval:\n  top_k: 4\n"
    )
    s = load_settings()
    assert (s.data_dir, s.engine.blend.recompute_ratio, s.engine.mode, s.retrieval.top_k) == (
        Path("/srv/blend"),
        0.3,
        "full",
        4,
    )
    assert s.kvcache.dir == Path("/srv/blend/kv")

    monkeypatch.setenv("BLENDRAG_ENGINE__BLEND__RECOMPUTE_RATIO", "0.05")
    s = load_settings()
    assert s.engine.blend.recompute_ratio == 0.05
    assert s.engine.mode == "full"  # untouched keys of the same section still come from the file

    s = load_settings(data_dir=tmp_path / "cli")
    assert s.data_dir == tmp_path / "cli"


def test_ratio_outside_unit_interval_is_rejected_with_the_field_name(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("BLENDRAG_ENGINE__BLEND__RECOMPUTE_RATIO", "BLENDRAG_ENGINE__RECOMPUTE_RATIO"):  # new key, old key
        monkeypatch.setenv(name, "1.5")
        with pytest.raises(SettingsError) as err:
            load_settings()
        assert "engine.blend.recompute_ratio: Input should be less than or equal to 1 (got '1.5')" in str(err.value)
        monkeypatch.delenv(name)


def test_old_flat_blend_keys_keep_reading_and_precedence_holds_across_sources(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A settings file of an earlier release: the blend's keys flat under engine.
    (tmp_path / "settings.yaml").write_text("engine:\n  recompute_ratio: 0.3\n  selector: first_k\n")
    s = load_settings()
    assert (s.engine.blend.recompute_ratio, s.engine.blend.selector) == (0.3, "first_k")
    assert s.engine.blend.model_fields_set == {"recompute_ratio", "selector"}  # the operator's, for app/calibration
    # The environment wins over the file whichever spelling each uses.
    monkeypatch.setenv("BLENDRAG_ENGINE__BLEND__RECOMPUTE_RATIO", "0.2")
    monkeypatch.setenv("BLENDRAG_ENGINE__SELECTOR", "random")
    s = load_settings()
    assert (s.engine.blend.recompute_ratio, s.engine.blend.selector) == (0.2, "random")
    # One source spelling a key both ways is refused by name.
    monkeypatch.setenv("BLENDRAG_ENGINE__RECOMPUTE_RATIO", "0.25")
    with pytest.raises(SettingsError, match="engine.recompute_ratio and engine.blend.recompute_ratio are both set"):
        load_settings()


def test_unknown_mode_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BLENDRAG_ENGINE__MODE", "turbo")
    with pytest.raises(SettingsError) as err:
        load_settings()
    assert "engine.mode" in str(err.value)
    assert "'turbo'" in str(err.value)


def test_unreadable_model_path_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(SettingsError) as err:
        load_settings(engine={"model": str(tmp_path / "nope")})
    assert "engine.model" in str(err.value)
    assert "neither a catalogue model" in str(err.value)
    (tmp_path / "empty").mkdir()
    with pytest.raises(SettingsError, match="no config.json"):
        load_settings(engine={"model": str(tmp_path / "empty")})


def test_unknown_key_and_bad_yaml_are_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "settings.yaml").write_text("enigne:\n  mode: full\n")
    with pytest.raises(SettingsError, match="enigne"):
        load_settings()
    (tmp_path / "settings.yaml").write_text("engine: [unclosed\n")
    with pytest.raises(SettingsError, match="cannot read settings"):
        load_settings()
    monkeypatch.setenv("BLENDRAG_SETTINGS_FILE", str(tmp_path / "missing.yaml"))
    with pytest.raises(SettingsError, match="no such settings file"):
        load_settings()


def test_storage_dtype_must_be_known(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BLENDRAG_KVCACHE__STORAGE_DTYPE", "fp8")
    with pytest.raises(SettingsError, match="kvcache.storage_dtype"):
        load_settings()


def test_yaml_that_is_not_a_mapping_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "settings.yaml").write_text("- engine\n- kvcache\n")
    monkeypatch.setenv("BLENDRAG_SETTINGS_FILE", str(tmp_path / "settings.yaml"))
    with pytest.raises(SettingsError, match="settings must be a mapping at the top level"):
        load_settings()
