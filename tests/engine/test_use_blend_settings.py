"""`Engine.use_blend`: the engine serves with a validated BlendConfig from then on; nothing else changes."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from engine.types import BlendConfig


@pytest.mark.parametrize("bad", [{"match_window": 999}, {"recompute_ratio": 1.5}, {"selector": "nobody"}])
def test_a_bad_value_never_reaches_the_engine(tiny_engine, bad: dict[str, object]) -> None:
    before = tiny_engine.settings
    # A BlendConfig cannot hold a value no settings file could: replace() validates the copy as a whole.
    with pytest.raises(ValidationError):
        before.blend.replace(**bad)
    assert tiny_engine.settings is before


def test_only_the_blend_changes(tiny_engine) -> None:
    before, origin = tiny_engine.settings, tiny_engine.blend_origin
    chosen = before.blend.replace(recompute_ratio=0.4, match_window=8)
    try:
        tiny_engine.use_blend(chosen, "chosen")
        now = tiny_engine.settings
        assert (now.blend.recompute_ratio, now.blend.match_window, tiny_engine.blend_origin) == (0.4, 8, "chosen")
        assert now.max_new_tokens == before.max_new_tokens and now.model == before.model
        # The default blend of a request is the one in force; a request's own ratio still wins.
        assert now.blend_config() == chosen and isinstance(chosen, BlendConfig)
        assert now.blend_config(recompute_ratio=0.9).recompute_ratio == 0.9
    finally:
        tiny_engine.use_blend(before.blend, origin)
    assert tiny_engine.settings.blend == before.blend
