"""`blendrag calibrate`: bad options are a usage error before any model is loaded."""

from __future__ import annotations

import pytest

from app.cli import main


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--ratios", "0,0.2"], "ratios must be a comma-separated list within (0, 1]"),
        (["--cases", "1,2"], "--cases takes three counts"),
        (["--cases", "0,0,0"], "--cases takes three counts"),
    ],
)
def test_bad_options_exit_2_with_a_message(argv, message, tmp_path, capsys) -> None:
    assert main(["calibrate", "--data-dir", str(tmp_path), *argv]) == 2
    assert message in capsys.readouterr().err
