"""EngineSettings / BlendConfig / SamplingParams reject bad values with clear messages."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from engine.config import EngineSettings
from engine.types import BlendConfig, PromptLayout, SamplingParams


def test_defaults() -> None:
    s = EngineSettings()
    assert s.model == "qwen2.5-coder-0.5b" and s.mode == "blend" and s.recompute_ratio == 0.15 and s.check_layers == [1]
    cfg = s.blend_config()
    assert cfg.ratios() == (0.15,) and cfg.selector == "query" and cfg.score_layers == (12,) and cfg.deviation_on == "v"
    assert s.sampling_params(max_tokens=5).max_tokens == 5
    assert s.sampling_params().max_tokens == s.max_new_tokens


@pytest.mark.parametrize("ratio", [-0.1, 1.5])
def test_ratio_out_of_range(ratio: float) -> None:
    with pytest.raises(ValidationError, match=r"recompute_ratio must be within \[0, 1\]"):
        EngineSettings(recompute_ratio=ratio)


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
    for name in ("smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b", "builtin"):
        assert EngineSettings(model=name).model == name
    (tmp_path / "model.Q4_K_M.gguf").write_bytes(b"GGUF")  # read at start-up, not at settings time
    assert EngineSettings(model=str(tmp_path / "model.Q4_K_M.gguf")).model == str(tmp_path / "model.Q4_K_M.gguf")
    (tmp_path / "config.json").write_text("{}")
    assert EngineSettings(model=str(tmp_path)).model == str(tmp_path)


def test_schedule_rules() -> None:
    with pytest.raises(ValidationError, match="ratio_schedule has 1 entries"):
        EngineSettings(check_layers=[1, 3], ratio_schedule=[0.3])
    with pytest.raises(ValidationError, match="must not increase"):
        EngineSettings(check_layers=[1, 3], ratio_schedule=[0.1, 0.3])
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


# Every EngineSettings field that is not one of BlendConfig's: a new setting lands in exactly one group.
NOT_BLEND_SETTINGS = {
    "model",
    "device",
    "dtype",
    "num_threads",
    "pack_weights",
    "decode_weights",
    "system_prompt",
    "question_template",
    "mode",
    "max_queue",
    "max_running",
    "working_cache_pool_bytes",
    "decode_graphs",
    "max_new_tokens",
    "history_max_tokens",
    "temperature",
    "top_p",
    "repetition_penalty",
    "no_repeat_ngram_size",
    "stop_on_repeated_line",
}


def test_blend_settings_map_one_to_one_onto_blend_config() -> None:
    from dataclasses import asdict, fields

    from engine.config import BLEND_FIELDS

    assert tuple(f.name for f in fields(BlendConfig)) == BLEND_FIELDS
    assert set(EngineSettings.model_fields) - NOT_BLEND_SETTINGS == set(BLEND_FIELDS)
    assert not NOT_BLEND_SETTINGS & set(BLEND_FIELDS)
    # Every blend setting reaches the config unchanged (lists as tuples), and the defaults agree.
    s = EngineSettings(
        recompute_ratio=0.3,
        selector="random",
        score_layers=[2, 5],
        score_fuse="max",
        score_by="output",
        pool_window=3,
        min_per_chunk=2,
        sink_tokens=4,
        match_window=12,
        match_span="window",
        match_extra=0.2,
        match_scope="any",
        stale_key_bias=1.5,
        stale_key_scope="unnamed",
        history_ratio=0.5,
        attention_share=0.6,
        ratio_min=0.1,
        ratio_max=0.4,
        check_layers=[1, 3],
        ratio_schedule=[0.5, 0.3],
        deviation_on="k",
        seed=7,
    )
    assert asdict(s.blend_config()) == {
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
    # The defaults agree but for the look-up spans, which the server turns on and a bare BlendConfig leaves off
    # (the engine's own tests read the selectors without them).
    spans = {"match_window": 24, "match_span": "sentence", "match_extra": 0.1, "match_scope": "one"}
    assert EngineSettings().blend_config() == BlendConfig(**spans)
    assert (BlendConfig().match_window, BlendConfig().match_extra) == (0, 0.0)
    # A request's ratio replaces the schedule and the adaptive budget; its selector the configured one.
    fixed = s.blend_config(recompute_ratio=0.1, selector="query")
    assert (fixed.recompute_ratio, fixed.ratio_schedule, fixed.attention_share, fixed.selector) == (
        0.1,
        None,
        None,
        "query",
    )
