"""`bench calibrate --candidates`: the study file is checked before any model loads."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.calibrate import read_candidates


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
