"""EngineSettings / BlendConfig / SamplingParams reject bad values with clear messages."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from engine.config import EngineSettings
from engine.types import BlendConfig, PromptLayout, SamplingParams


def test_defaults() -> None:
    s = EngineSettings()
    assert s.model == "qwen2.5-coder-0.5b" and s.mode == "blend" and s.blend.recompute_ratio == 0.15
    assert s.blend.check_layers == (1,)
    cfg = s.blend_config()
    assert cfg.ratios() == (0.15,) and cfg.selector == "query" and cfg.score_layers == (12,) and cfg.deviation_on == "v"
    assert s.sampling_params(max_tokens=5).max_tokens == 5
    assert s.sampling_params().max_tokens == s.max_new_tokens


@pytest.mark.parametrize("ratio", [-0.1, 1.5])
def test_ratio_out_of_range(ratio: float) -> None:
    with pytest.raises(ValidationError, match=r"blend.recompute_ratio\n  Input should be (greater|less) than or equal"):
        EngineSettings(blend={"recompute_ratio": ratio})


def test_unknown_mode_and_selector() -> None:
    with pytest.raises(ValidationError, match="mode"):
        EngineSettings(mode="fast")
    with pytest.raises(ValidationError, match="selector"):
        EngineSettings(selector="magic")


def test_model_path_must_exist(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match=r"neither a catalogue model \(smollm2-135m, qwen2.5-coder-0.5b, "):
        EngineSettings(model=str(tmp_path / "nope"))
    with pytest.raises(ValidationError, match="no config.json"):
        EngineSettings(model=str(tmp_path))
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(ValidationError, match="is a file but not a .gguf file"):
        EngineSettings(model=str(tmp_path / "weights.bin"))


def test_model_takes_catalogue_names_the_builtin_alias_and_gguf_files(tmp_path: Path) -> None:
    for name in ("smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b", "gemma3-270m", "builtin"):
        assert EngineSettings(model=name).model == name
    (tmp_path / "model.Q4_K_M.gguf").write_bytes(b"GGUF")  # read at start-up, not at settings time
    assert EngineSettings(model=str(tmp_path / "model.Q4_K_M.gguf")).model == str(tmp_path / "model.Q4_K_M.gguf")
    (tmp_path / "config.json").write_text("{}")
    assert EngineSettings(model=str(tmp_path)).model == str(tmp_path)


def test_schedule_rules() -> None:
    with pytest.raises(ValidationError, match="ratio_schedule has 1 entries"):
        EngineSettings(blend={"check_layers": [1, 3], "ratio_schedule": [0.3]})
    with pytest.raises(ValidationError, match="must not increase"):
        EngineSettings(blend={"check_layers": [1, 3], "ratio_schedule": [0.1, 0.3]})
    with pytest.raises(ValueError, match="strictly increasing"):
        BlendConfig(check_layers=(3, 1))
    assert BlendConfig(check_layers=(1, 3), ratio_schedule=(0.3, 0.15)).ratios() == (0.3, 0.15)
    assert BlendConfig(check_layers=[1, 2]).check_layers == (1, 2)  # lists from settings become tuples


def test_sampling_and_layout_validation() -> None:
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0.0)
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingParams(max_tokens=0)
    assert SamplingParams(stop=("", "x")).stop == ("x",)
    with pytest.raises(ValueError, match="suffix_ids"):
        PromptLayout([1], [[2]], [])
    layout = PromptLayout([1, 2], [[3, 4], [5]], [6])
    assert layout.all_ids() == [1, 2, 3, 4, 5, 6] and layout.num_context_tokens == 3 and layout.num_tokens == 6


def test_blend_settings_nest_one_blend_config_declared_once() -> None:
    from engine.config import BLEND_FIELDS

    assert tuple(BlendConfig.model_fields) == BLEND_FIELDS
    assert not set(EngineSettings.model_fields) & set(BLEND_FIELDS)  # no second declaration of any knob
    # The defaults are BlendConfig's own: what a bare config in a test gets is what a user runs.
    assert EngineSettings().blend == BlendConfig() == EngineSettings().blend_config()
    assert (BlendConfig().match_window, BlendConfig().match_span, BlendConfig().match_extra) == (24, "sentence", 0.1)
    values = {
        "recompute_ratio": 0.3,
        "selector": "random",
        "score_layers": (2, 5),
        "score_fuse": "max",
        "score_by": "output",
        "pool_window": 3,
        "min_per_chunk": 2,
        "sink_tokens": 4,
        "match_window": 12,
        "match_span": "window",
        "match_extra": 0.2,
        "match_scope": "any",
        "match_labels": True,
        "stale_key_bias": 1.5,
        "stale_key_scope": "unnamed",
        "history_ratio": 0.5,
        "attention_share": 0.6,
        "ratio_min": 0.1,
        "ratio_max": 0.4,
        "check_layers": (1, 3),
        "ratio_schedule": (0.5, 0.3),
        "deviation_on": "k",
        "seed": 7,
    }
    assert set(values) == set(BLEND_FIELDS)
    # Every blend setting reaches the config unchanged (lists as tuples), nested or as an old flat key.
    listed = {k: list(v) if isinstance(v, tuple) else v for k, v in values.items()}
    nested = EngineSettings(blend=listed)
    flat = EngineSettings(**listed)
    assert nested.blend_config().model_dump() == flat.blend_config().model_dump() == values
    # A request's ratio replaces the schedule and the adaptive budget; its selector the configured one.
    fixed = nested.blend_config(recompute_ratio=0.1, selector="query")
    assert (fixed.recompute_ratio, fixed.ratio_schedule, fixed.attention_share, fixed.selector) == (
        0.1,
        None,
        None,
        "query",
    )


def test_old_flat_blend_keys_are_aliases_and_a_key_set_both_ways_is_refused() -> None:
    old = EngineSettings.model_validate({"recompute_ratio": 0.25, "selector": "first_k", "max_new_tokens": 9})
    assert (old.blend.recompute_ratio, old.blend.selector, old.max_new_tokens) == (0.25, "first_k", 9)
    assert old.blend.model_fields_set == {"recompute_ratio", "selector"}  # what the operator set, for app/calibration
    mixed = EngineSettings.model_validate({"recompute_ratio": 0.25, "blend": {"match_window": 0}})
    assert (mixed.blend.recompute_ratio, mixed.blend.match_window) == (0.25, 0)
    with pytest.raises(ValidationError, match="engine.recompute_ratio and engine.blend.recompute_ratio are both set"):
        EngineSettings.model_validate({"recompute_ratio": 0.25, "blend": {"recompute_ratio": 0.3}})
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        EngineSettings.model_validate({"blend": {"recompute": 0.3}})
