"""`Engine.use_blend_settings`: the blend settings in force are validated before the engine serves with them."""

from __future__ import annotations

import pytest
from pydantic import ValidationError


@pytest.mark.parametrize(
    "bad",
    [
        {"match_window": 999},  # over its bound (256); BlendConfig does not check it
        {"recompute_ratio": 1.5},
        {"selector": "nobody"},
    ],
)
def test_an_unvalidated_copy_is_refused_and_nothing_changes(tiny_engine, bad: dict[str, object]) -> None:
    before, origin = tiny_engine.settings, tiny_engine.blend_origin
    # model_copy(update=...) validates nothing, so the copy holds a value no settings file could.
    with pytest.raises(ValidationError):
        tiny_engine.use_blend_settings(before.model_copy(update=bad), "bad")
    assert tiny_engine.settings is before and tiny_engine.blend_origin == origin


def test_only_the_blend_fields_change(tiny_engine) -> None:
    before, origin = tiny_engine.settings, tiny_engine.blend_origin
    chosen = before.model_copy(update={"recompute_ratio": 0.4, "match_window": 8, "max_new_tokens": 7})
    try:
        tiny_engine.use_blend_settings(chosen, "chosen")
        now = tiny_engine.settings
        assert (now.recompute_ratio, now.match_window, tiny_engine.blend_origin) == (0.4, 8, "chosen")
        assert now.max_new_tokens == before.max_new_tokens and now.model == before.model
        # The default blend of a request is the settings in force; a request's own ratio still wins.
        assert now.blend_config().recompute_ratio == 0.4
        assert now.blend_config(recompute_ratio=0.9).recompute_ratio == 0.9
    finally:
        tiny_engine.use_blend_settings(before, origin)
    assert tiny_engine.settings.recompute_ratio == before.recompute_ratio
