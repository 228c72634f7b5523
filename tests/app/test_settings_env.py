"""The environment source (app/settings_env.py): every setting that takes null takes `null`, `none` or `off`
from its BLENDRAG_* variable, at any depth; the others keep the word and refuse it as before."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from app.settings import Settings, SettingsError, load_settings
from app.settings_env import field_at, takes_null
from app.settings_reference import setting_rows

# Filled in by Settings._fill_paths when left unset: null there means "the default place".
FILLED_WHEN_NULL = {
    "models_dir": lambda s: s.models_dir is not None,
    "catalog.url": lambda s: s.catalog.url == "sqlite:///data/catalog.db",
    "kvcache.dir": lambda s: s.kvcache.dir == Path("data") / "kv",
}


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # No settings.yaml or BLENDRAG_* of the suite or the developer's shell may leak into these tests.
    monkeypatch.chdir(tmp_path)
    for name in list(os.environ):
        if name.startswith("BLENDRAG_"):
            monkeypatch.delenv(name)


def nullable_settings() -> list[tuple[str, str]]:
    """(dotted name, environment variable) of every leaf setting whose type includes None."""
    rows = setting_rows(Settings)
    return [(r.name, r.env) for r in rows if takes_null(field_at(Settings, r.name.split(".")).annotation)]  # type: ignore[union-attr]


def value_at(settings: Settings, dotted: str) -> Any:
    value: Any = settings
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def test_the_documented_nullable_settings_are_found() -> None:
    names = [name for name, _ in nullable_settings()]
    for documented in (
        "server.ask_rate_per_minute",
        "server.anonymous_max_tokens",
        "server.memory_trim_idle_s",
        "engine.blend.ratio_schedule",
        "kvcache.disk_bytes",
        "retrieval.relevance_floor",
    ):
        assert documented in names
    assert "server.port" not in names and "retrieval.followup" not in names


@pytest.mark.parametrize("word", ["null", "None", "OFF", " off "])
def test_every_nullable_setting_takes_null_from_the_environment(word: str, monkeypatch: pytest.MonkeyPatch) -> None:
    nullable = nullable_settings()
    for _, env in nullable:
        monkeypatch.setenv(env, word)
    settings = load_settings()  # all of them at once: none refuses the word
    for name, _ in nullable:
        if name in FILLED_WHEN_NULL:
            assert FILLED_WHEN_NULL[name](settings), name
        else:
            assert value_at(settings, name) is None, name


def test_null_from_the_environment_overrides_settings_yaml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "settings.yaml").write_text("server:\n  ask_rate_per_minute: 30\n  ask_burst: 5\n")
    assert load_settings().server.ask_rate_per_minute == 30.0
    monkeypatch.setenv("BLENDRAG_SERVER__ASK_RATE_PER_MINUTE", "null")
    settings = load_settings()
    assert (settings.server.ask_rate_per_minute, settings.server.ask_burst) == (None, 5)


def test_a_flat_blend_key_takes_null_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BLENDRAG_ENGINE__BLEND__RATIO_SCHEDULE", "[0.5]")
    assert load_settings().engine.blend.ratio_schedule == (0.5,)
    monkeypatch.delenv("BLENDRAG_ENGINE__BLEND__RATIO_SCHEDULE")
    monkeypatch.setenv("BLENDRAG_ENGINE__RATIO_SCHEDULE", "off")  # the flat key of earlier releases
    assert load_settings().engine.blend.ratio_schedule is None


def test_a_word_that_is_a_settings_own_value_stays_that_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BLENDRAG_ENGINE__DECODE_GRAPHS", "off")
    monkeypatch.setenv("BLENDRAG_RETRIEVAL__FOLLOWUP", "off")
    monkeypatch.setenv("BLENDRAG_INGEST__JSON_TEXT_FIELD", "none")
    settings = load_settings()
    assert (settings.engine.decode_graphs, settings.retrieval.followup, settings.ingest.json_text_field) == (
        "off",
        "off",
        "none",
    )


def test_a_setting_without_null_refuses_the_word(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BLENDRAG_SERVER__PORT", "null")
    with pytest.raises(SettingsError) as refused:
        load_settings()
    assert str(refused.value) == (
        "invalid settings:\n"
        "  server.port: Input should be a valid integer, unable to parse string as an integer (got 'null')"
    )


def test_a_bad_value_of_a_nullable_setting_says_how_to_write_null(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BLENDRAG_SERVER__ASK_RATE_PER_MINUTE", "unlimited")
    with pytest.raises(SettingsError) as refused:
        load_settings()
    assert str(refused.value) == (
        "invalid settings:\n"
        "  server.ask_rate_per_minute: Input should be a valid number, unable to parse string as a number "
        "(got 'unlimited'); null (in the environment null, none or off) for no value"
    )
