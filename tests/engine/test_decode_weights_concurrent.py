"""Two processes that build decode's compact weights into one model cache at once quantize once: the second
waits on the cache's file lock and reads the file the first stored (issue 62, item 5)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # two processes that each load a model

WAIT_S = 120.0
# A process that builds int8 decode weights into CACHE; its quantization is logged to LOG and holds until GO
# exists, so the test can start the second process while the first one quantizes.
BUILD = """
import logging, sys, time
from pathlib import Path

import engine.decode_weights as dw
from engine.model import load_model

model_dir, cache, log, go = sys.argv[1:5]
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
quantize_all = dw._quantize_all

def quantize_when_told(weights, fmt):
    with open(log, "a") as fh:
        fh.write("quantized\\n")
    while not Path(go).exists():
        time.sleep(0.02)
    return quantize_all(weights, fmt)

dw._quantize_all = quantize_when_told
built = dw.build_decode_weights(load_model(Path(model_dir)), "int8", Path(cache))
print(f"from_cache={built.from_cache}")
"""


def _start(tiny_model_dir: Path, tmp_path: Path, name: str) -> subprocess.Popen[str]:
    args = [str(tiny_model_dir), str(tmp_path / "cache"), str(tmp_path / "log"), str(tmp_path / "go")]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with open(tmp_path / f"{name}.err", "w") as err:
        return subprocess.Popen(
            [sys.executable, "-c", BUILD, *args], stdout=subprocess.PIPE, stderr=err, env=env, text=True
        )


def _wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.05)


def test_two_processes_quantize_once(tiny_model_dir: Path, tmp_path: Path) -> None:
    log = tmp_path / "log"
    first = _start(tiny_model_dir, tmp_path, "first")
    _wait_for(lambda: log.is_file() and log.read_text() == "quantized\n", "the first process quantizes")
    second = _start(tiny_model_dir, tmp_path, "second")
    _wait_for(lambda: "waiting for it" in (tmp_path / "second.err").read_text(), "the second process waits")
    (tmp_path / "go").touch()
    outs = [p.communicate(timeout=WAIT_S)[0] for p in (first, second)]
    assert [p.returncode for p in (first, second)] == [0, 0]
    assert log.read_text() == "quantized\n"  # once, by the first
    assert outs == ["from_cache=False\n", "from_cache=True\n"]
    cache = tmp_path / "cache"
    [stored] = cache.glob("*-int8-v2.safetensors")
    waited = (tmp_path / "second.err").read_text()
    assert f"decode weights {stored.name} are being quantized by another process into {cache}; waiting for it" in waited
