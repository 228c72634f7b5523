"""Two processes that need the same model at once convert it once: the real SmolLM2 conversion, run by two
`blendrag models install` processes on two data dirs sharing one model cache."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.models.catalog import SMOLLM2_135M

WAIT_S = 600


@pytest.mark.slow
def test_two_processes_on_two_data_dirs_convert_the_model_once(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    env = os.environ | {"BLENDRAG_MODELS_DIR": str(cache)}

    def install(data: str) -> subprocess.Popen[str]:
        argv = [
            sys.executable,
            "-m",
            "app.cli",
            "models",
            "install",
            "smollm2-135m",
            "--data-dir",
            str(tmp_path / data),
        ]
        return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    first = install("a")
    # Start the second once the first is converting (its staging directory exists): it must wait on the lock.
    deadline = time.monotonic() + WAIT_S
    while not any(cache.glob(f".{SMOLLM2_135M.converted_dir}-*")):
        assert first.poll() is None, first.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    second = install("b")
    outs = [p.communicate(timeout=WAIT_S) for p in (first, second)]
    assert [p.returncode for p in (first, second)] == [0, 0], outs
    target = cache / SMOLLM2_135M.converted_dir
    for out, _ in outs:
        assert out.splitlines()[-1] == f"smollm2-135m: converted, in {target}"
    assert f"model {SMOLLM2_135M.converted_dir} is being converted by another process into {cache}" in outs[1][1]
    assert sorted(p.name for p in cache.iterdir()) == [".locks", SMOLLM2_135M.converted_dir]  # one copy
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
