"""`--candidates` (bench calibrate, frontier, lookup): the study file is checked before any model loads, and
each candidate is the settings in force with its values set."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.candidates import apply_candidate, candidate_name, describe, read_candidates
from engine.types import BlendConfig


def test_reads_a_list_of_blend_settings(tmp_path: Path) -> None:
    path = tmp_path / "study.json"
    path.write_text('[{"selector": "random", "recompute_ratio": 0.2}, {"sink_tokens": 4}]')
    assert read_candidates(path) == [{"selector": "random", "recompute_ratio": 0.2}, {"sink_tokens": 4}]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[]", "expected a non-empty JSON list of objects"),
        ('{"selector": "query"}', "expected a non-empty JSON list of objects"),
        ('[{"recompute_ratio": 0.2, "max_new_tokens": 9}]', "not blend settings: max_new_tokens"),
        ("[{", "--candidates"),
        ('[{"recompute_ratio": 1.5}]', "recompute_ratio"),
    ],
)
def test_bad_study_files_stop_with_a_message(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "study.json"
    path.write_text(text)
    with pytest.raises(SystemExit, match=message):
        read_candidates(path)


def test_the_same_settings_twice_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "study.json"
    path.write_text('[{"sink_tokens": 4, "recompute_ratio": 0.2}, {"recompute_ratio": 0.2, "sink_tokens": 4}]')
    with pytest.raises(SystemExit, match="the same settings stand twice"):
        read_candidates(path)


def test_a_candidate_is_the_settings_in_force_with_its_values_set() -> None:
    base = BlendConfig(recompute_ratio=0.25, score_layers=(6, 12, 18), history_ratio=1.0)
    values = {"sink_tokens": 4, "score_layers": [10]}
    config = apply_candidate(base, values)
    assert config == BlendConfig(recompute_ratio=0.25, score_layers=(10,), history_ratio=1.0, sink_tokens=4)
    assert candidate_name(values, config) == "query@0.25 score_layers=10 sink_tokens=4"
    assert candidate_name({"recompute_ratio": 0.15}, apply_candidate(base, {"recompute_ratio": 0.15})) == "query@0.15"
    assert describe(config)["score_layers"] == [10] and describe(config)["sink_tokens"] == 4
    with pytest.raises(ValueError, match="pool_window"):
        apply_candidate(base, {"pool_window": 2})
